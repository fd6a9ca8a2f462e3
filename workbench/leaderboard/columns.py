"""The leaderboard's columns for one decoded row, against the AR-greedy and serial-target references.

Conventions (every ratio is total over total across prompts, so long outputs weigh more):

* ``tpf`` = committed tokens ÷ forwards of the target model: block diffusion counts its denoising forwards
  (the papers' convention; ``tpf_real`` adds the KV-commit forward), self-speculation its draft *and* verify
  forwards, a separate drafter's decoder (DEER) its verify forwards only. AR greedy = 1.
* ``tpf_real`` = tokens ÷ every forward of any model, unweighted.
* ``cost_tpf`` (cost-weighted TPF) = tokens ÷ Σ_forwards w, with w the FLOPs of a forward in units of a
  one-token target forward: ``w = (P_model / P_target) · q`` for a forward over ``q`` tokens (FLOPs ≈ 2·P per
  token; attention's ``4·layers·d·q·context`` term is left out, under 10 % at these lengths and the same for
  every decoder). AR greedy = 1; a decoder above 1 would need fewer FLOPs than AR.
* ``tau`` (acceptance length, speculative decoders) = tokens ÷ draft–verify cycles, **bonus token counted**
  (a cycle that accepts all k drafts emits k + 1).
* ``agree_ar`` = share of positions equal to AR greedy's output (same mode and segment length);
  ``prefix_ar`` = mean tokens before the first divergence; ``exact_ar`` = share of prompts whose whole output
  equals AR greedy's; ``lossless`` = ``exact_ar == 1``. ``agree_serial`` likewise against the serial target at
  the row's B.
* ``introspective_acceptance`` (I-DLM §2, added by :mod:`workbench.leaderboard.run`): α = mean over tokens of
  min(1, p_k(x_k) / q_k(x_k)), q the distribution the decoder drew or picked the token from (at T = 1 for greedy
  picks), p the target's causal AR distribution with every earlier token revealed.
"""
from __future__ import annotations

import math

from ..decoding.base import DecodeResult
from ..decoding.registry import DecoderSpec
from ..evaluation.metrics import agreement, repetition_rate, whitespace_share


def first_divergence(a: list[int], b: list[int]) -> int:
    """Tokens before ``a`` and ``b`` first differ (the shorter length if one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def target_forwards(spec: DecoderSpec, res: DecodeResult, row: int) -> int:
    """Forwards of the target model in row ``row`` (see :attr:`DecoderSpec.target_forwards`)."""
    if spec.target_forwards == "both":
        return res.forwards[row] + res.extra_forwards[row]
    if spec.target_forwards == "extra":
        return res.extra_forwards[row]
    return res.forwards[row]


def row_columns(spec: DecoderSpec, length: int | None, res: DecodeResult, ar: DecodeResult | None,
                serial: DecodeResult | None, whitespace: set[int], drafter_ratio: float = 0.0) -> dict:
    """The leaderboard columns of one decoded row (see the module docstring).

    Args:
        spec: the decoder. length: B or k of the row (None for AR in free-running mode).
        res: its result over the prompts. ar, serial: the references (same prompts and mode), or None.
        whitespace: whitespace token ids. drafter_ratio: drafter parameters ÷ target parameters.
    """
    n = len(res.tokens)
    tokens = sum(len(t) for t in res.tokens)
    w_f, w_e = spec.forward_cost(length, drafter_ratio)
    drafted = sum(res.drafter_forwards_of(i) for i in range(n))     # a separate drafter's forwards (SimSD)
    cost = sum(res.forwards[i] * w_f + res.extra_forwards[i] * w_e for i in range(n))
    cost += drafted * drafter_ratio * (length or 1)      # B tokens each at the drafter's share of the target's FLOPs
    cycles = sum(len(c) for c in res.committed_per_step)
    nan = math.nan

    def vs(ref: DecodeResult | None) -> tuple[float, float, float]:
        if ref is None:
            return nan, nan, nan
        agree = sum(agreement(a, b) * max(len(a), len(b)) for a, b in zip(res.tokens, ref.tokens)) / \
            max(1, sum(max(len(a), len(b)) for a, b in zip(res.tokens, ref.tokens)))
        prefix = sum(first_divergence(a, b) for a, b in zip(res.tokens, ref.tokens)) / n
        exact = sum(a == b for a, b in zip(res.tokens, ref.tokens)) / n
        return agree, prefix, exact

    agree_ar, prefix_ar, exact_ar = vs(ar)
    agree_serial, _, _ = vs(serial)
    flat = [t for row in res.tokens for t in row]
    return {
        "tokens": tokens / n,
        "tpf": tokens / max(1, sum(target_forwards(spec, res, i) for i in range(n))),
        "tpf_real": tokens / max(1, sum(res.forwards) + sum(res.extra_forwards) + drafted),
        "cost_tpf": tokens / cost if cost > 0 else nan,
        "tau": tokens / cycles if spec.family == "speculative" and cycles else nan,
        "tokens_per_s": tokens / max(res.wall_time, 1e-9),
        "agree_ar": agree_ar, "prefix_ar": prefix_ar, "exact_ar": exact_ar,
        "lossless": bool(exact_ar == 1.0) if ar is not None else False,
        "agree_serial": agree_serial,
        "repetition": sum(repetition_rate(t) for t in res.tokens if len(t) >= 8) / max(1, sum(len(t) >= 8 for t in res.tokens))
        if any(len(t) >= 8 for t in res.tokens) else nan,
        "ws_share": whitespace_share(flat, whitespace),
    }


__all__ = ["row_columns", "first_divergence", "target_forwards"]
