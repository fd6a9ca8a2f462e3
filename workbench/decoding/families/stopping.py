"""What a family's decoder returns when it stops at an end-of-sequence token as its reference stops.

Each released family's loop has its own rule, and the forwards it spends after the EOS follow from it (the decoders
count them in their loops): LLaDA's ``generate`` and Dream's ``diffusion_generate`` have none (every step runs);
SDAR's evaluation loop stops after the block that holds a stop token; Fast-dLLM v2's ``batch_sample`` finishes a
row once a step unmasks its stop token; NLD's ``generate_with_prefix_cache_block_diff`` breaks out of the block and
then stops. Whatever the rule, the text ends at the first EOS: :func:`cut_at_eos` cuts the tokens there.
"""
from __future__ import annotations

from ..base import DecodeResult


def cut_at_eos(res: DecodeResult, eos_id: int | None) -> DecodeResult:
    """Cut every row's ``tokens`` (and ``token_probs``) after its first ``eos_id`` (kept), in place; the forward
    counts and the per-step records are left as the decoder counted them. Returns ``res``; ``eos_id`` None: as is."""
    if eos_id is None:
        return res
    for r, toks in enumerate(res.tokens):
        if eos_id in toks:
            end = toks.index(eos_id) + 1
            res.tokens[r] = toks[:end]
            if res.token_probs:
                res.token_probs[r] = res.token_probs[r][:end]
    return res


__all__ = ["cut_at_eos"]
