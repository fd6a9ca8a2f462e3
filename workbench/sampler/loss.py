"""Sampler training loss (NLD App. A): per-position binary cross-entropy on masked positions only."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_bce(logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean BCE-with-logits over the still-masked positions of a batch of block states (NLD App. A).

    Args:
        logits: ``(N, B)`` float commit logits from :class:`~workbench.sampler.network.SamplerNet`.
        labels: ``(N, B)`` bool, ``1[current top-1 == final id]``.
        masked: ``(N, B)`` bool, positions still masked at this step (committed positions carry no loss).

    Returns a float32 scalar (nats per masked position). With no masked position it is ``0.0`` and still
    connected to the graph (``logits.sum() * 0``), so ``backward()`` works. Raises ``ValueError`` on shape mismatch.
    """
    if logits.shape != labels.shape or logits.shape != masked.shape:
        raise ValueError(f"logits {tuple(logits.shape)}, labels {tuple(labels.shape)} and masked "
                         f"{tuple(masked.shape)} must have the same (N, B) shape")
    m = masked.bool()
    n = m.sum()
    if n == 0:
        return logits.float().sum() * 0.0
    per = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
    return torch.where(m, per, torch.zeros_like(per)).sum() / n
