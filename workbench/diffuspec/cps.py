"""Causal-consistency path search (CPS, DiffuSpec, arXiv:2510.02358 §4.2, Eq. 6–7, Algorithm 1 step 2).

From the drafter's per-position distributions over a draft block of ``k`` masks (the token lattice), CPS

1. prunes each position to the smallest top-m set whose cumulative mass reaches τ, capped at M_max (Eq. 6),
   always keeping EOS;
2. runs a left-to-right beam search of width B over the pruned lattice, scoring a path π as
   S(π) = Σᵢ [λ · ℓᵢ^dlm(πᵢ) + (1 − λ) · ℓᵢ^ng(π_{1:i})] (Eq. 7), where ℓ^dlm is the drafter's log-probability
   and ℓ^ng the causal proxy's log-probability of πᵢ after the prefix and π_{<i} (the proxy's per-token
   conditional score: the sum over i is the path's proxy log-likelihood);
3. stops at the first depth whose best candidate ends in EOS ("early-stop after the first EOS") and returns that
   path; a lower-ranked EOS ends no path.

Otherwise the result is the best path by S among those that reach the block's end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class Lattice:
    """Pruned candidates per draft position.

    Attributes:
        ids: per position, candidate token ids (most probable first).
        logp: per position, the drafter's log-probabilities of those ids (natural log).
    """

    ids: list[list[int]]
    logp: list[list[float]]

    @property
    def sizes(self) -> list[int]:
        """Candidates per position (the branching factor)."""
        return [len(c) for c in self.ids]


def check_cps_args(tau: float, m_max: int, beam: int, lam: float) -> None:
    """Raise ``ValueError`` (one line) for τ outside (0, 1], M_max < 1, beam width < 1 or λ outside [0, 1]."""
    if not 0 < tau <= 1:
        raise ValueError(f"CPS mass threshold tau must be in (0, 1], got {tau}")
    if m_max < 1:
        raise ValueError(f"CPS per-position cap m_max must be >= 1, got {m_max}")
    if beam < 1:
        raise ValueError(f"CPS beam width must be >= 1, got {beam}")
    if not 0 <= lam <= 1:
        raise ValueError(f"CPS mixing weight lambda must be in [0, 1], got {lam}")


def prune_lattice(logprobs: torch.Tensor, tau: float = 0.8, m_max: int = 15, eos_id: int | None = None) -> Lattice:
    """Mass-adaptive pruning (Eq. 6): per position the smallest m ≥ 1 whose top-m mass reaches ``tau``,
    capped at ``m_max``; EOS is always kept (appended when pruned away).

    Args:
        logprobs: ``(k, vocab)`` the drafter's log-probabilities at the k draft positions.
        tau: mass threshold in (0, 1]. m_max: per-position cap (≥ 1). eos_id: the EOS id, or None.

    Returns a :class:`Lattice` of k positions. Raises ``ValueError`` for a bad τ or M_max.
    """
    check_cps_args(tau, m_max, 1, 0.5)
    top_lp, top_ids = logprobs.float().topk(min(m_max, logprobs.shape[-1]), dim=-1)     # (k, M)
    mass = top_lp.exp().cumsum(-1)
    m = ((mass < tau).sum(-1) + 1).clamp(max=top_ids.shape[-1])                          # Eq. 6, capped
    ids, logp = [], []
    for i in range(logprobs.shape[0]):
        ci, li = top_ids[i, :m[i]].tolist(), top_lp[i, :m[i]].tolist()
        if eos_id is not None and eos_id not in ci:
            ci.append(int(eos_id))
            li.append(float(logprobs[i, eos_id]))
        ids.append(ci)
        logp.append(li)
    return Lattice(ids, logp)


ProxyScore = Callable[[object, int], tuple[float, object]]


def cps_search(lattice: Lattice, proxy_state: object, proxy_score: ProxyScore | None, beam: int = 3,
               lam: float = 0.5, eos_id: int | None = None) -> tuple[list[int], float]:
    """Left-to-right beam search over ``lattice`` with the score of Eq. 7.

    Args:
        lattice: pruned candidates (:func:`prune_lattice`).
        proxy_state: the causal proxy's state after the prefix (e.g. :meth:`NgramProxy.state`).
        proxy_score: ``(state, token) -> (ln p, next_state)``; None scores with the drafter alone (λ = 1).
        beam: beam width B ≥ 1. lam: λ in [0, 1]. eos_id: a path stops at its first EOS.

    DiffuSpec §4.2 runs the search "until EOS is placed" and Alg. 1 step 2 says "early-stop after the first EOS":
    here the search stops at the first depth whose best candidate ends in EOS and returns that path; an EOS that
    ranks lower at its depth ends no path (comparing a finished short path's raw sum with full-length ones would
    favour it whatever its rank, since every further token adds a negative term).

    Returns ``(path, score)``: the best path (length 1..k; ends at its first EOS, if any) and its S(π).

    Raises ``ValueError`` for an empty lattice, beam < 1 or λ outside [0, 1].
    """
    check_cps_args(0.5, 1, beam, lam)
    if not lattice.ids:
        raise ValueError("CPS needs a lattice of at least one position")
    beams: list[tuple[float, list[int], object]] = [(0.0, [], proxy_state)]
    for ids, logp in zip(lattice.ids, lattice.logp):
        expanded = []
        for score, path, state in beams:
            for tok, lp in zip(ids, logp):
                if proxy_score is None or lam == 1.0:
                    ng, nxt = 0.0, state
                else:
                    ng, nxt = proxy_score(state, tok)
                expanded.append((score + lam * lp + (1 - lam) * ng, path + [tok], nxt))
        expanded.sort(key=lambda t: t[0], reverse=True)
        if eos_id is not None and expanded[0][1][-1] == eos_id:
            return expanded[0][1], expanded[0][0]             # EOS placed on the best path: early stop
        # a path ending in an EOS that is not the best at its depth is dropped: a finished short path would
        # otherwise win against every longer one, whose extra tokens only add negative log-scores
        beams = [c for c in expanded if eos_id is None or c[1][-1] != eos_id][:beam]
        if not beams:
            break
    best = max(beams, key=lambda t: t[0])
    return best[1], best[0]


def first_eos_length(draft: list[int], eos_id: int | None) -> int:
    """L^gen of Eq. 8: min(s − 1, k) where s is the 1-based index of the first EOS in the raw draft."""
    if eos_id is not None and eos_id in draft:
        return draft.index(eos_id)
    return len(draft)
