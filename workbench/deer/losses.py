"""DEER alignment losses as pure functions (arXiv:2512.15176 Eq. 1–4).

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

from ..speculative.accept import accepted_prefix_length


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
    return accepted_prefix_length((pred == targets) & valid)


def greedy_tau_estimate(accepted: torch.Tensor) -> torch.Tensor:
    """τ of greedy DEER decoding estimated from :func:`leading_matches` at uniformly drawn cuts: the mean
    of ``a + 1`` (scalar).

    A decoding cycle starting at s covers ``a(s) + 1`` positions and the next starts at ``s + a(s) + 1``.
    When the drafter's first error after a start falls at each position independently with the same
    probability (errors memoryless along the answer), the ``a`` at a uniform cut has the distribution of the
    ``a`` at a cycle start, so this mean is τ. It is not the harmonic mean ``1 / mean(1 / (a + 1))``: the
    positions inside one cycle have ``a(s) - j`` left, not ``a(s)``, so that mean counts about
    ``H(a + 1)`` cycles for each real one and about halves τ (tests/test_deer.py checks both against the
    exact cycle walk). Clustered errors make any single-cut estimate approximate; the decoded τ of
    ``workbench deer eval`` is the measured one.

    Args:
        accepted: ``(N,)`` accepted draft tokens per cut (long or float).
    """
    return (accepted.float() + 1).mean()
