"""Metrics, tolerances, poisoning and covering sets: the properties the verdicts rest on."""
import numpy as np
import pytest

from conformance.compare import EXACT, Tolerance, compare, verdict
from conformance.covering import pairwise, uncovered_pairs
from conformance.poison import poisoned

TOL = Tolerance(1e-3, 1e-2, "test")


def test_identical_arrays_pass_with_zero_error():
    x = np.linspace(-1, 1, 50, dtype=np.float32)
    c = compare("x", x, x, EXACT)
    assert c.passed and c.metrics["max_abs"] == 0 and c.metrics["cosine"] == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_never_passes_even_with_huge_tolerance(bad):
    x = np.ones(10)
    y = x.copy()
    y[3] = bad
    assert not compare("x", y, x, Tolerance(1e30, 1e30, "huge")).passed


def test_an_unwritten_poisoned_output_fails():
    out = poisoned((4, 4), np.float32)
    assert not compare("o", out, np.zeros((4, 4)), TOL).passed
    ints = poisoned((8,), np.uint8)
    assert not compare("cache", ints, np.zeros(8, np.uint8), EXACT).passed


def test_one_element_beyond_tolerance_fails_and_margin_reports_it():
    e = np.ones(100)
    a = e.copy()
    a[7] += 0.05  # allowed 1e-3 + 1e-2 = 0.011
    c = compare("x", a, e, TOL)
    assert not c.passed and c.metrics["mismatch"] == pytest.approx(0.01)
    assert c.metrics["margin"] == pytest.approx(0.05 / 0.011)
    assert compare("x", a, e, Tolerance(1e-3, 1e-2, "t", max_mismatch=0.01)).passed


def test_rel_l2_and_cosine_are_reported():
    e = np.array([3.0, 4.0])
    c = compare("x", np.array([3.0, 4.5]), e, Tolerance(1.0, 0.0, "t", rel_l2=0.05))
    assert c.metrics["rel_l2"] == pytest.approx(0.1) and not c.passed


def test_shape_mismatch_fails():
    assert not compare("x", np.zeros(3), np.zeros(4), TOL).passed


def test_verdict_lists_failing_outputs():
    v = verdict([compare("a", np.ones(2), np.ones(2), TOL), compare("b", np.zeros(2), np.ones(2), TOL)])
    assert v.status == "fail" and v.reason.startswith("b:") and v.worst().name == "b"


def test_pairwise_covers_every_pair_and_respects_constraints():
    axes = {"op": ["a", "b", "c"], "dtype": ["f32", "bf16", "f16"], "n": [1, 2, 3, 4], "g": [1, 2]}
    rows = pairwise(axes)
    assert uncovered_pairs(rows, axes) == []
    assert len(rows) < 3 * 3 * 4 * 2
    no_c16 = pairwise(axes, valid=lambda p: not (p.get("op") == "c" and p.get("dtype") == "f16"))
    assert all(not (r["op"] == "c" and r["dtype"] == "f16") for r in no_c16)
    assert uncovered_pairs(no_c16, axes) == [(("op", "c"), ("dtype", "f16"))]
    assert pairwise(axes) == rows  # deterministic
