"""Acceptance rules for draft-then-verify decoding.

A drafter proposes ``k`` tokens ``d_1..d_k`` after a verified prefix; the verifier scores them in one
causal forward, giving ``k + 1`` next-token distributions: ``p_1`` (after the prefix) predicts ``d_1``, ...,
``p_k`` predicts ``d_k`` and ``p_{k+1}`` is the bonus position after a fully accepted draft.

* :func:`greedy_accept` (temperature 0): accept the longest prefix with ``d_j = argmax p_j``, then emit the
  verifier's argmax at the first mismatch (or the bonus token). The output equals AR-greedy decoding.
* :func:`speculative_accept` (temperature > 0): the speculative-sampling rule (Leviathan et al. 2023;
  DEER Eq. 5–6; NLD §3.3): accept ``d_j`` with probability ``min(1, p_j(d_j) / q_j(d_j))``; at the first
  rejection resample from the residual ``norm(max(0, p_j - q_j))``; if all ``k`` are accepted sample the
  bonus token from ``p_{k+1}``. The emitted tokens are distributed exactly as sampling from ``p``.

Both are batched over rows and return the number of accepted draft tokens and the one extra token, so a
cycle always emits ``accepted + 1`` tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AcceptResult:
    """Outcome of one verification per row.

    Attributes:
        accepted: ``(N,)`` long, number of draft tokens accepted (0..k).
        next_token: ``(N,)`` long, the verifier's token emitted after the accepted prefix (correction at
            the first rejection, or the bonus token when all ``k`` were accepted).
        next_prob: ``(N,)`` float or ``None`` (greedy): the probability of ``next_token`` under the
            distribution it was drawn from, ``norm(max(0, p − q))`` after a rejection and ``p`` for the bonus
            token: ``q_k(x_k)`` of the introspective acceptance rate (I-DLM §2).
    """

    accepted: torch.Tensor
    next_token: torch.Tensor
    next_prob: torch.Tensor | None = None

    def emitted(self, draft: torch.Tensor) -> list[list[int]]:
        """Tokens emitted per row: ``draft[i, :accepted[i]] + [next_token[i]]`` (length ``accepted + 1``)."""
        return [draft[i, :int(a)].tolist() + [int(t)] for i, (a, t) in enumerate(zip(self.accepted, self.next_token))]


def _check(draft: torch.Tensor, verifier: torch.Tensor) -> None:
    if draft.dim() != 2 or verifier.dim() != 3:
        raise ValueError(f"draft must be (N, k) and verifier (N, k + 1, V); got {tuple(draft.shape)} and "
                         f"{tuple(verifier.shape)}")
    n, k = draft.shape
    if verifier.shape[:2] != (n, k + 1):
        raise ValueError(f"verifier must have k + 1 = {k + 1} positions per row for a draft of k = {k}; "
                         f"got {tuple(verifier.shape)}")


def accepted_prefix_length(ok: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True along the last dimension: ``(..., k)`` bool → ``(...)`` long, the index
    of the first False (``k`` when all are True). With ``ok`` the per-position acceptance of a draft, it is the
    number of draft tokens greedy verification accepts."""
    return ok.long().cumprod(dim=-1).sum(dim=-1)


def greedy_accept(draft: torch.Tensor, verifier_logits: torch.Tensor) -> AcceptResult:
    """Greedy verification.

    Args:
        draft: ``(N, k)`` draft token ids.
        verifier_logits: ``(N, k + 1, V)`` verifier logits (or probabilities); row ``j`` predicts draft slot ``j``.

    Returns:
        :class:`AcceptResult`; ``next_token = argmax verifier[accepted]``.

    Raises:
        ValueError: on shape mismatch.
    """
    _check(draft, verifier_logits)
    target = verifier_logits.argmax(dim=-1)                        # (N, k + 1)
    accepted = accepted_prefix_length(target[:, :-1] == draft)               # (N,)
    next_token = target.gather(1, accepted[:, None]).squeeze(1)
    return AcceptResult(accepted, next_token)


def speculative_accept(draft: torch.Tensor, draft_probs: torch.Tensor, verifier_probs: torch.Tensor,
                       generator: torch.Generator | None = None, relax: float = 0.0) -> AcceptResult:
    """Speculative-sampling verification (DEER Eq. 5–6): accept ``d_j`` with probability ``min(1, p_j/q_j)``.

    Args:
        draft: ``(N, k)`` draft ids, each sampled from ``draft_probs``.
        draft_probs: ``(N, k, V)`` drafter distributions ``q_j`` (already at the sampling temperature).
        verifier_probs: ``(N, k + 1, V)`` verifier distributions ``p_j`` (same temperature).
        generator: optional RNG for the uniform draws and the resampling.
        relax: I-DLM §4.3's relaxed acceptance τ ≥ 0: the ratio is multiplied by ``1 + τ``, i.e. accept with
            probability ``min(1, (1 + τ) p_j/q_j)``. 0 (the default) is the exact rule; τ > 0 is lossy.

    Returns:
        :class:`AcceptResult`. With ``relax = 0`` every emitted token is distributed as a draw from ``p``
        given the prefix.

    Raises:
        ValueError: on shape mismatch or a negative ``relax``.
    """
    if relax < 0:
        raise ValueError(f"the relaxed acceptance τ must be ≥ 0, got {relax}")
    _check(draft, verifier_probs)
    if draft_probs.shape != verifier_probs[:, :-1].shape:
        raise ValueError(f"draft_probs must be (N, k, V) = {tuple(verifier_probs[:, :-1].shape)}; "
                         f"got {tuple(draft_probs.shape)}")
    n, k = draft.shape
    p = verifier_probs.float()
    q = draft_probs.float()
    p_d = p[:, :-1].gather(2, draft[..., None]).squeeze(2)         # (N, k)
    q_d = q.gather(2, draft[..., None]).squeeze(2)
    u = torch.rand(n, k, generator=generator, device=draft.device)
    # accept iff u < (1 + τ) p/q, i.e. u * q < (1 + τ) p (no division; q_d > 0 since d was drawn from q).
    accepted = accepted_prefix_length(u * q_d < (1.0 + relax) * p_d)          # (N,)
    rows = torch.arange(n, device=draft.device)
    p_next = p[rows, accepted]                                     # (N, V)
    q_next = torch.cat([q, torch.zeros_like(q[:, :1])], dim=1)[rows, accepted]   # zeros at the bonus slot
    residual = (p_next - q_next).clamp_min(0)
    # p == q makes the residual vanish; rejection then has probability 0, so any fallback is unbiased.
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p_next, residual)
    residual = residual / residual.sum(dim=-1, keepdim=True)
    next_token = torch.multinomial(residual, 1, generator=generator).squeeze(1)
    return AcceptResult(accepted, next_token, residual.gather(1, next_token[:, None]).squeeze(1))
