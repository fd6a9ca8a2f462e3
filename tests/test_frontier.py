"""Frontier maths on hand-made points."""
import math

import pandas as pd
import pytest

from workbench.evaluation.frontier import (accuracy_at_tpf, area_under_front, common_tpf_range, compare_frontiers,
                                           pareto_front, tpf_at_accuracy)


def _pts(pairs):
    return pd.DataFrame([{"tpf": t, "accuracy": a, "threshold": i / 10} for i, (t, a) in enumerate(pairs)])


def test_pareto_front_drops_dominated_points():
    f = pareto_front(_pts([(1.0, 1.0), (2.0, 0.9), (1.5, 0.8), (3.0, 0.5), (2.5, 0.4)]))
    assert list(zip(f["tpf"], f["accuracy"])) == [(1.0, 1.0), (2.0, 0.9), (3.0, 0.5)]


def test_interpolation_and_area():
    f = pareto_front(_pts([(1.0, 1.0), (3.0, 0.6)]))
    assert tpf_at_accuracy(f, 0.8) == pytest.approx(2.0)
    assert accuracy_at_tpf(f, 2.0) == pytest.approx(0.8)
    assert math.isnan(tpf_at_accuracy(f, 0.5)) and math.isnan(accuracy_at_tpf(f, 3.5))
    # mean accuracy over [1, 3] of a line from 1.0 to 0.6 = 0.8; over [1, 5] the part past 3 counts 0
    assert area_under_front(f, 1.0, 3.0) == pytest.approx(0.8, abs=1e-3)
    assert area_under_front(f, 1.0, 5.0) == pytest.approx(0.4, abs=0.01)


def test_compare_frontiers_ratio():
    conf = _pts([(1.0, 1.0), (2.0, 0.8)])
    samp = _pts([(1.0, 1.0), (3.0, 0.8)])  # same accuracies at 1.5x the TPF
    c = compare_frontiers(conf, samp)
    r = {round(m["accuracy"], 3): m["tpf_ratio"] for m in c["matched_accuracy"]}
    assert r[0.8] == pytest.approx(1.5) and r[1.0] == pytest.approx(1.0)
    assert c["area_sampler"] > c["area_confidence"]


def test_area_is_exact_and_does_not_depend_on_a_grid():
    # front (1, 1.0) -> (2, 0.5) -> (3, 0.5): mean over [1, 4] = (0.75 + 0.5 + 0) / 3 exactly
    f = pd.DataFrame({"tpf": [1.0, 2.0, 3.0], "accuracy": [1.0, 0.5, 0.5]})
    assert area_under_front(f, 1.0, 4.0) == pytest.approx(1.25 / 3, abs=1e-12)
    # adding a point that lies on the interpolated line changes nothing
    g = pd.DataFrame({"tpf": [1.0, 1.5, 2.0, 3.0], "accuracy": [1.0, 0.75, 0.5, 0.5]})
    assert area_under_front(g, 1.0, 4.0) == pytest.approx(area_under_front(f, 1.0, 4.0), abs=1e-12)
    assert area_under_front(f, 1.3, 2.7) == pytest.approx(((0.85 + 0.5) / 2 * 0.7 + 0.5 * 0.7) / 1.4, abs=1e-12)


def test_areas_compare_over_the_range_both_fronts_reach():
    """A front that adds one fast, inaccurate setting is not rewarded for it: over [1, 2], the range both reach,
    the two areas are equal (over [1, 3] the shorter front would score 0 past TPF 2)."""
    conf = _pts([(1.0, 1.0), (2.0, 0.8)])
    samp = _pts([(1.0, 1.0), (2.0, 0.8), (3.0, 0.05)])
    c = compare_frontiers(conf, samp)
    assert c["area_range"] == [1.0, 2.0]
    assert c["area_sampler"] == pytest.approx(c["area_confidence"]) == pytest.approx(0.9)
    # an empty front reaches no range, whichever side it is on
    assert math.isnan(common_tpf_range(conf, samp.iloc[:0])[1]) and math.isnan(common_tpf_range(samp.iloc[:0], conf)[1])
