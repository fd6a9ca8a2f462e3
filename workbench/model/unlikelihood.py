"""Sequence-level unlikelihood loss against repetition (Welleck et al., 2020, "Neural Text Generation
with Unlikelihood Training", ICLR; the sequence-level objective).

Greedy decoding of a small LM loops ("the fd of the fd of the fd ..."). Sequence-level unlikelihood
fine-tuning decodes continuations with the model itself, marks every token that belongs to a repeated
n-gram of the continuation, and pushes down the probability the model gave to exactly that token:

    L_UL = - Σ_t Σ_{c ∈ C_t} log(1 - p_θ(c | context)),   C_t = {x_t} if x_t lies in a repeated n-gram, else ∅

normalised by the number of continuation tokens (as in the authors' fairseq code). Welleck et al.
alternate it with ordinary maximum-likelihood updates; :mod:`workbench.train.lm` does the same with the
joint NLD objective. Both helpers are pure functions.
"""
from __future__ import annotations

import torch


def repeated_ngram_starts(tokens, n: int) -> list[bool]:
    """For each start ``i`` of an ``n``-gram of ``tokens`` (a sequence of ids), whether ``tokens[i:i + n]``
    already occurred at an earlier start of the same sequence (earlier occurrences may overlap it)."""
    seen, out = set(), []
    for i in range(len(tokens) - n + 1):
        g = tuple(tokens[i:i + n])
        out.append(g in seen)
        seen.add(g)
    return out


def repeated_ngram_mask(tokens: torch.Tensor, n: int, skip_ids: frozenset[int] = frozenset()) -> torch.Tensor:
    """Positions of ``tokens`` that belong to an ``n``-gram already seen earlier in the same row.

    Args:
        tokens: ``(N, G)`` token ids of generated continuations.
        n: n-gram length in tokens (≥ 1). Repeats are found as in
            :func:`workbench.evaluation.metrics.repetition_rate` (earlier occurrences may overlap).
        skip_ids: token ids never marked (for source code: whitespace, so that indentation, which
            repeats in every real file, is not penalised; the words of a looping line still are).

    Returns ``(N, G)`` bool: True at every position covered by an n-gram that occurred before
    (the first occurrence is not marked), except positions holding a ``skip_ids`` token.

    Raises ``ValueError`` for ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"n-gram length must be ≥ 1, got {n}")
    out = torch.zeros(tokens.shape, dtype=torch.bool)
    for row, seq in enumerate(tokens.tolist()):
        for i, repeated in enumerate(repeated_ngram_starts(seq, n)):
            if repeated:
                out[row, i:i + n] = True
    if skip_ids:
        out &= ~torch.isin(tokens.cpu(), torch.tensor(sorted(skip_ids), dtype=tokens.dtype))
    return out.to(tokens.device)


def unlikelihood_loss(logits: torch.Tensor, targets: torch.Tensor, candidates: torch.Tensor,
                      valid: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """Sequence-level unlikelihood of the candidate tokens (Welleck et al. 2020), in nats per valid token.

    Args:
        logits: ``(N, L, V)`` logits aligned with ``targets`` (position ``i`` scores ``targets[:, i]``;
            shift AR logits by one before calling).
        targets: ``(N, L)`` the token whose probability is pushed down where ``candidates`` is True.
        candidates: ``(N, L)`` bool, the penalised positions (a subset of ``valid``).
        valid: ``(N, L)`` bool, the positions the loss is averaged over (the continuation tokens).
        eps: floor of ``1 - p`` (keeps the loss finite when ``p`` → 1).

    Returns ``Σ_{candidates} -log(max(1 - p, eps)) / Σ valid`` (0 when nothing is valid).
    """
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    one_minus_p = (-torch.expm1(logp)).clamp_min(eps)  # 1 - p, accurate for small p
    tok = -torch.log(one_minus_p) * (candidates & valid).to(logp.dtype)
    return tok.sum() / valid.sum().clamp_min(1).to(logp.dtype)
