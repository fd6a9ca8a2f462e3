"""The sampling distribution of every sampled decoder: temperature, then top-k, then top-p (nucleus).

I-DLM evaluates quality with temperature 1, top-k 50 and top-p 0.95 for ISD and for its AR baseline alike
(I-DLM App. H, Table 8). Speculative sampling stays lossless under such a warp when the drafter's ``q`` and the
verifier's ``p`` are both warped: the accept / residual rule then reproduces the warped ``p`` exactly (Leviathan
et al. 2023, Thm. 1 holds for any pair of distributions). Every sampled decoder therefore forms both from
:func:`sampling_probs`.

The order is that of transformers' ``generate`` (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
``TopPLogitsWarper``): divide by T; keep the k largest logits (ties at the k-th value are kept); among those,
keep the smallest set of most probable tokens whose probability reaches ``top_p``.
"""
from __future__ import annotations

import torch

from .base import DecodeError

#: No top-k / top-p filtering.
NO_TOP_K, NO_TOP_P = 0, 1.0


def check_sampling(temperature: float, top_k: int = NO_TOP_K, top_p: float = NO_TOP_P) -> None:
    """Raise a one-line :class:`DecodeError` unless ``temperature ≥ 0``, ``top_k ≥ 0`` (0 = off) and
    ``0 < top_p ≤ 1`` (1 = off)."""
    if not temperature >= 0:
        raise DecodeError(f"temperature must be ≥ 0 (0 = greedy), got {temperature}")
    check_filters(top_k, top_p)


def check_filters(top_k: int = NO_TOP_K, top_p: float = NO_TOP_P) -> None:
    """Raise a one-line :class:`DecodeError` unless ``top_k ≥ 0`` (0 = off) and ``0 < top_p ≤ 1`` (1 = off)."""
    if isinstance(top_k, bool) or int(top_k) != top_k or top_k < 0:
        raise DecodeError(f"top_k must be an integer ≥ 0 (0 = no top-k filter), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise DecodeError(f"top_p must be in (0, 1] (1 = no nucleus filter), got {top_p}")


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int = NO_TOP_K,
                top_p: float = NO_TOP_P) -> torch.Tensor:
    """``logits / T`` as float32, ``-inf`` outside the top-k set and outside the nucleus.

    Args:
        logits: ``(..., vocab)`` raw logits (entries may already be ``-inf``, e.g. a forbidden mask token).
        temperature: T > 0. At T ≤ 0 (greedy decoding) the result is the plain logits with no filter: a greedy
            pick is the argmax whatever the filter, and the probability it reports (I-DLM §2's ``q_k``) is
            that of ``softmax(logits)``.
        top_k: keep the ``top_k`` largest logits and their ties (0 = all).
        top_p: keep the smallest set of most probable tokens whose total probability is ≥ ``top_p`` (1 = all);
            the most probable token is always kept. Tokens tied in probability are ranked by a descending sort,
            so where tied tokens straddle the nucleus's edge the ones kept may differ from ``generate``'s (which
            sorts ascending); without ties the sets are equal.

    Returns ``(..., vocab)`` float32. Raises :class:`DecodeError` for an out-of-range ``top_k`` / ``top_p``.
    """
    z = logits.float()
    if temperature <= 0:
        return z
    check_sampling(temperature, top_k, top_p)
    z = z / temperature
    if top_k and top_k < z.shape[-1]:
        kth = z.topk(int(top_k), dim=-1).values[..., -1:]
        z = z.masked_fill(z < kth, float("-inf"))
    if top_p < 1.0:
        sorted_z, order = z.sort(dim=-1, descending=True)
        p = sorted_z.softmax(-1)
        before = p.cumsum(-1) - p                         # probability of the tokens ranked above each token
        drop = torch.zeros_like(z, dtype=torch.bool).scatter(-1, order, before >= top_p)
        z = z.masked_fill(drop, float("-inf"))
    return z


def sampling_probs(logits: torch.Tensor, temperature: float, top_k: int = NO_TOP_K,
                   top_p: float = NO_TOP_P) -> torch.Tensor:
    """``(..., vocab)`` float32: ``softmax(warp_logits(logits, T, top_k, top_p))``, the distribution a sampled
    decoder draws from (and, for speculative sampling, the drafter's ``q`` and the verifier's ``p``). At T ≤ 0:
    ``softmax(logits)``. Raises :class:`DecodeError` for an out-of-range ``top_k`` / ``top_p``."""
    return torch.softmax(warp_logits(logits, temperature, top_k, top_p), dim=-1)


__all__ = ["NO_TOP_K", "NO_TOP_P", "check_filters", "check_sampling", "warp_logits", "sampling_probs"]
