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


def test_margin_covers_rel_l2_and_names_it():
    """A failure on rel_l2 alone (every element inside) has margin rel_l2 / bound, above 1."""
    e = np.linspace(1.0, 2.0, 100)
    a = e * (1 + 1e-3)  # elementwise 1e-3 * |e| / (0 + 1e-2 * |e|) = 0.1; rel_l2 1e-3
    fail = compare("state", a, e, Tolerance(0.0, 1e-2, "t", rel_l2=8e-4))
    assert not fail.passed and fail.metrics["criterion"] == "rel_l2"
    assert fail.metrics["margin"] == pytest.approx(1e-3 / 8e-4) and fail.metrics["elementwise"] == pytest.approx(0.1)
    close = compare("state", a, e, Tolerance(0.0, 1e-2, "t", rel_l2=1.25e-3))
    assert close.passed and close.metrics["margin"] == pytest.approx(0.8) and close.metrics["criterion"] == "rel_l2"


def test_margin_covers_the_mismatch_fraction():
    e = np.ones(100)
    a = e.copy()
    a[:3] += 1.0  # 3% of the elements far outside
    tol = Tolerance(1e-3, 0.0, "t", max_mismatch=0.02)
    c = compare("x", a, e, tol)
    assert not c.passed and c.metrics["criterion"] == "mismatch" and c.metrics["margin"] == pytest.approx(1.5)
    ok = compare("x", a, e, Tolerance(1e-3, 0.0, "t", max_mismatch=0.04))
    assert ok.passed and ok.metrics["margin"] == pytest.approx(0.75) and ok.metrics["elementwise"] > 100


def test_refusals_without_metrics_have_infinite_margin():
    from conformance.compare import Comparison, dtype_refused

    assert compare("x", np.zeros(3), np.zeros(4), TOL).metrics["margin"] == np.inf
    assert dtype_refused("o", np.zeros(2, np.int8), ("float32",)).metrics["margin"] == np.inf
    assert Comparison("c", False, "layout refused", {"max_abs": 1.0}, EXACT).metrics["margin"] == np.inf
    assert compare("x", np.array([np.nan, 1.0]), np.ones(2), TOL).metrics["criterion"] == "nonfinite"


@pytest.mark.parametrize("seed", range(40))
def test_a_comparison_passes_exactly_when_its_margin_is_at_most_one(seed):
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(64)
    a = e + rng.standard_normal(64) * 10.0 ** rng.uniform(-4, -1)
    tol = Tolerance(10.0 ** rng.uniform(-4, -1), 10.0 ** rng.uniform(-4, -1), "t",
                    max_mismatch=float(rng.choice([0.0, 0.05, 0.2])),
                    rel_l2=None if seed % 3 == 0 else 10.0 ** rng.uniform(-4, -1))
    c = compare("x", a, e, tol)
    assert c.passed == (c.metrics["margin"] <= 1), c.metrics
    assert c.metrics["criterion"] in ("elementwise", "mismatch", "rel_l2")


def test_a_record_names_the_output_and_criterion_that_decided_it():
    from conformance import families
    from conformance.run.inprocess import run_one

    cell = next(c for c in families.get("gdn").cells("smoke") if c.op == "chunked")
    rec = run_one(cell, "numpy-ref")
    assert rec["status"] == "pass" and rec["decided_by"]["output"] in rec["outputs"]
    deciding = rec["outputs"][rec["decided_by"]["output"]]
    assert rec["decided_by"]["criterion"] == deciding["criterion"] == rec["metrics"]["criterion"]
    assert rec["metrics"]["margin"] == max(o["margin"] for o in rec["outputs"].values()) <= 1
