"""How well a score ranks the masked positions of one block state for parallel commits (NLD §3.2, §4).

A commit rule that thresholds a score (the top-1 probability for confidence decoding, the sampler's probability
for the learned sampler) commits, at one denoising step, the masked positions ranked highest by that score. It
commits them without error only as far as the ranking's leading positions are all correct, where *correct* is the
sampler's label, ``1[top-1 == final id]`` (NLD App. A). ROC AUC pools every position of every state; these
per-state counts measure the part of the ranking a threshold acts on.
"""
from __future__ import annotations

import torch

from ..speculative.accept import accepted_prefix_length


def safe_prefix(scores: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Per block state, the number of masked positions that a commit in ``scores`` order gets right before its
    first error: the most that any threshold on ``scores`` commits at that state without a wrong token (when no
    two masked positions tie; a threshold commits a tied group at once).

    Masked positions are ranked by ``scores`` (descending; ties in position order); committed positions are
    ignored. The count stops at the first masked position whose label is False.

    Args:
        scores: ``(N, B)`` float, any monotone score (probability, logit).
        labels: ``(N, B)`` bool, ``1[top-1 == final id]`` per position.
        masked: ``(N, B)`` bool, positions still masked in the state.

    Returns:
        ``(N,)`` int64, in tokens: 0 where the top-ranked masked position is wrong (or none is masked).

    Raises:
        ValueError: when the three shapes differ or are not 2-D.
    """
    if scores.dim() != 2 or scores.shape != labels.shape or scores.shape != masked.shape:
        raise ValueError(f"scores, labels and masked must share one (N, B) shape, got {tuple(scores.shape)}, "
                         f"{tuple(labels.shape)} and {tuple(masked.shape)}")
    m = masked.bool()
    key = scores.float().masked_fill(~m, float("-inf"))                             # committed positions last
    order = torch.sort(key, dim=1, descending=True, stable=True).indices           # (N, B)
    return accepted_prefix_length(torch.gather(labels.bool() & m, 1, order))        # (N,) in rank order


def oracle_commits(labels: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Per block state, the masked positions whose top-1 is already the final token: what an oracle ranking
    commits at that state, the per-step count behind NLD §4's speed-of-light acceptance.

    Args:
        labels: ``(N, B)`` bool; masked: ``(N, B)`` bool.

    Returns:
        ``(N,)`` int64, in tokens.

    Raises:
        ValueError: when the two shapes differ or are not 2-D.
    """
    if labels.dim() != 2 or labels.shape != masked.shape:
        raise ValueError(f"labels and masked must share one (N, B) shape, got {tuple(labels.shape)} and "
                         f"{tuple(masked.shape)}")
    return (labels.bool() & masked.bool()).long().sum(dim=1)
