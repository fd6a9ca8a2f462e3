"""LLaDA's own sampler (``generate`` in ML-GSAI/LLaDA ``generate.py``), on the workbench's model interface.

The canvas is the prompt followed by ``gen_len`` masks, cut into semi-autoregressive blocks of ``block_length``;
each block gets ``steps / (gen_len / block_length)`` forwards. Per block and row, the ``n`` masks of the block are
spread evenly over its steps (``n // s`` per step, the first ``n % s`` steps one more: ``get_num_transfer_tokens``).
Each step is one forward of the whole canvas (every future mask visible: ``future_masks``). Then, as ``generate``:

* ``cfg_scale > 0`` (unsupervised classifier-free guidance): the same forward also runs the canvas with every
  prompt position masked, and the logits are ``un + (cfg_scale + 1)·(cond − un)``;
* the prediction is the argmax of the logits, at ``temperature > 0`` of ``exp(logits) / (−log u)^T`` in float64
  (``add_gumbel_noise``: Gumbel-max sampling, ``u`` uniform);
* its confidence is the softmax probability of the prediction (``remasking='low_confidence'``) or a uniform draw
  (``remasking='random'``);
* the ``k`` most confident masked positions of the current block take their prediction (``torch.topk``).

There is no EOS rule: every step runs, and the end-of-text token is an ordinary token.

**Random numbers.** ``generate`` draws from the global generator, per step: the Gumbel uniforms
``rand_like(logits)`` ``(N, P + gen_len, V)`` float64 (temperature > 0), then ``rand (N, P + gen_len)`` float32
(``remasking='random'``). :func:`llada_decode` makes the same draws, of the same shapes and in the same order, from
one ``torch.Generator`` on the model's device seeded with ``seed`` (the global generator is not touched), and reads
the current block's columns, so ``torch.manual_seed(seed); generate(...)`` gives the same tokens when the prompts
fill the same canvas (equal widths after left padding). The full-canvas draw costs what ``generate`` spends:
``8·(P + gen_len)·V`` bytes per row and step at temperature > 0.

Equal to the reference token for token on ``tests/data/dllm_golden/llada`` (``tests/test_dllm_golden.py``), CFG,
sampling and random remasking included.
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths, left_pad
from .stopping import cut_at_eos

#: ``generate``'s remasking strategies.
REMASKING = ("low_confidence", "random")


def transfer_schedule(masks: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to unmask at each of ``steps`` steps for ``masks`` ``(N,)`` masked positions per row: ``masks // steps``
    each, the first ``masks % steps`` steps one more (LLaDA ``get_num_transfer_tokens``). Returns ``(N, steps)``."""
    base = (masks // steps)[:, None].expand(-1, steps).clone()
    extra = torch.arange(steps, device=masks.device)[None, :] < (masks % steps)[:, None]
    return base + extra.long()


def gumbel_argmax(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor | None) -> torch.Tensor:
    """LLaDA ``add_gumbel_noise`` then ``argmax``: ``argmax(exp(logits) / (−log u)^T)`` in float64, with ``uniforms``
    ``u`` of the shape of ``logits`` ``(..., V)``; at ``temperature`` 0 the plain argmax. Returns ``(...)`` long."""
    if temperature == 0:
        return logits.argmax(-1)
    return (logits.double().exp() / (-torch.log(uniforms)) ** temperature).argmax(-1)


@torch.no_grad()
def llada_decode(model, prompts: list[list[int]], gen_len: int, block_length: int = 32, steps: int | None = None,
                 temperature: float = 0.0, cfg_scale: float = 0.0, remasking: str = "low_confidence", seed: int = 0,
                 pad_id: int = 0, precision: str = "fp32", real_continuation: list[list[int]] | None = None,
                 eos_id: int | None = None) -> DecodeResult:
    """LLaDA's ``generate`` (the module docstring gives the algorithm and the random draws).

    Args:
        model: a model whose ``diffusion_logits`` takes ``future_masks`` (LLaDA's adapter runs the whole canvas).
        prompts: N prompts (token ids), left-padded into one batch.
        gen_len: tokens to generate; a multiple of ``block_length``.
        block_length: semi-autoregressive block length.
        steps: forwards in all (default ``gen_len``: one token per forward); a multiple of the number of blocks.
        temperature: Gumbel-max sampling temperature (0: argmax).
        cfg_scale: classifier-free guidance scale (0: off); each forward then runs 2N rows.
        remasking: ``'low_confidence'`` or ``'random'``.
        seed: seed of the random draws (temperature > 0 or random remasking).
        pad_id, precision: left-padding id; 'fp32' or 'bf16'.
        real_continuation: must be None (``generate`` has no real-context mode).
        eos_id: cut each row after its first ``eos_id``; as ``generate`` has no EOS rule, every step still runs
            and is counted.

    Returns a :class:`~workbench.decoding.base.DecodeResult` (``forwards``: the steps; ``extra_forwards``: 0).
    Raises :class:`~workbench.decoding.base.DecodeError` for lengths that do not divide, a negative temperature or
    guidance scale, an unknown remasking strategy or a real continuation. ``generate``'s ``logits_eos_inf`` and
    ``confidence_eos_eot_inf`` (which hard-code the release's token ids) are not offered.
    """
    check_lengths(model, prompts, gen_len, block_length)
    steps = gen_len if steps is None else int(steps)
    n_blocks = gen_len // block_length
    if steps <= 0 or steps % n_blocks:
        raise DecodeError(f"steps ({steps}) must be a positive multiple of the number of blocks ({n_blocks})")
    if not temperature >= 0:
        raise DecodeError(f"temperature must be ≥ 0 (0 = argmax), got {temperature}")
    if not cfg_scale >= 0:
        raise DecodeError(f"cfg_scale must be ≥ 0 (0 = no classifier-free guidance), got {cfg_scale}")
    if remasking not in REMASKING:
        raise DecodeError(f"unknown remasking {remasking!r}; valid: {', '.join(REMASKING)}")
    if real_continuation is not None:
        raise DecodeError("the llada decoder has no real-context mode (LLaDA's generate follows its own output)")
    per_block = steps // n_blocks
    dev, m = model.device, model.mask_token_id
    ids, valid = left_pad(prompts, pad_id, dev)
    n, p = ids.shape
    cfg = cfg_scale > 0
    gen = torch.Generator(device=dev).manual_seed(int(seed)) if temperature > 0 or remasking == "random" else None
    out = torch.full((n, gen_len), m, dtype=torch.long, device=dev)
    per_step: list[list[int]] = [[] for _ in range(n)]
    step_tok: list[list[list[int]]] = [[] for _ in range(n)]
    rows = 2 * n if cfg else n
    ones = torch.ones((rows, block_length), dtype=torch.bool, device=dev)
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        cache = model.new_cache()
        if cfg:                                        # generate's un_x: every prompt position masked
            model.extend(torch.cat([ids, torch.full_like(ids, m)]), cache, torch.cat([valid, valid]), logits_to_keep=1)
            kv = torch.cat([valid, valid])
        else:
            model.extend(ids, cache, valid, logits_to_keep=1)
            kv = valid
        for start in range(0, gen_len, block_length):
            block = out[:, start:start + block_length].clone()
            kv = torch.cat([kv, ones], 1)
            schedule = transfer_schedule((block == m).sum(1), per_block)
            future = gen_len - start - block_length
            cols = slice(p + start, p + start + block_length)           # the block's columns of the whole canvas
            for i in range(per_block):
                masked = block == m
                both = torch.cat([block, block]) if cfg else block
                logits = model.diffusion_logits(both, cache, kv, future_masks=future).float()
                if cfg:
                    cond, un = logits.chunk(2)
                    logits = un + (cfg_scale + 1) * (cond - un)
                noise = None
                if temperature > 0:
                    noise = torch.rand((n, p + gen_len, logits.shape[-1]), generator=gen, device=dev,
                                       dtype=torch.float64)[:, cols]
                x0 = gumbel_argmax(logits, temperature, noise)
                if remasking == "low_confidence":
                    conf = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
                else:
                    conf = torch.rand((n, p + gen_len), generator=gen, device=dev)[:, cols]
                conf = torch.where(masked, conf, torch.full_like(conf, float("-inf")))
                commit = torch.zeros_like(masked)
                for r in range(n):
                    k = int(schedule[r, i])
                    if k:
                        commit[r, torch.topk(conf[r], k).indices] = True
                block = torch.where(commit, x0, block)
                for r in range(n):
                    per_step[r].append(int(commit[r].sum()))
                    step_tok[r].append(x0[r][commit[r]].tolist())
            out[:, start:start + block_length] = block
            model.extend(torch.cat([block, block]) if cfg else block, cache, kv, logits_to_keep=1)
    res = DecodeResult(tokens=out.tolist(), forwards=[steps] * n, extra_forwards=[0] * n,
                       committed_per_step=per_step, step_tokens=step_tok, wall_time=time.perf_counter() - t0,
                       model_calls=steps)
    return cut_at_eos(res, eos_id)
