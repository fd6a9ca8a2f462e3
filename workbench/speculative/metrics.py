"""Metrics of draft-then-verify decoding, shared by self-speculation (NLD §3.3, App. C) and DEER.

Definitions (one *cycle* = one draft + one verification; a cycle emits ``accepted + 1`` tokens, the
``committed_per_step`` entries of a :class:`~workbench.decoding.base.DecodeResult`):

* acceptance length ``τ`` = mean tokens emitted per cycle (accepted + 1, as in DEER / EAGLE);
* max accepted draft length = ``max(emitted) − 1``;
* share of cycles accepting ≥ ``n`` draft tokens (``n = 8`` in DEER's long-draft analysis);
* TPF = tokens ÷ drafting forwards; real TPF = tokens ÷ (drafting + verification forwards), the
  prefill excluded.

The last cycle of a row is truncated at the generation length, so its count may be smaller than the
cycle's real acceptance. Every function here is pure.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from ..decoding.base import DecodeResult


def acceptance_length(emitted: Sequence[int]) -> float:
    """τ: mean tokens emitted per cycle; NaN without cycles."""
    return sum(emitted) / len(emitted) if len(emitted) else math.nan


def max_accepted(emitted: Sequence[int]) -> int:
    """Longest accepted draft (emitted − 1) over the cycles; 0 without cycles."""
    return max(emitted) - 1 if len(emitted) else 0


def cycles_accepting(emitted: Sequence[int], at_least: int = 8) -> int:
    """Number of cycles that accepted ≥ ``at_least`` draft tokens (emitted ≥ ``at_least + 1``)."""
    return sum(1 for e in emitted if e - 1 >= at_least)


def share_accepting(emitted: Sequence[int], at_least: int = 8) -> float:
    """Share of cycles that accepted ≥ ``at_least`` draft tokens; NaN without cycles."""
    return cycles_accepting(emitted, at_least) / len(emitted) if len(emitted) else math.nan


def tpf(tokens: int, forwards: int) -> float:
    """Tokens per drafting forward; NaN for zero forwards."""
    return tokens / forwards if forwards else math.nan


def real_tpf(tokens: int, forwards: int, extra_forwards: int) -> float:
    """Tokens per forward counting drafting and verification forwards; NaN for zero forwards."""
    total = forwards + extra_forwards
    return tokens / total if total else math.nan


def row_metrics(res: DecodeResult, row: int, at_least: int = 8) -> dict:
    """All speculation metrics of one row of ``res``: ``tokens``, ``cycles``, ``tau``, ``max_accepted``,
    ``cycles_accept_ge{n}``, ``share_accept_ge{n}``, ``tpf``, ``tpf_real``."""
    emitted = res.committed_per_step[row]
    tokens = len(res.tokens[row])
    return {"tokens": tokens, "cycles": len(emitted), "tau": acceptance_length(emitted),
            "max_accepted": max_accepted(emitted), f"cycles_accept_ge{at_least}": cycles_accepting(emitted, at_least),
            f"share_accept_ge{at_least}": share_accepting(emitted, at_least),
            "tpf": tpf(tokens, res.forwards[row]), "tpf_real": real_tpf(tokens, res.forwards[row], res.extra_forwards[row])}


def pooled_metrics(res: DecodeResult, at_least: int = 8) -> dict:
    """Metrics over all rows pooled (ratios of sums: τ = Σ tokens emitted ÷ Σ cycles, and so on)."""
    emitted = [e for row in res.committed_per_step for e in row]
    tokens = sum(len(t) for t in res.tokens)
    fw, extra = sum(res.forwards), sum(res.extra_forwards)
    return {"tokens": tokens, "cycles": len(emitted), "tau": acceptance_length(emitted),
            "max_accepted": max_accepted(emitted), f"cycles_accept_ge{at_least}": cycles_accepting(emitted, at_least),
            f"share_accept_ge{at_least}": share_accepting(emitted, at_least),
            "tpf": tpf(tokens, fw), "tpf_real": real_tpf(tokens, fw, extra)}
