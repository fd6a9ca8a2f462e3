"""NLD's own block-diffusion loop: ``generate_with_prefix_cache_block_diff`` of its Hugging Face remote code
(``chat_utils.py``), as its ``generate_diffusion`` calls it (``causal_context=True``, ``shift_logits=False``,
``remasking='low_confidence'``, temperature 0, a confidence ``threshold``), on the workbench's model interface.

1. The prompt is committed causally; the argmax of its last logit is the next token.
2. Per block of ``B``: position 0 is that next token, the rest are masks. At most ``steps / (gen_len / B)``
   times, while the block holds a mask: one forward of the block over the cached prefix (bidirectional within
   the block); the prediction is the argmax over the **whole vocabulary** and its confidence its softmax
   probability (``get_transfer_index``); every masked position whose confidence is ≥ ``threshold`` takes its
   prediction, and always the most confident one. A position predicted as the mask token stays a mask (the
   reference writes the prediction back); if the forwards run out first, the block keeps its masks.
3. One causal forward commits the block (counted in ``extra_forwards``, as the reference's ``nfe`` counts it);
   the argmax of its last logit seeds the next block.

**EOS** (``eos_id``, the reference's ``eos_token_id``): after a forward, a block holding the EOS with no mask
before it stops denoising; after its commit the row stops (the reference returns once every row has an EOS; its
in-block break also stops the other rows of a batch, which :func:`nld_generate_decode` does not reproduce: each row
stops as it would alone). Tokens are cut after the first EOS.

Rows advance in lockstep; a row's ``forwards`` count the steps in which it still denoised its block.
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths, check_threshold, left_pad
from ..rules import most_confident
from .stopping import cut_at_eos


def settled_at_eos(block: torch.Tensor, mask_id: int, eos_id: int) -> torch.Tensor:
    """``(N,)`` bool: the rows of ``block`` ``(N, B)`` that hold ``eos_id`` with no ``mask_id`` before its first
    occurrence (``generate_with_prefix_cache_block_diff``'s in-block break)."""
    is_eos = block == eos_id
    before = (block == mask_id) & ~is_eos.cumsum(dim=1).bool()
    return is_eos.any(dim=1) & ~before.any(dim=1)


@torch.no_grad()
def nld_generate_decode(model, prompts: list[list[int]], gen_len: int, block_length: int, threshold: float = 0.9,
                        steps: int | None = None, pad_id: int = 0, precision: str = "fp32",
                        real_continuation: list[list[int]] | None = None, eos_id: int | None = None) -> DecodeResult:
    """NLD's ``generate_with_prefix_cache_block_diff`` (the module docstring gives the algorithm).

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM` with an AR mode (``extend`` returns the causal logits).
        prompts: N prompts (token ids), left-padded into one batch.
        gen_len: tokens to generate; a multiple of ``block_length``.
        block_length: B.
        threshold: the confidence threshold τ in (0, 1].
        steps: forwards of all blocks together (default ``gen_len``: at most ``B`` per block); a multiple of the
            number of blocks.
        pad_id, precision: left-padding id; 'fp32' or 'bf16'.
        real_continuation: real-context mode: each block is committed as the real text instead of the generated
            one (the workbench's evaluation mode; the reference has none), and the next block's first token is the
            argmax after the real text.
        eos_id: the reference's EOS stop (above).

    Returns a :class:`~workbench.decoding.base.DecodeResult` with ``token_probs`` (each committed token's top-1
    probability). Raises :class:`~workbench.decoding.base.DecodeError` for lengths that do not divide, a threshold
    outside (0, 1] or ``steps`` that is not a positive multiple of the number of blocks.
    """
    check_lengths(model, prompts, gen_len, block_length)
    threshold = check_threshold(threshold)
    n_blocks = gen_len // block_length
    steps = gen_len if steps is None else int(steps)
    if steps <= 0 or steps % n_blocks:
        raise DecodeError(f"steps ({steps}) must be a positive multiple of the number of blocks ({n_blocks})")
    per_block = steps // n_blocks
    dev, m, b = model.device, model.mask_token_id, block_length
    ids, valid = left_pad(prompts, pad_id, dev)
    n = ids.shape[0]
    real = torch.tensor(real_continuation, dtype=torch.long, device=dev) if real_continuation is not None else None
    out = torch.full((n, gen_len), m, dtype=torch.long, device=dev)
    qs = torch.zeros((n, gen_len), dtype=torch.float32, device=dev)
    forwards, extra = [0] * n, [0] * n
    per_step: list[list[int]] = [[] for _ in range(n)]
    step_tok: list[list[list[int]]] = [[] for _ in range(n)]
    finished = torch.zeros(n, dtype=torch.bool, device=dev)          # rows that stopped at their EOS
    ones = torch.ones((n, b), dtype=torch.bool, device=dev)
    calls = 0
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        cache = model.new_cache()
        last = model.extend(ids, cache, valid, logits_to_keep=1)
        kv = valid
        for start in range(0, gen_len, b):
            seed = torch.softmax(last[:, -1].float(), dim=-1)
            block = torch.full((n, b), m, dtype=torch.long, device=dev)
            block[:, 0] = seed.argmax(dim=-1)
            qs[:, start] = seed.max(dim=-1).values
            kv = torch.cat([kv, ones], 1)
            done = finished.clone()                                   # rows whose block stopped denoising
            for _ in range(per_block):
                masked = (block == m) & ~done[:, None]
                if not masked.any():
                    break
                logits = model.diffusion_logits(block, cache, kv).float()
                calls += 1
                probs = torch.softmax(logits, dim=-1)
                top = probs.argmax(dim=-1)
                conf = probs.gather(-1, top[..., None])[..., 0]
                commit = ((conf >= threshold) & masked) | most_confident(conf, masked)
                block = torch.where(commit, top, block)
                qs[:, start:start + b] = torch.where(commit, conf, qs[:, start:start + b])
                active, counts = masked.any(dim=1).tolist(), commit.sum(dim=1).tolist()
                for r in range(n):
                    if active[r]:
                        forwards[r] += 1
                        per_step[r].append(int(counts[r]))
                        step_tok[r].append(top[r][commit[r]].tolist())
                if eos_id is not None:
                    done |= settled_at_eos(block, m, eos_id)
            out[:, start:start + b] = block
            committed = real[:, start:start + b] if real is not None else block
            last = model.extend(committed, cache, kv, logits_to_keep=1)
            calls += 1
            for r in (~finished).nonzero().flatten().tolist():
                extra[r] += 1
            if eos_id is not None:
                finished |= (out[:, :start + b] == eos_id).any(dim=1)
                if bool(finished.all()):
                    break
    res = DecodeResult(tokens=out.tolist(), forwards=forwards, extra_forwards=extra, committed_per_step=per_step,
                       step_tokens=step_tok, wall_time=time.perf_counter() - t0, model_calls=calls,
                       token_probs=qs.tolist())
    return cut_at_eos(res, eos_id)


__all__ = ["nld_generate_decode", "settled_at_eos"]
