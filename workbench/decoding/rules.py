"""Commit rules of block-diffusion decoding: given the current block's probabilities, which masked
positions to commit this forward. Each rule is a pure function
``(probs (N, B, V), masked (N, B) bool) -> commit (N, B) bool`` that commits at least one masked
position in every row that still has one (the highest-confidence one), so decoding always progresses.
"""
from __future__ import annotations

import torch


def most_confident(conf: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """One-hot ``(N, B)`` bool of the masked position with the highest ``conf`` per row (none if no mask).
    ``conf`` is any score where higher is surer (a probability, a logit); ties go to the first position."""
    c = conf.masked_fill(~masked, float("-inf"))
    one = torch.zeros_like(masked)
    one.scatter_(1, c.argmax(dim=1, keepdim=True), True)
    return one & masked


def passed_or_fallback(passed: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """The threshold rules' commit: the positions that ``passed`` ``(..., B)`` bool, or, in a state (last axis)
    where none did, the one-hot ``fallback`` ``(..., B)`` (e.g. :func:`most_confident`). When the fallback ranks
    by the thresholded score itself (confidence), this equals ``passed | fallback``."""
    return torch.where(passed.any(dim=-1, keepdim=True), passed, fallback)


def confidence_rule(probs: torch.Tensor, masked: torch.Tensor, threshold: float) -> torch.Tensor:
    """Fast-dLLM confidence threshold (NLD §3.2): commit every masked position whose top-1 probability
    is ≥ ``threshold``, and at least the single most confident one."""
    conf = probs.max(dim=-1).values
    return ((conf >= threshold) & masked) | most_confident(conf, masked)


def serial_rule(probs: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Serial denoising (NLD §4.1, k = 1): commit only the masked position with the highest peak
    probability. Its output is the serial target."""
    return most_confident(probs.max(dim=-1).values, masked)


def hybrid_rule(probs: torch.Tensor, masked: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """Hybrid trajectory policy (NLD App. A): commit every masked position whose top-1 already equals
    the ground-truth token ``truth`` ``(N, B)``; in rows with no such position, commit the most
    confident masked position (confidence fallback, k = 1)."""
    top = probs.argmax(dim=-1)
    match = (top == truth) & masked
    fallback = most_confident(probs.max(dim=-1).values, masked)
    return torch.where(match.any(dim=1, keepdim=True), match, fallback)
