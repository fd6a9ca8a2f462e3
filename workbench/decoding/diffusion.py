"""Block-diffusion decoding (NLD §3.2): blocks of ``B`` mask tokens denoised over the cached clean prefix,
a commit rule deciding which positions to fill each forward, one causal KV-commit forward per block."""
from __future__ import annotations

import time
from typing import Callable

import torch

from .base import DecodeError, DecodeResult, autocast_for, check_lengths, left_pad

CommitRule = Callable[..., torch.Tensor]
#: ``on_step(block_start, step, block, probs, masked, commit)`` called after every denoising forward with
#: the block ids *before* the commit ``(N, B)``, probabilities ``(N, B, V)``, the masked positions before
#: the commit ``(N, B)`` and the committed positions ``(N, B)`` (rows without masks have no commit).
StepCallback = Callable[[int, int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


@torch.no_grad()
def diffusion_decode(model, prompts: list[list[int]], gen_len: int, block_length: int, rule: CommitRule,
                     real_continuation: list[list[int]] | None = None, use_cache: bool = True,
                     pad_id: int = 0, precision: str = "fp32", on_step: StepCallback | None = None,
                     rule_sees_truth: bool = False, commit_last_block: bool = True) -> DecodeResult:
    """Decode ``gen_len`` tokens per prompt block by block.

    Each block starts as ``B`` mask tokens. Every forward computes diffusion logits of the block over
    the cached prefix (the cache is not grown), ``rule(probs, masked)`` picks positions to commit and
    they receive their argmax token; the mask token itself is never predicted (its logit is removed before the
    softmax: the workbench's own decoders, unlike some released loops, e.g. NLD's
    :func:`~workbench.decoding.families.nld.nld_generate_decode`). When no mask is left, one causal forward of the
    filled block extends the KV cache (counted in ``extra_forwards``, i.e. in ``tpf_real`` only). Rows advance in
    lockstep; a row's forwards count only the steps in which it still had masked positions.

    Args:
        model: a :class:`~workbench.model.trimode.TriModeLM`.
        prompts: N prompts of token ids.
        gen_len: tokens to generate; must be a multiple of ``block_length``.
        block_length: B, positions per block.
        rule: commit rule (see :mod:`workbench.decoding.rules`).
        real_continuation: real-context mode: the KV-commit forward appends the *real* block instead of
            the generated one, so every block is conditioned on the real text before it.
        use_cache: False recomputes the whole prefix every forward (reference for the cache test).
        pad_id: left-padding id. precision: 'fp32' or 'bf16'.
        on_step: optional callback receiving every step's state (trajectory collection).
        rule_sees_truth: call ``rule(probs, masked, truth)`` with the real block ``(N, B)`` (the hybrid
            trajectory policy, NLD App. A); needs ``real_continuation``.
        commit_last_block: False skips the KV-commit forward after the last block (nothing follows it).

    Returns a :class:`DecodeResult`. Raises :class:`~workbench.decoding.base.DecodeError` on bad lengths.
    """
    check_lengths(model, prompts, gen_len, block_length)
    dev = model.device
    ids, valid = left_pad(prompts, pad_id, dev)
    n, b = ids.shape[0], block_length
    real = torch.tensor(real_continuation, dtype=torch.long, device=dev) if real_continuation is not None else None
    out = torch.zeros((n, gen_len), dtype=torch.long, device=dev)
    qs = torch.zeros((n, gen_len), dtype=torch.float32, device=dev)     # q_k(x_k): top-1 prob at its commit
    forwards, extra = [0] * n, [0] * n
    per_step: list[list[int]] = [[] for _ in range(n)]
    step_tok: list[list[list[int]]] = [[] for _ in range(n)]
    ones = torch.ones((n, b), dtype=torch.bool, device=dev)
    calls = 0
    commit_forward = int(getattr(model, "commit_forward", True))   # 0: the family recomputes instead of committing
    t0 = time.perf_counter()
    with autocast_for(dev, precision):
        cache = model.new_cache()
        if use_cache:
            model.extend(ids, cache, valid, logits_to_keep=1)
        ctx_ids, ctx_valid = ids, valid
        for start in range(0, gen_len, b):
            block = torch.full((n, b), model.mask_token_id, dtype=torch.long, device=dev)
            kv = torch.cat([ctx_valid, ones], 1)
            masked = torch.ones((n, b), dtype=torch.bool, device=dev)
            truth = real[:, start:start + b] if real is not None else None
            if rule_sees_truth and truth is None:
                raise DecodeError("this policy needs the real continuation (ground truth)")
            step = 0
            while masked.any():
                future = gen_len - start - b                      # masks after the block (LLaDA and Dream see them)
                if use_cache:
                    logits = model.diffusion_logits(block, cache, kv, future_masks=future)
                else:
                    fresh = model.new_cache()
                    model.extend(ctx_ids, fresh, ctx_valid, logits_to_keep=1)
                    logits = model.diffusion_logits(block, fresh, kv, future_masks=future)
                calls += 1
                logits = logits.float()
                logits[..., model.mask_token_id] = float("-inf")  # a position is never decoded as the mask token
                probs = torch.softmax(logits, dim=-1)
                commit = (rule(probs, masked, truth) if rule_sees_truth else rule(probs, masked)) & masked
                top = probs.argmax(dim=-1)
                if on_step is not None:
                    on_step(start, step, block, probs, masked, commit)
                step += 1
                block = torch.where(commit, top, block)
                qs[:, start:start + b] = torch.where(commit, probs.max(dim=-1).values, qs[:, start:start + b])
                active = masked.any(dim=1).tolist()
                counts = commit.sum(dim=1).tolist()
                for r in range(n):
                    if active[r]:
                        forwards[r] += 1
                        per_step[r].append(int(counts[r]))
                        step_tok[r].append(top[r][commit[r]].tolist())
                masked = masked & ~commit
            out[:, start:start + b] = block
            committed = real[:, start:start + b] if real is not None else block
            if start + b == gen_len and not commit_last_block:
                break
            if use_cache:
                model.extend(committed, cache, kv, logits_to_keep=1)     # KV commit
                calls += commit_forward
            ctx_ids, ctx_valid = torch.cat([ctx_ids, committed], 1), kv
            for r in range(n):
                extra[r] += commit_forward
    wall = time.perf_counter() - t0
    return DecodeResult(tokens=out.tolist(), forwards=forwards, extra_forwards=extra,
                        committed_per_step=per_step, step_tokens=step_tok, wall_time=wall, model_calls=calls,
                        token_probs=qs.tolist())
