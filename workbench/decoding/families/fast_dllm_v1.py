"""Fast-dLLM v1's threshold decoding with its prefix cache, for the families without an exact cache (LLaDA,
Dream), on the workbench's model interface. NVlabs/Fast-dLLM (v1):

* LLaDA: ``llada/generate.py: generate_with_prefix_cache`` with ``threshold`` (temperature 0,
  ``remasking='low_confidence'``);
* Dream: ``dream/model/generation_utils_block.py: DreamGenerationMixin._sample`` with
  ``alg='confidence_threshold'``, ``dual_cache=False`` (temperature 0, no ``top_p`` / ``top_k``).

Per block of ``B`` (the canvas is the prompt, then ``gen_len`` masks, every future mask visible):

1. one forward of the whole canvas, which keeps the prefix's keys and values (computed while the prefix saw this
   step's block and future masks: the approximation, :meth:`~workbench.model.families.adapters.RecomputeFamilyLM.
   approximate_prefix_cache`). LLaDA applies the threshold rule below to it; Dream commits block position 0 only,
   with its prediction, whatever the threshold;
2. then, until a forward leaves the block without a mask (at least once, even when step 1 filled the block, as
   the references loop): one forward of ``[block | future masks]`` over the kept prefix; the threshold rule.

The threshold rule: the prediction is the argmax over the **whole vocabulary**, its confidence its softmax
probability (float64 for LLaDA, as ``get_transfer_index``; float32 for Dream, the model's precision there); every
masked position of the block with confidence ≥ ``threshold`` takes its prediction, and always the most confident
one. A position predicted as the mask token stays a mask; a forward that commits only such predictions would
repeat for ever in the reference, so there the most confident masked position takes its best other token
(:func:`unstick`). Dream's shifted logits are realigned by the adapter, so
block position 0 of a later forward reads the first forward's prefix logit, where the reference reads the chunk's own
first logit; step 1 has committed position 0, so the two differ only if it was predicted as the mask token.

No EOS rule (neither reference has one): every block runs; tokens are cut after the first EOS. The references
decode one prompt at a time; rows here advance in lockstep, each as it would alone (left padding masked).
"""
from __future__ import annotations

import time

import torch

from ..base import DecodeError, DecodeResult, autocast_for, check_lengths, check_threshold, left_pad
from ..rules import most_confident
from .stopping import cut_at_eos


def threshold_commit(logits: torch.Tensor, masked: torch.Tensor, threshold: float, dtype: torch.dtype
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_transfer_index`` with a threshold at temperature 0: argmax of ``logits`` ``(N, B, V)`` over the whole
    vocabulary, confidence = its softmax probability in ``dtype``; commit every ``masked`` ``(N, B)`` position with
    confidence ≥ ``threshold`` and the most confident one. Returns ``(commit (N, B) bool, prediction (N, B))``."""
    top = logits.argmax(dim=-1)
    conf = torch.softmax(logits.to(dtype), dim=-1).gather(-1, top[..., None])[..., 0]
    return ((conf >= threshold) & masked) | most_confident(conf, masked), top


def unstick(logits: torch.Tensor, masked: torch.Tensor, commit: torch.Tensor, top: torch.Tensor, stuck: torch.Tensor,
            mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For the rows ``stuck`` ``(N,)`` whose forward committed only mask-token predictions (the block unchanged, so
    the reference's ``while`` loop, deterministic at temperature 0, would repeat the same forward for ever), the most
    confident masked position takes its best token other than the mask. Elsewhere ``(commit, top)`` are unchanged,
    so the decode equals the reference on every input where the reference ends. ``logits`` ``(N, B, V)``; returns
    ``(commit, top)``."""
    second = logits.clone()
    second[..., mask_id] = float("-inf")
    alt = second.argmax(dim=-1)
    conf = torch.softmax(second, dim=-1).gather(-1, alt[..., None])[..., 0]
    pick = most_confident(conf, masked) & stuck[:, None]
    return commit | pick, torch.where(pick, alt, top)


@torch.no_grad()
def prefix_cache_decode(model, prompts: list[list[int]], gen_len: int, block_length: int, threshold: float = 0.9,
                        pad_id: int = 0, precision: str = "fp32", real_continuation: list[list[int]] | None = None,
                        eos_id: int | None = None) -> DecodeResult:
    """Fast-dLLM v1's prefix-cache threshold decoding of LLaDA or Dream (the module docstring gives the loops).

    Args:
        model: a LLaDA or Dream adapter (:class:`~workbench.model.families.adapters.RecomputeFamilyLM`; Dream's
            loop is taken for a shifted family).
        prompts: N prompts (token ids), left-padded into one batch.
        gen_len: tokens to generate; a multiple of ``block_length``.
        block_length: B.
        threshold: τ in (0, 1].
        pad_id, precision: left-padding id; 'fp32' or 'bf16'.
        real_continuation: real-context mode: each block is committed as the real text (the workbench's
            evaluation mode; the references have none).
        eos_id: cut each row after its first ``eos_id`` (no forward is saved: the references have no EOS rule).

    Returns a :class:`~workbench.decoding.base.DecodeResult` (``forwards``: every forward that ran while the row
    was in its block's loop, the references' ``nfe``; ``extra_forwards``: 0). Raises
    :class:`~workbench.decoding.base.DecodeError` for a model with an exact cache, bad lengths or a threshold
    outside (0, 1].
    """
    approximate = getattr(model, "approximate_prefix_cache", None)
    if approximate is None:
        raise DecodeError("confidence_prefix_cache approximates the full recompute of LLaDA and Dream; this model's "
                          "forward has an exact cache (use confidence)")
    check_lengths(model, prompts, gen_len, block_length)
    threshold = check_threshold(threshold)
    dream = bool(getattr(getattr(model, "family", None), "shift", False))
    dtype = torch.float32 if dream else torch.float64
    dev, m, b = model.device, model.mask_token_id, block_length
    ids, valid = left_pad(prompts, pad_id, dev)
    n = ids.shape[0]
    real = torch.tensor(real_continuation, dtype=torch.long, device=dev) if real_continuation is not None else None
    out = torch.full((n, gen_len), m, dtype=torch.long, device=dev)
    forwards = [0] * n
    per_step: list[list[int]] = [[] for _ in range(n)]
    step_tok: list[list[list[int]]] = [[] for _ in range(n)]
    ones = torch.ones((n, b), dtype=torch.bool, device=dev)
    calls = 0

    def record(commit, top, counted):
        for r in range(n):
            if counted[r]:
                forwards[r] += 1
                per_step[r].append(int(commit[r].sum()))
                step_tok[r].append(top[r][commit[r]].tolist())

    t0 = time.perf_counter()
    with approximate(), autocast_for(dev, precision):
        cache = model.new_cache()
        model.extend(ids, cache, valid, logits_to_keep=1)
        kv = valid
        for start in range(0, gen_len, b):
            kv = torch.cat([kv, ones], 1)
            future = gen_len - start - b
            block = torch.full((n, b), m, dtype=torch.long, device=dev)
            logits = model.diffusion_logits(block, cache, kv, future_masks=future).float()     # keeps the prefix KV
            calls += 1
            if dream:                                  # Dream: block position 0 from the first forward, always
                top = logits.argmax(dim=-1)
                commit = torch.zeros_like(block, dtype=torch.bool)
                commit[:, 0] = True
            else:
                commit, top = threshold_commit(logits, block == m, threshold, dtype)
            block = torch.where(commit, top, block)
            record(commit, top, [True] * n)
            looping = torch.ones(n, dtype=torch.bool, device=dev)
            while looping.any():
                logits = model.diffusion_logits(block, cache, kv, future_masks=future).float()
                calls += 1
                masked = (block == m) & looping[:, None]
                commit, top = threshold_commit(logits, masked, threshold, dtype)
                new = torch.where(commit, top, block)
                stuck = masked.any(dim=1) & (new == block).all(dim=1)
                if stuck.any():                 # the reference would repeat this state for ever: see unstick
                    commit, top = unstick(logits, masked, commit, top, stuck, m)
                    new = torch.where(commit, top, block)
                block = new
                record(commit, top, looping.tolist())
                looping &= (block == m).any(dim=1)
            out[:, start:start + b] = block
            model.extend(real[:, start:start + b] if real is not None else block, cache, kv, logits_to_keep=1)
    res = DecodeResult(tokens=out.tolist(), forwards=forwards, extra_forwards=[0] * n, committed_per_step=per_step,
                       step_tokens=step_tok, wall_time=time.perf_counter() - t0, model_calls=calls)
    return cut_at_eos(res, eos_id)


__all__ = ["prefix_cache_decode", "threshold_commit"]
