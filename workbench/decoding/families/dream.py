"""Dream's own sampler (``diffusion_generate`` → ``_sample`` in Dream's ``generation_utils.py``), on the workbench's
model interface, for the orderings ``maskgit_plus``, ``topk_margin`` and ``entropy`` at temperature 0.

The canvas is the prompt followed by ``gen_len`` masks (one block: Dream is not semi-autoregressive). Timesteps
``t = linspace(1, eps, steps + 1)`` (float32). At step ``i`` one forward of the whole canvas gives (shifted,
realigned by the adapter) logits; on the masked positions, after the optional ``top_p`` / ``top_k`` filters, the
prediction is the argmax and its confidence is the top probability (``maskgit_plus``), the top-1 − top-2 margin
(``topk_margin``) or the negative entropy ``Σ p log(p + 1e-10)`` (``entropy``). The number to unmask is
``int(mean masks per row × (1 − s / t))`` (a batch average, as the reference computes it), all remaining masks at
the last step; each row's most confident masked positions (``torch.topk``) take their prediction. No EOS rule.

Equal to the reference token for token on ``tests/data/dllm_golden/dream`` (``tests/test_dllm_golden.py``).
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths, left_pad

#: Dream's confidence orderings reproduced here.
ALGORITHMS = ("maskgit_plus", "topk_margin", "entropy")


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


@torch.no_grad()
def dream_decode(model, prompts: list[list[int]], gen_len: int, alg: str = "maskgit_plus", steps: int | None = None,
                 eps: float = 1e-3, top_p: float | None = None, top_k: int | None = None, temperature: float = 0.0,
                 pad_id: int = 0, precision: str = "fp32", **_) -> DecodeResult:
    """Dream's ``diffusion_generate`` at temperature 0 (the module docstring gives the algorithm).

    Args:
        model: a model whose ``diffusion_logits`` realigns shifted logits (Dream's adapter).
        prompts: N prompts (token ids), left-padded into one batch.
        gen_len: new tokens (``max_new_tokens``).
        alg: one of :data:`ALGORITHMS`.
        steps: forwards (default ``gen_len``).
        eps: the last timestep (Dream's default 1e-3).
        top_p, top_k: Dream's logit filters (None: off).
        temperature: must be 0.
        pad_id, precision: left-padding id; 'fp32' or 'bf16'.

    Returns a :class:`~workbench.decoding.base.DecodeResult`. Raises
    :class:`~workbench.decoding.base.DecodeError` for an unknown ``alg``, ``steps`` < 1 or a temperature > 0.
    """
    check_lengths(model, prompts, gen_len)
    if alg not in ALGORITHMS:
        raise DecodeError(f"unknown Dream ordering {alg!r}; valid: {', '.join(ALGORITHMS)}")
    steps = gen_len if steps is None else int(steps)
    if steps < 1:
        raise DecodeError(f"steps must be ≥ 1, got {steps}")
    if temperature != 0:
        raise DecodeError("the dream decoders reproduce Dream's generate at temperature 0 only; use --temperature 0")
    dev, m = model.device, model.mask_token_id
    ids, valid = left_pad(prompts, pad_id, dev)
    n = ids.shape[0]
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
            if top_p is not None and top_p < 1:
                sel = top_p_filter(sel, top_p)
            if top_k is not None:
                sel = top_k_filter(sel, top_k)
            probs = torch.softmax(sel, -1)
            x0 = probs.argmax(-1)
            conf = torch.full(block.shape, float("-inf"), device=dev)
            conf[masked] = confidence(probs, alg)
            pred = torch.full_like(block, m)
            pred[masked] = x0
            mean_masks = masked.sum() / n
            k = int(mean_masks * (1 - ts[i + 1] / ts[i])) if i < steps - 1 else int(mean_masks)
            commit = torch.zeros_like(masked)
            if k > 0:
                commit.scatter_(1, torch.topk(conf, min(k, gen_len), dim=1).indices, True)
            block = torch.where(commit, pred, block)
            for r in range(n):
                per_step[r].append(int((commit[r] & masked[r]).sum()))
                step_tok[r].append(pred[r][commit[r] & masked[r]].tolist())
    return DecodeResult(tokens=block.tolist(), forwards=[steps] * n, extra_forwards=[0] * n,
                        committed_per_step=per_step, step_tokens=step_tok, wall_time=time.perf_counter() - t0,
                        model_calls=steps)
