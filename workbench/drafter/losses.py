"""Drafter–verifier alignment losses for LoRA drafters as pure functions (NLD §3.3, Eq. 6–9).

Notation (NLD §3.3): a draft block has ``k`` positions; at position ``j`` the drafter (diffusion
pathway with the LoRA adapter) gives logits ``z^d_j`` and the frozen AR verifier gives ``z^t_j`` on the
same context. With ``τ = 3``

* ``q_j = softmax(z^d_j / τ)`` (carries gradient), ``p_j = softmax(z^t_j / τ)`` (stop-gradient);
* ``U_j = top-K(p_j) ∪ top-K(q_j)`` (``K = 200``); ``p̃_j``, ``q̃_j`` = ``p_j``, ``q_j`` zeroed outside
  ``U_j`` and renormalised;
* ``α_j = Σ_{v∈U_j} min(p̃_j(v), q̃_j(v))`` (speculative-decoding acceptance probability),
  ``TV_j = ½ Σ_{v∈U_j} |p̃_j(v) − q̃_j(v)| = 1 − α_j``;
* ``λ_j = exp(−η · sg[α_j])`` (``η = 0.5``); LK-hybrid ``L^LK_j = λ_j KL(p̃_j‖q̃_j) + (1 − λ_j) TV_j`` (Eq. 6);
* CE: ``ℓ_j = −log q^{(U_j)}_j(y_j)`` with ``q^{(U_j)}`` the drafter softmax restricted to ``U_j`` at
  ``τ = 1`` and ``y_j = argmax z^t_j``; ``ℓ_j = 0`` and the position leaves the CE denominator when
  ``y_j ∉ U_j`` (Eq. 7–8);
* masked means over the active set ``A`` = accepted prefix + first rejection (:func:`active_mask`),
  per draft block, then averaged over the blocks of the batch (Eq. 8); total
  ``L = λ_KL L_LK + λ_CE L_CE`` with ``λ_KL = λ_CE = 1`` (Eq. 9).

Note on the CE drop rule: with the default target ``y_j = argmax z^t_j`` the target is the top-1 of
``p_j`` and therefore always in ``U_j`` when ``K ≥ 1`` (up to exact ties); the rule fires for explicit
``targets`` (e.g. corpus tokens) or ties, and is implemented and tested for that case.

Variants for the ablation are picked by name from :data:`LOSSES` (:func:`get_loss`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..speculative import greedy_accept


@dataclass
class PositionTerms:
    """Per-position loss terms of a batch of draft blocks; every field is ``(batch, k)`` float32.

    Attributes:
        kl: ``KL(p̃_j ‖ q̃_j)`` in nats on ``U_j`` (τ = ``tau``).
        tv: ``½ Σ_{U_j} |p̃_j − q̃_j|`` (equals ``1 − alpha``).
        alpha: ``α_j = Σ_{U_j} min(p̃_j, q̃_j)``.
        lam: ``λ_j = exp(−η α_j)``, detached (stop-gradient).
        ce: ``ℓ_j`` of Eq. 7 (0 where the target is outside ``U_j``).
        ce_valid: 1.0 where the CE target lies in ``U_j``, else 0.0 (Eq. 8 denominator).
    """

    kl: torch.Tensor
    tv: torch.Tensor
    alpha: torch.Tensor
    lam: torch.Tensor
    ce: torch.Tensor
    ce_valid: torch.Tensor

    @property
    def lk_hybrid(self) -> torch.Tensor:
        """``L^LK_j = λ_j KL + (1 − λ_j) TV`` (NLD Eq. 6), ``(batch, k)``."""
        return self.lam * self.kl + (1.0 - self.lam) * self.tv


def union_topk_support(p: torch.Tensor, q: torch.Tensor, top_k: int) -> torch.Tensor:
    """``U_j = top-K(p_j) ∪ top-K(q_j)`` as a bool mask ``(batch, k, vocab)`` (NLD §3.3).

    Args:
        p, q: ``(batch, k, vocab)`` probabilities (or logits: only the order matters).
        top_k: ``K``; ``K ≥ vocab`` keeps the whole vocabulary.

    Raises ``ValueError`` if ``top_k < 1``.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    vocab = p.shape[-1]
    if top_k >= vocab:
        return torch.ones_like(p, dtype=torch.bool)
    support = torch.zeros_like(p, dtype=torch.bool)
    support.scatter_(-1, p.topk(top_k, dim=-1).indices, True)
    support.scatter_(-1, q.topk(top_k, dim=-1).indices, True)
    return support


def restricted_log_softmax(logits: torch.Tensor, support: torch.Tensor, tau: float) -> torch.Tensor:
    """``log softmax(logits / τ)`` renormalised on ``support`` (``-inf`` outside), ``(batch, k, vocab)``.

    Equals ``log(p̃)`` where ``p̃`` is ``softmax(logits / τ)`` zeroed outside ``support`` and renormalised.
    """
    z = (logits.float() / tau).masked_fill(~support, float("-inf"))
    return torch.log_softmax(z, dim=-1)


def position_terms(draft_logits: torch.Tensor, verifier_logits: torch.Tensor, *, tau: float = 3.0,
                   top_k: int = 200, eta: float = 0.5, ce_tau: float = 1.0,
                   targets: torch.Tensor | None = None) -> PositionTerms:
    """All per-position terms of NLD Eq. 6–7 for one batch of draft blocks.

    Args:
        draft_logits: ``(batch, k, vocab)`` drafter logits ``z^d`` (gradient flows through them).
        verifier_logits: ``(batch, k, vocab)`` verifier logits ``z^t`` on the same context (detached here).
        tau: distribution-matching temperature τ (paper: 3.0).
        top_k: ``K`` of the union support (paper: 200).
        eta: ``η`` of ``λ_j = exp(−η sg[α_j])`` (paper: 0.5).
        ce_tau: temperature of the restricted drafter softmax in the CE term (paper: 1.0).
        targets: optional ``(batch, k)`` CE targets; default ``y_j = argmax z^t_j``.

    Returns :class:`PositionTerms`.

    Raises ``ValueError`` on shape mismatch or non-positive temperatures.
    """
    if draft_logits.dim() != 3 or draft_logits.shape != verifier_logits.shape:
        raise ValueError(f"draft and verifier logits must both be (batch, k, vocab); got "
                         f"{tuple(draft_logits.shape)} and {tuple(verifier_logits.shape)}")
    if tau <= 0 or ce_tau <= 0:
        raise ValueError(f"temperatures must be positive, got tau={tau}, ce_tau={ce_tau}")
    zt = verifier_logits.detach().float()
    zd = draft_logits.float()
    support = union_topk_support(zt, zd.detach(), top_k)
    log_p = restricted_log_softmax(zt, support, tau)
    log_q = restricted_log_softmax(zd, support, tau)
    p, q = log_p.exp(), log_q.exp()                                   # exactly 0 outside U_j
    # 0 · log 0 = 0 (Eq. 6): a token the verifier rules out (logit −inf, e.g. a hidden mask column) adds nothing
    kl = (p * torch.where(support & (p > 0), log_p - log_q, torch.zeros_like(p))).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    alpha = torch.minimum(p, q).sum(-1)
    lam = torch.exp(-eta * alpha.detach())
    y = zt.argmax(-1) if targets is None else targets.long()
    in_support = support.gather(-1, y[..., None]).squeeze(-1)
    log_q_ce = restricted_log_softmax(zd, support, ce_tau)
    picked = log_q_ce.gather(-1, y[..., None]).squeeze(-1)
    ce = torch.where(in_support, -picked, torch.zeros_like(picked))
    return PositionTerms(kl=kl, tv=tv, alpha=alpha, lam=lam, ce=ce, ce_valid=in_support.float())


def active_mask(draft: torch.Tensor, verifier_logits: torch.Tensor) -> torch.Tensor:
    """Active set ``A`` = accepted prefix + first rejected position (NLD §3.3, Fig. 11).

    ``j*`` is the first position with ``draft_j ≠ argmax verifier_j``; ``A = {1..j*}`` if there is a
    rejection, all ``k`` positions otherwise. Uses the shared greedy acceptance rule.

    Args:
        draft: ``(batch, k)`` draft token ids.
        verifier_logits: ``(batch, k, vocab)`` or ``(batch, k + 1, vocab)`` verifier logits; row ``j``
            predicts draft slot ``j`` (a ``k + 1``-th bonus row is ignored).

    Returns ``(batch, k)`` bool.
    """
    k = draft.shape[1]
    v = verifier_logits.detach()
    if v.shape[1] == k:                              # greedy_accept wants the bonus row; it never matters here
        v = torch.cat([v, v[:, -1:]], dim=1)
    accepted = greedy_accept(draft, v).accepted      # (batch,) 0..k
    return torch.arange(k, device=draft.device)[None, :] <= accepted[:, None]


def block_mean(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Masked mean per draft block, then the mean over blocks with a non-zero weight (NLD Eq. 8).

    Args:
        values: ``(batch, k)`` per-position values.
        weight: ``(batch, k)`` bool or 0/1 weights (the active set, or active ∧ CE-valid).

    Returns a scalar; 0 (still attached to the graph) when no block has any weight.
    """
    w = weight.to(values.dtype)
    per_block = w.sum(-1)
    has = per_block > 0
    if not bool(has.any()):
        return (values * w).sum()
    return ((values * w).sum(-1)[has] / per_block[has]).mean()


def _check_hparams(hp: dict) -> None:
    unknown = set(hp) - set(HPARAMS)
    if unknown:
        raise ValueError(f"unknown loss hyper-parameters {sorted(unknown)}; valid: {', '.join(HPARAMS)}")


def combine(name: str, terms: PositionTerms, active: torch.Tensor, lambda_kl: float = 1.0,
            lambda_ce: float = 1.0) -> torch.Tensor:
    """Loss variant ``name`` from precomputed :class:`PositionTerms` ``(batch, k)`` and the active mask
    ``(batch, k)`` bool (one set of terms serves the loss and the logged diagnostics).

    * ``kl``: masked mean of ``KL(p̃‖q̃)``; ``tv``: of ``TV = 1 − α``; ``lk_alpha``: of ``−log α`` (α ≥ 1e-6);
    * ``lk_hybrid``: ``L_LK`` (Eq. 8 left, Eq. 6 per position);
    * ``ce``: ``L_CE`` (Eq. 8 right: positions with the target outside ``U_j`` leave the denominator);
    * ``lk_hybrid_ce``: ``λ_KL L_LK + λ_CE L_CE`` (Eq. 9).

    Raises ``ValueError`` listing the valid names for an unknown ``name``.
    """
    check_loss_name(name)
    if name == "kl":
        return block_mean(terms.kl, active)
    if name == "tv":
        return block_mean(terms.tv, active)
    if name == "lk_alpha":
        return block_mean(-torch.log(terms.alpha.clamp_min(1e-6)), active)
    l_ce = block_mean(terms.ce, active & (terms.ce_valid > 0))
    if name == "ce":
        return l_ce
    l_lk = block_mean(terms.lk_hybrid, active)
    if name == "lk_hybrid":
        return l_lk
    return lambda_kl * l_lk + lambda_ce * l_ce


def _variant(name: str, doc: str):
    def loss(draft_logits: torch.Tensor, verifier_logits: torch.Tensor, active: torch.Tensor, **hp) -> torch.Tensor:
        _check_hparams(hp)
        weights = {k: hp.pop(k) for k in ("lambda_kl", "lambda_ce") if k in hp}
        return combine(name, position_terms(draft_logits, verifier_logits, **hp), active, **weights)

    loss.__name__ = f"{name}_loss"
    loss.__doc__ = (f"{doc}\n\n    Args: ``draft_logits`` ``(batch, k, vocab)``, ``verifier_logits`` ``(batch, k, vocab)``, "
                    "``active`` ``(batch, k)`` bool, hyper-parameters of :func:`position_terms` and "
                    "``lambda_kl`` / ``lambda_ce``. Returns a scalar (nats for KL/CE terms).")
    return loss


LossFn = Callable[..., torch.Tensor]

#: Loss variants: name → ``loss(draft_logits (batch,k,vocab), verifier_logits (batch,k,vocab), active (batch,k)
#: bool, **hparams) -> scalar``. ``lk_hybrid_ce`` is the paper's (NLD Eq. 9) and the default.
LOSSES: dict[str, LossFn] = {
    "kl": _variant("kl", "Masked mean of KL(p̃_j ‖ q̃_j) on the union support (forward-KL ablation)."),
    "tv": _variant("tv", "Masked mean of TV_j = 1 − α_j (TV-only ablation)."),
    "ce": _variant("ce", "L_CE of NLD Eq. 8 (CE-only ablation)."),
    "lk_alpha": _variant("lk_alpha", "Masked mean of −log α_j (the LK paper's acceptance-likelihood loss)."),
    "lk_hybrid": _variant("lk_hybrid", "L_LK of NLD Eq. 8 with the per-position LK-hybrid term of Eq. 6."),
    "lk_hybrid_ce": _variant("lk_hybrid_ce", "NLD Eq. 9: λ_KL · L_LK + λ_CE · L_CE (the paper's loss, default)."),
}
DEFAULT_LOSS = "lk_hybrid_ce"
#: Hyper-parameters every variant accepts (defaults: NLD §3.3).
HPARAMS = ("tau", "top_k", "eta", "ce_tau", "targets", "lambda_kl", "lambda_ce")


def check_loss_name(name: str) -> str:
    """Return ``name`` if it is a registered variant; raise ``ValueError`` listing the valid names."""
    if name not in LOSSES:
        raise ValueError(f"unknown drafter loss {name!r}; valid: {', '.join(LOSSES)}")
    return name


def get_loss(name: str) -> LossFn:
    """The loss function registered as ``name`` (see :data:`LOSSES`); ``ValueError`` lists the valid names."""
    return LOSSES[check_loss_name(name)]


def expected_accepted(alpha: torch.Tensor) -> torch.Tensor:
    """Expected accepted draft length ``E[a] = Σ_{j=1..k} Π_{i≤j} α_i`` per block, ``(batch, k) -> (batch,)``.

    Exact for the speculative-sampling rule when the per-position acceptance probabilities ``α_i`` do
    not depend on which tokens were accepted before (they are computed on one fixed draft context).
    """
    return torch.cumprod(alpha, dim=-1).sum(-1)


__all__ = ["PositionTerms", "position_terms", "union_topk_support", "restricted_log_softmax", "active_mask",
           "block_mean", "combine", "LOSSES", "DEFAULT_LOSS", "HPARAMS", "get_loss", "check_loss_name",
           "expected_accepted"]
