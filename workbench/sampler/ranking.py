"""How well a score ranks the masked positions of one block state for parallel commits (NLD §3.2, §4).

A commit rule that thresholds a score (the top-1 probability for confidence decoding, the sampler's probability
for the learned sampler) commits, at one denoising step, the masked positions ranked highest by that score. It
commits them without error only as far as the ranking's leading positions are all correct, where *correct* is the
sampler's label, ``1[top-1 == final id]`` (NLD App. A). ROC AUC pools every position of every state; these
per-state counts measure the part of the ranking a threshold acts on.
"""
from __future__ import annotations

import torch

from ..decoding.rules import most_confident, passed_or_fallback
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


def threshold_commits(scores: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor, thresholds,
                      fallback: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """What one global threshold on ``scores`` commits at every block state, and how many of those commits are
    wrong: the offline form of the sampler's and confidence's commit rule (NLD §3.2), on stored states.

    Unlike :func:`safe_prefix`, whose per-state count assumes the best threshold for each state, one threshold
    serves all states, so this also measures how comparable ``scores`` are *across* states (calibration). At each
    threshold τ a state commits its masked positions with ``score ≥ τ``, and, as the decoders do, when none passes,
    one: the masked position ranked first by ``fallback`` (default ``scores``; the sampler policy's default
    fallback is the top-1 probability, :mod:`workbench.sampler.policy`). The fallback adds nothing to a state where
    some position passes (for confidence, whose fallback is its own score, the two readings agree).

    Args:
        scores: ``(N, B)`` float, any monotone score (probability, logit).
        labels: ``(N, B)`` bool, ``1[top-1 == final id]``.
        masked: ``(N, B)`` bool, positions still masked in the state.
        thresholds: ``(T,)`` float sequence, in the units of ``scores``.
        fallback: ``(N, B)`` float or None, the score that picks the one forced commit.

    Returns:
        ``(commits, errors)``, each ``(T, N)`` int64 in tokens: committed positions, and those whose label is False.
        States with no masked position commit nothing.

    Raises:
        ValueError: when the shapes differ or are not 2-D.
    """
    fb = scores if fallback is None else fallback
    if scores.dim() != 2 or {scores.shape, labels.shape, masked.shape, fb.shape} != {scores.shape}:
        raise ValueError(f"scores, labels, masked and fallback must share one (N, B) shape, got "
                         f"{tuple(scores.shape)}, {tuple(labels.shape)}, {tuple(masked.shape)} and {tuple(fb.shape)}")
    m, wrong = masked.bool(), ~labels.bool()
    forced = most_confident(fb.float(), m)                                           # (N, B) one per live state
    tau = torch.as_tensor(thresholds, dtype=torch.float32).view(-1, 1, 1)            # (T, 1, 1)
    passed = (scores.float().unsqueeze(0) >= tau) & m                                # (T, N, B)
    commit = passed_or_fallback(passed, forced)                                      # forced broadcast over T
    return commit.sum(dim=2), (commit & wrong).sum(dim=2)


def commits_at_error_rate(commits: torch.Tensor, errors: torch.Tensor, levels,
                          weights: torch.Tensor | None = None) -> list[float | None]:
    """The upper frontier of a threshold sweep: at each per-token error rate in ``levels``, the most tokens a state
    commits on average at any threshold whose error rate (wrong commits ÷ commits, pooled over states) is at most
    that level. The offline counterpart of TPF at matched agreement (NLD Fig. 8).

    Args:
        commits, errors: ``(T, N)`` from :func:`threshold_commits`.
        levels: error rates in ``[0, 1]``.
        weights: ``(N,)`` non-negative state weights (a bootstrap resample's counts); None: every state once.
            An integer weight ``w`` gives the result of repeating that state ``w`` times.

    Returns:
        one mean (tokens per state) per level, or None where no threshold is that accurate.

    Raises:
        ValueError: on a level outside ``[0, 1]`` or mismatched shapes.
    """
    if commits.shape != errors.shape or commits.dim() != 2:
        raise ValueError(f"commits and errors must share one (T, N) shape, got {tuple(commits.shape)} and "
                         f"{tuple(errors.shape)}")
    w = torch.ones(commits.shape[1], dtype=torch.float64, device=commits.device) if weights is None \
        else weights.to(commits.device, torch.float64)
    if w.shape != commits.shape[1:] or bool((w < 0).any()):
        raise ValueError(f"weights must be ({commits.shape[1]},) and non-negative, got {tuple(w.shape)}")
    made = commits.double() @ w                                                      # (T,) weighted commits
    mean = made / w.sum().clamp(min=1e-12)                                           # (T,) tokens per state
    rate = (errors.double() @ w) / made.clamp(min=1e-12)                             # (T,)
    out = []
    for level in levels:
        if not 0.0 <= level <= 1.0:
            raise ValueError(f"error-rate level {level} is outside [0, 1]")
        ok = rate <= level
        out.append(float(mean[ok].max()) if ok.any() else None)
    return out
