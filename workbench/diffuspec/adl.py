"""Draft-length controllers of DiffuSpec: ADL (arXiv:2510.02358 §4.3, Eq. 8–10) and a fixed length.

ADL keeps exponential moving averages of the EOS-aware generated length L^gen (Eq. 8, from the raw drafter
argmax before CPS) and of the accepted length L^acc (draft tokens the verifier accepted, the bonus token not
counted), with smoothing ρ (Eq. 9), and sets the next draft length (Eq. 10):

    k̂ = ⌈ L̃^gen + δ · 1{L̃^acc ≥ L̃^gen} ⌉,    k = clip(k̂, k_min, k_max).

Algorithm 1 starts from L̃ = 0 and k₁ = k_max.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def check_lengths(k_min: int, k_max: int) -> None:
    """Raise ``ValueError`` (one line) unless 1 ≤ k_min ≤ k_max."""
    if k_min < 1 or k_max < 1:
        raise ValueError(f"draft lengths must be >= 1, got k_min={k_min}, k_max={k_max}")
    if k_min > k_max:
        raise ValueError(f"k_min ({k_min}) must not exceed k_max ({k_max})")


@dataclass
class ADLController:
    """Adaptive draft length (Eq. 8–10).

    Args:
        k_min, k_max: guardrails in tokens (1 ≤ k_min ≤ k_max).
        delta: growth increment δ > 0 in tokens.
        rho: EMA smoothing ρ in (0, 1].

    Raises ``ValueError`` for bad bounds, δ ≤ 0 or ρ outside (0, 1].
    """

    k_min: int = 20
    k_max: int = 30
    delta: float = 10.0
    rho: float = 0.5
    gen_ema: float = 0.0
    acc_ema: float = 0.0
    k: int = field(init=False)

    def __post_init__(self):
        check_lengths(self.k_min, self.k_max)
        if self.delta <= 0:
            raise ValueError(f"ADL increment delta must be > 0, got {self.delta}")
        if not 0 < self.rho <= 1:
            raise ValueError(f"ADL smoothing rho must be in (0, 1], got {self.rho}")
        self.k = self.k_max

    def update(self, gen_len: int, accepted: int) -> int:
        """Feed one step's L^gen and L^acc (tokens); returns (and stores) the next draft length k."""
        self.gen_ema = (1 - self.rho) * self.gen_ema + self.rho * gen_len
        self.acc_ema = (1 - self.rho) * self.acc_ema + self.rho * accepted
        k_hat = math.ceil(self.gen_ema + self.delta * (self.acc_ema >= self.gen_ema))
        self.k = min(max(k_hat, self.k_min), self.k_max)
        return self.k


@dataclass
class FixedLength:
    """A fixed draft length k (the no-ADL ablation of DiffuSpec Table 2). Raises ``ValueError`` for k < 1."""

    k: int = 8

    def __post_init__(self):
        check_lengths(self.k, self.k)

    def update(self, gen_len: int, accepted: int) -> int:
        """Ignores the feedback; returns k."""
        return self.k
