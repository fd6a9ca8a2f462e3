"""Dream's own sampler (``diffusion_generate`` → ``_sample`` in Dream's ``generation_utils.py``), on the workbench's
model interface, for every ordering ``alg`` (``maskgit_plus``, ``topk_margin``, ``entropy``, ``origin``), with
sampling (``temperature``, ``top_p``, ``top_k``) and ``alg_temp``.

The canvas is the prompt followed by ``gen_len`` masks (one block: Dream is not semi-autoregressive). Timesteps
``t = linspace(1, eps, steps + 1)`` (float32). At step ``i`` one forward of the whole canvas gives (shifted,
realigned by the adapter) logits; on the masked positions ``sample_tokens`` divides them by the temperature, applies
the ``top_p`` / ``top_k`` filters and takes the softmax ``probs``; the prediction is a draw from ``probs``
(``temperature > 0``) or its argmax, and its confidence the prediction's probability (``maskgit_plus``), the
top-1 − top-2 margin of ``probs`` (``topk_margin``) or the negative entropy ``Σ p log(p + 1e-10)`` (``entropy``).

* ``origin``: each masked position is unmasked with probability ``1 − s / t`` (every one at the last step), with
  its prediction;
* the others: the number to unmask is ``int(mean masks per row × (1 − s / t))`` (a batch average, as the reference
  computes it), all remaining masks at the last step; each row's most confident masked positions (``torch.topk``)
  take their prediction, or, with ``alg_temp > 0``, positions drawn without replacement from
  ``softmax(confidence / alg_temp)``.

No EOS rule: every step runs.

**Random numbers.** ``_sample`` draws from the global generator: ``torch.rand`` over the masked positions
(``origin``), ``Categorical(probs).sample()`` (temperature > 0; a ``multinomial`` with replacement over the
normalised ``probs``, falling back to the argmax when ``Categorical`` rejects them) and ``multinomial`` over the
canvas row (``alg_temp > 0``). :func:`dream_decode` makes the same draws, of the same shapes and in the same order,
from one ``torch.Generator`` on the model's device seeded with ``seed``, so ``torch.manual_seed(seed);
diffusion_generate(...)`` gives the same tokens when the prompts fill the same canvas.

Equal to the reference token for token on ``tests/data/dllm_golden/dream`` (``tests/test_dllm_golden.py``), the
seeded ``origin`` and sampling cases included.
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths, left_pad
from .stopping import cut_at_eos

#: Dream's orderings (``alg``), each a registered decoder ``dream_<alg>``.
ALGORITHMS = ("maskgit_plus", "topk_margin", "entropy", "origin")


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of top tokens whose probability reaches ``top_p`` (the first always kept); the rest get
    ``finfo.min`` (Dream ``top_p_logits``). ``logits``: ``(M, V)``."""
    sorted_logits, idx = torch.sort(logits, descending=True)
    drop = torch.cumsum(torch.softmax(sorted_logits, -1), -1) > top_p
    drop[..., 1:] = drop[..., :-1].clone()
    drop[..., 0] = False
    mask = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, idx, drop)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Tokens below the ``top_k``-th logit get ``finfo.min`` (Dream ``top_k_logits``). ``logits``: ``(M, V)``."""
    k = min(int(top_k), logits.shape[-1])
    return logits.masked_fill(logits < torch.topk(logits, k)[0][..., -1, None], torch.finfo(logits.dtype).min)


def confidence(probs: torch.Tensor, alg: str) -> torch.Tensor:
    """Confidence ``(M,)`` of the argmax of ``probs`` ``(M, V)`` under Dream's ordering ``alg``."""
    if alg == "maskgit_plus":
        return probs.max(-1).values
    if alg == "topk_margin":
        top2 = torch.sort(probs, -1, descending=True).values[:, :2]
        return top2[:, 0] - top2[:, 1]
    return (probs * torch.log(probs + 1e-10)).sum(-1)


def categorical_sample(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor | None:
    """``torch.distributions.Categorical(probs=probs).sample()`` drawn from ``generator``: one ``multinomial`` with
    replacement over the normalised rows of ``probs`` ``(M, V)``. Returns ``(M,)`` long, or None where
    ``Categorical`` would refuse ``probs`` (not a simplex within its 1e-6 tolerance), which Dream catches."""
    norm = probs / probs.sum(-1, keepdim=True)
    if not bool(torch.distributions.constraints.simplex.check(norm).all()):
        return None
    return torch.multinomial(norm, 1, True, generator=generator)[:, 0]


def sample_tokens(logits: torch.Tensor, alg: str, temperature: float = 0.0, top_p: float | None = None,
                  top_k: int | None = None, generator: torch.Generator | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Dream ``sample_tokens`` on the masked positions' logits ``(M, V)``: ``/ temperature``, the ``top_p`` then
    ``top_k`` filters, softmax; a draw (:func:`categorical_sample`) at ``temperature > 0``, else the argmax; the
    confidence of ``alg`` (``topk_margin`` and ``entropy`` from the whole filtered distribution, the others the
    prediction's probability). Returns ``(confidence (M,), tokens (M,))``."""
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_filter(logits, top_p)
    if top_k:
        logits = top_k_filter(logits, top_k)
    probs = torch.softmax(logits, -1)
    drawn = categorical_sample(probs, generator) if temperature > 0 and probs.shape[0] else None
    if drawn is not None:
        conf, x0 = probs.gather(-1, drawn[:, None])[:, 0], drawn
    else:
        conf, x0 = probs.max(-1)
    if alg in ("topk_margin", "entropy"):
        conf = confidence(probs, alg)
    return conf, x0


@torch.no_grad()
def dream_decode(model, prompts: list[list[int]], gen_len: int, alg: str = "maskgit_plus", steps: int | None = None,
                 eps: float = 1e-3, top_p: float | None = None, top_k: int | None = None, temperature: float = 0.0,
                 alg_temp: float | None = None, seed: int = 0, pad_id: int = 0, precision: str = "fp32",
                 block_length: int | None = None, real_continuation: list[list[int]] | None = None,
                 eos_id: int | None = None) -> DecodeResult:
    """Dream's ``diffusion_generate`` (the module docstring gives the algorithm and the random draws).

    Args:
        model: a model whose ``diffusion_logits`` realigns shifted logits (Dream's adapter).
        prompts: N prompts (token ids), left-padded into one batch.
        gen_len: new tokens (``max_new_tokens``).
        alg: one of :data:`ALGORITHMS`.
        steps: forwards (default ``gen_len``).
        eps: the last timestep (Dream's default 1e-3).
        top_p, top_k: Dream's logit filters (None, or ``top_p`` 1 / ``top_k`` 0: off).
        temperature: sampling temperature (0: argmax).
        alg_temp: > 0 draws the positions to unmask from ``softmax(confidence / alg_temp)`` (None or 0: top-k).
        seed: seed of the random draws (``origin``, temperature > 0, ``alg_temp > 0``).
        pad_id, precision: left-padding id; 'fp32' or 'bf16'.
        block_length, real_continuation: must be None (Dream's canvas is one block; no real-context mode).
        eos_id: cut each row after its first ``eos_id``; as ``diffusion_generate`` has no EOS rule, every step
            still runs and is counted.

    Returns a :class:`~workbench.decoding.base.DecodeResult`. Raises
    :class:`~workbench.decoding.base.DecodeError` for an unknown ``alg``, ``steps`` < 1, a negative temperature or
    ``alg_temp``, a block length or a real continuation.
    """
    check_lengths(model, prompts, gen_len)
    if alg not in ALGORITHMS:
        raise DecodeError(f"unknown Dream ordering {alg!r}; valid: {', '.join(ALGORITHMS)}")
    steps = gen_len if steps is None else int(steps)
    if steps < 1:
        raise DecodeError(f"steps must be ≥ 1, got {steps}")
    if not temperature >= 0:
        raise DecodeError(f"temperature must be ≥ 0 (0 = argmax), got {temperature}")
    if alg_temp is not None and not alg_temp >= 0:
        raise DecodeError(f"alg_temp must be ≥ 0 (0 = the most confident positions), got {alg_temp}")
    if block_length is not None:
        raise DecodeError(f"Dream's diffusion_generate decodes the whole canvas as one block; drop --block_length "
                          f"(got {block_length})")
    if real_continuation is not None:
        raise DecodeError("the dream decoders have no real-context mode (Dream's generate follows its own output)")
    dev, m = model.device, model.mask_token_id
    ids, valid = left_pad(prompts, pad_id, dev)
    n, p = ids.shape
    sampled_order = bool(alg_temp) and alg != "origin"
    gen = (torch.Generator(device=dev).manual_seed(int(seed))
           if alg == "origin" or temperature > 0 or sampled_order else None)
    block = torch.full((n, gen_len), m, dtype=torch.long, device=dev)
    kv = torch.cat([valid, torch.ones((n, gen_len), dtype=torch.bool, device=dev)], 1)
    ts = torch.linspace(1, eps, steps + 1, device=dev)
    per_step: list[list[int]] = [[] for _ in range(n)]
    step_tok: list[list[list[int]]] = [[] for _ in range(n)]
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        cache = model.new_cache()
        model.extend(ids, cache, valid, logits_to_keep=1)
        for i in range(steps):
            masked = block == m
            logits = model.diffusion_logits(block, cache, kv).float()
            sel = logits[masked]
            if alg == "origin":
                p_transfer = 1 - ts[i + 1] / ts[i] if i < steps - 1 else 1
                x0 = torch.full((sel.shape[0],), m, dtype=torch.long, device=dev)
                move = torch.rand(sel.shape[0], generator=gen, device=dev) < p_transfer
                if move.any():
                    x0[move] = sample_tokens(sel[move], alg, temperature, top_p, top_k, gen)[1]
                pred = torch.full_like(block, m)
                pred[masked] = x0
                commit = masked & (pred != m)
            else:
                conf_m, x0 = sample_tokens(sel, alg, temperature, top_p, top_k, gen)
                pred = torch.full_like(block, m)
                pred[masked] = x0
                mean_masks = masked.sum() / n
                k = int(mean_masks * (1 - ts[i + 1] / ts[i])) if i < steps - 1 else int(mean_masks)
                commit = torch.zeros_like(masked)
                if k > 0:
                    conf = torch.full((n, p + gen_len), float("-inf"), device=dev)     # the whole canvas row
                    conf[:, p:][masked] = conf_m
                    if sampled_order:
                        idx = torch.multinomial(torch.softmax(conf / alg_temp, -1), k, generator=gen) - p
                    else:
                        idx = torch.topk(conf[:, p:], min(k, gen_len), dim=1).indices
                    commit.scatter_(1, idx, True)          # a draw never lands on a prompt column (probability 0)
            block = torch.where(commit, pred, block)
            for r in range(n):
                per_step[r].append(int((commit[r] & masked[r]).sum()))
                step_tok[r].append(pred[r][commit[r] & masked[r]].tolist())
    res = DecodeResult(tokens=block.tolist(), forwards=[steps] * n, extra_forwards=[0] * n,
                       committed_per_step=per_step, step_tokens=step_tok, wall_time=time.perf_counter() - t0,
                       model_calls=steps)
    return cut_at_eos(res, eos_id)
