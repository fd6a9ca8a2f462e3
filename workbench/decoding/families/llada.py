"""LLaDA's own sampler (``generate`` in ML-GSAI/LLaDA ``generate.py``), on the workbench's model interface.

The canvas is the prompt followed by ``gen_len`` masks, cut into semi-autoregressive blocks of ``block_length``;
each block gets ``steps / (gen_len / block_length)`` forwards. Per block and row, the ``n`` masks of the block are
spread evenly over its steps (``n // s`` per step, the first ``n % s`` steps one more: ``get_num_transfer_tokens``).
Each step is one forward of the whole canvas (every future mask visible: ``future_masks``); the prediction is the
argmax of the logits, its confidence the softmax probability of that argmax (``remasking='low_confidence'``), and
the ``k`` most confident masked positions of the current block take their prediction (``torch.topk``). There is no
EOS rule: the end-of-text token is an ordinary token. Temperature 0 only (the reference's Gumbel noise over the
whole canvas at T > 0 draws random numbers the workbench's per-block forward cannot reproduce).

Equal to the reference token for token on ``tests/data/dllm_golden/llada`` (``tests/test_dllm_golden.py``).
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths, left_pad


def transfer_schedule(masks: torch.Tensor, steps: int) -> torch.Tensor:
    """Tokens to unmask at each of ``steps`` steps for ``masks`` ``(N,)`` masked positions per row: ``masks // steps``
    each, the first ``masks % steps`` steps one more (LLaDA ``get_num_transfer_tokens``). Returns ``(N, steps)``."""
    base = (masks // steps)[:, None].expand(-1, steps).clone()
    extra = torch.arange(steps, device=masks.device)[None, :] < (masks % steps)[:, None]
    return base + extra.long()


@torch.no_grad()
def llada_decode(model, prompts: list[list[int]], gen_len: int, block_length: int = 32, steps: int | None = None,
                 temperature: float = 0.0, pad_id: int = 0, precision: str = "fp32", **_) -> DecodeResult:
    """LLaDA's ``generate`` with ``remasking='low_confidence'`` at temperature 0 (the module docstring gives the
    algorithm).

    Args:
        model: a model whose ``diffusion_logits`` takes ``future_masks`` (LLaDA's adapter runs the whole canvas).
        prompts: N prompts (token ids), left-padded into one batch.
        gen_len: tokens to generate; a multiple of ``block_length``.
        block_length: semi-autoregressive block length.
        steps: forwards in all (default ``gen_len``: one token per forward); a multiple of the number of blocks.
        temperature: must be 0.
        pad_id, precision: left-padding id; 'fp32' or 'bf16'.

    Returns a :class:`~workbench.decoding.base.DecodeResult` (``forwards``: the steps; ``extra_forwards``: 0).
    Raises :class:`~workbench.decoding.base.DecodeError` for lengths that do not divide or a temperature > 0.
    """
    check_lengths(model, prompts, gen_len, block_length)
    steps = gen_len if steps is None else int(steps)
    n_blocks = gen_len // block_length
    if steps <= 0 or steps % n_blocks:
        raise DecodeError(f"steps ({steps}) must be a positive multiple of the number of blocks ({n_blocks})")
    if temperature != 0:
        raise DecodeError("the llada decoder reproduces LLaDA's generate at temperature 0 only; use --temperature 0")
    per_block = steps // n_blocks
    dev, m = model.device, model.mask_token_id
    ids, valid = left_pad(prompts, pad_id, dev)
    n = ids.shape[0]
    out = torch.full((n, gen_len), m, dtype=torch.long, device=dev)
    per_step: list[list[int]] = [[] for _ in range(n)]
    step_tok: list[list[list[int]]] = [[] for _ in range(n)]
    ones = torch.ones((n, block_length), dtype=torch.bool, device=dev)
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        cache = model.new_cache()
        model.extend(ids, cache, valid, logits_to_keep=1)
        kv = valid
        for start in range(0, gen_len, block_length):
            block = out[:, start:start + block_length].clone()
            kv = torch.cat([kv, ones], 1)
            schedule = transfer_schedule((block == m).sum(1), per_block)
            future = gen_len - start - block_length
            for i in range(per_block):
                masked = block == m
                logits = model.diffusion_logits(block, cache, kv, future_masks=future).float()
                x0 = logits.argmax(-1)
                conf = torch.softmax(logits, -1).gather(-1, x0[..., None])[..., 0]
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
            model.extend(block, cache, kv, logits_to_keep=1)
    return DecodeResult(tokens=out.tolist(), forwards=[steps] * n, extra_forwards=[0] * n,
                        committed_per_step=per_step, step_tokens=step_tok, wall_time=time.perf_counter() - t0,
                        model_calls=steps)
