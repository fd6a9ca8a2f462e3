"""Losses of the joint AR + block-diffusion objective as pure functions (NLD Eq. 1–5).

Token losses ``ℓ_{n,i}`` are averaged in one of two ways (NLD §2.1):

* ``"global"`` (Eq. 5, default): ``Σ_{n,i} ℓ_{n,i} / Σ_n L_n``, every contributing token in the batch
  weighs the same;
* ``"sequence"`` (Eq. 4): ``(1/N') Σ_n (Σ_i ℓ_{n,i} / L_n)`` over the ``N'`` sequences with at least one
  contributing token.

``L_n`` is the number of *loss-contributing* tokens of sequence ``n`` (valid next-token targets for
the AR term, masked positions for the diffusion term). With a literal constant ``L`` both equations
would coincide identically; the paper's point (§2.1) is that they differ because the number of noisy
tokens varies with ``t``, so ``L_n`` counts contributing tokens. A consequence for α (Eq. 3): with the 1/t
weight, the masked positions' Σ 1/t is about the number of positions, so the diffusion term here is about twice
what a literal ``N·L`` normaliser gives (the masked share averages 1/2 for t ~ U(0, 1)); α = 0.3 here weighs
diffusion as α ≈ 0.6 would in those units. (This holds for Eq. 5; with Eq. 4 and one t per sequence, each
sequence's term is its mean token loss times 1/t, so the scale is E[1/t] = ln(1/t_min) / (1 − t_min), about 6.9 at
t_min = 1e-3, with a heavy tail.)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

AVERAGING = ("global", "sequence")


def _average(token_loss: torch.Tensor, weight: torch.Tensor, averaging: str,
             total_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Average ``token_loss`` ``(N, L)`` over positions where ``weight`` ``(N, L)`` is True.

    ``total_weight`` ``(G, L)``: the weights of the whole global batch when these ``N`` rows are one shard of
    it (a DDP rank, an accumulation step). The normaliser (Eq. 5: ``Σ_n L_n``; Eq. 4: ``N'``) is then the
    global batch's, and the result is this shard's *share*: the shares of all shards sum to the global
    batch's average.
    """
    w = weight.to(token_loss.dtype)
    if averaging == "global":
        denom = w.sum() if total_weight is None else total_weight.sum().to(token_loss.dtype)
        return (token_loss * w).sum() / denom.clamp_min(1.0)
    if averaging == "sequence":
        per_seq = w.sum(dim=1)
        has = per_seq > 0
        seq_mean = (token_loss * w).sum(dim=1)[has] / per_seq[has]
        if total_weight is not None:
            return seq_mean.sum() / (total_weight.sum(dim=1) > 0).sum().clamp_min(1)
        return seq_mean.mean() if has.any() else token_loss.sum() * 0.0
    raise ValueError(f"unknown loss averaging {averaging!r}; valid: {', '.join(AVERAGING)}")


def ar_loss(logits: torch.Tensor, input_ids: torch.Tensor, valid: torch.Tensor | None = None,
            averaging: str = "global") -> torch.Tensor:
    """AR next-token loss (NLD Eq. 1) in nats per token.

    Args:
        logits: ``(N, L, V)`` AR logits; position ``i`` predicts token ``i + 1``.
        input_ids: ``(N, L)`` the clean sequence.
        valid: optional ``(N, L)`` bool, False at padding; the target at ``i + 1`` must be valid.
        averaging: ``"global"`` (Eq. 5) or ``"sequence"`` (Eq. 4).

    Returns a scalar tensor.
    """
    targets = input_ids[:, 1:]
    tok = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), reduction="none").view_as(targets)
    weight = torch.ones_like(targets, dtype=torch.bool) if valid is None else valid[:, 1:]
    return _average(tok, weight, averaging)


def diffusion_loss(logits: torch.Tensor, input_ids: torch.Tensor, masked: torch.Tensor, t: torch.Tensor,
                   averaging: str = "global", total_masked: torch.Tensor | None = None) -> torch.Tensor:
    """Block-diffusion loss (NLD Eq. 2): ``ℓ_{n,i} = -log p(x_i | x̃_t) / t`` on masked positions only.

    Args:
        logits: ``(N, L, V)`` diffusion logits of the noisy stream; position ``i`` predicts token ``i`` (no shift).
        input_ids: ``(N, L)`` the clean sequence (targets).
        masked: ``(N, L)`` bool, True where the noisy stream holds the mask token.
        t: ``(N, L)`` noise level of each position's block, in (0, 1].
        averaging: ``"global"`` (Eq. 5) or ``"sequence"`` (Eq. 4); contributing tokens = masked positions.
        total_masked: optional ``(G, L)`` bool, the masks of the whole global batch when these ``N`` rows are
            one shard of it (a DDP rank or an accumulation step): the result is then this shard's share of
            the global batch's loss, normalised by the global count of masked tokens (see ``_average``).

    Returns a scalar tensor (nats, 1/t-weighted).
    """
    tok = F.cross_entropy(logits.flatten(0, 1).float(), input_ids.flatten(), reduction="none").view_as(input_ids)
    return _average(tok / t, masked, averaging, total_masked)


def joint_loss(ar: torch.Tensor, diff: torch.Tensor, alpha: float) -> torch.Tensor:
    """NLD Eq. 3: ``L = L_AR + α · L_diff`` (α = 0.3 in stage 2, 0 in stage 1)."""
    return ar + alpha * diff


def idlm_loss(mask_logits: torch.Tensor, clean_logits: torch.Tensor, input_ids: torch.Tensor,
              valid: torch.Tensor | None = None, clean_scale: float | None = None,
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """I-DLM's auto-balanced loss (I-DLM §3.1, Eq. 1–2): ``L = L_mask + ŝ · L_clean``, ``ŝ = L_mask / L_clean``
    treated as a constant (detached, no gradient); or, with ``clean_scale``, the fixed scale App. H.1 uses in
    the first stride expansions ("a fixed low scale of 0.2 for the cross-entropy loss on clean tokens").

    Both halves are logit-shifted: position ``i`` of either stream predicts token ``i + 1`` (Eq. 1), so each
    term is :func:`ar_loss` of its logits (global averaging over the non-padding targets).

    Args:
        mask_logits: ``(N, L, V)`` logits of the all-[MASK] noisy half ``x_t``.
        clean_logits: ``(N, L, V)`` logits of the clean half ``x_0``. Under a gated LoRA the clean half is the
            frozen base: ``L_clean`` is then a constant with no gradient and only ``L_mask`` trains (with
            Eq. 2's ŝ the value is ``2 · L_mask``; the gradient is that of ``L_mask`` either way).
        input_ids: ``(N, L)`` the clean sequence (targets).
        valid: optional ``(N, L)`` bool, False at padding.
        clean_scale: ``None`` (Eq. 2's ŝ) or a fixed non-negative scale of ``L_clean``.

    Returns ``(loss, L_mask, L_clean)`` as scalar tensors (nats per token). Raises ``ValueError`` for a negative
    ``clean_scale``.
    """
    if clean_scale is not None and clean_scale < 0:
        raise ValueError(f"clean_scale must be ≥ 0 (or None for Eq. 2's auto-balance), got {clean_scale}")
    l_mask = ar_loss(mask_logits, input_ids, valid)
    l_clean = ar_loss(clean_logits, input_ids, valid)
    s_hat = (l_mask / l_clean.clamp_min(1e-8)).detach() if clean_scale is None else clean_scale
    return l_mask + s_hat * l_clean, l_mask, l_clean
