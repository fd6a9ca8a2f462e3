"""The drafter's one forward: a causal chunk of verified tokens followed by a bidirectional draft block.

DEER's drafter conditions on the verified prefix and proposes a whole block in one step (arXiv:2512.15176 §3.2,
Alg. 1 line 3); its training input is ``[prefix, SEP, x_t]`` (§3.1.1). Both use the same attention
pattern, consistent with the TriModeLM's block diffusion (NLD §3.2): clean tokens are causal, the block
``[SEP, m_1..m_k]`` sees every valid clean token and itself bidirectionally. One forward serves both:

* training: no cache, ``chunk`` = the whole (left-padded) clean context;
* decoding: ``chunk`` = the tokens verified since the last cycle, appended to the drafter's KV cache,
  and the block, cropped off the cache again (so the cache holds only verified tokens).

``key_valid`` False marks keys never attended (left padding, right padding of a ragged chunk or block);
position ids count valid keys only, so holes do not shift positions.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ..model.masks import chunk_block_allowed, to_additive


def draft_block_logits(drafter, chunk: torch.Tensor, block: torch.Tensor, key_valid: torch.Tensor,
                       cache: DynamicCache | None = None) -> torch.Tensor:
    """Diffusion logits of a draft block after a causal chunk, in one forward of ``drafter`` (a TriModeLM).

    Args:
        chunk: ``(batch, w)`` clean ids appended causally (``w`` may be 0).
        block: ``(batch, b)`` block ids (``[SEP, mask, ...]`` at decoding; ``[SEP, x_t]`` in training).
        key_valid: ``(batch, cache_len + w + b)`` bool.
        cache: the drafter's KV cache of the clean prefix, or ``None`` (training, no cache). On return it
            holds the old prefix plus the chunk; the block is cropped off.

    Returns ``(batch, b, vocab)``: logits at block position ``j`` predict the token at ``j`` (no shift).
    """
    ids = torch.cat([chunk, block], dim=1)
    w, b = chunk.shape[1], block.shape[1]
    pos = (key_valid.long().cumsum(dim=1) - 1).clamp_min(0)[:, -(w + b):]
    mask = to_additive(chunk_block_allowed(key_valid, w, b), drafter.mask_dtype)
    logits = drafter.call_backbone(ids, pos, mask, cache)
    if cache is not None:
        cache.crop(-b)
    return logits[:, w:]
