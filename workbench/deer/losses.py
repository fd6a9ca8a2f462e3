"""DEER alignment losses as pure functions (deer.txt Eq. 1–4).

Both stages share one form, ``−Σ_i w_i 1[x_t^i = M] log p_θ(x_0^i | x_t)`` over the span after SEP, with
``w_i = 1/t`` in Stage I (Eq. 1–2) and ``w_i = α^{R−i}/t`` in Stage II (Eq. 3–4); the weights come from
:mod:`workbench.deer.masking`. The paper writes the expectation of the per-sequence sum and gives no
normaliser; we divide the batch sum by the number of span positions in the batch (LLaDA's ``1/L``
convention), a constant per batch shape, so with ``t = 1`` and ``α = 1`` the loss is the mean
cross-entropy (nats) over the span, and the weights keep their absolute scale.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def deer_loss(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor, weights: torch.Tensor,
              span_valid: torch.Tensor) -> torch.Tensor:
    """Weighted masked cross-entropy of DEER (Eq. 1 with Stage I weights, Eq. 4 with Stage II weights).

    Args:
        logits: ``(N, S, V)`` drafter diffusion logits at the span positions (no shift).
        targets: ``(N, S)`` clean span ids ``x_0``.
        masked: ``(N, S)`` bool, True where ``x_t`` holds the mask token (``1[x_t^i = M]``).
        weights: ``(N, S)`` token weights (``1/t`` or ``α^{R−i}/t``).
        span_valid: ``(N, S)`` bool, True at real span positions (the normaliser counts them).

    Returns a scalar tensor: ``Σ weights · masked · CE / Σ span_valid`` (nats).
    """
    ce = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none").view_as(targets)
    num = (ce * weights * masked.to(ce.dtype)).sum()
    return num / span_valid.sum().clamp_min(1).to(ce.dtype)


def leading_matches(pred: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Length of the longest prefix where ``pred == targets`` on valid positions: ``(N,)`` long.

    With ``pred`` the drafter's argmax over a fully masked block and ``targets`` a greedy teacher answer
    (the target's own greedy continuation), this is exactly the number of draft tokens greedy DEER
    verification would accept at that cut (Alg. 1 at temperature 0), capped at the span length.
    """
    ok = (pred == targets) & valid
    return ok.long().cumprod(dim=1).sum(dim=1)
