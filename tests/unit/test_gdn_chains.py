"""gdn chains and adversarial generators: the driver calls the op once per decode step or recurrent call
with the pool carried; the named long-horizon and near-range cells catch the planted bugs made for them,
which most other cells do not; the state-chain term is what lets a long 16-bit chain pass."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

import reference.gdn.numpy_ref as numpy_ref
from conformance.cells import activation
from conformance.families import gdn
from conformance.families.gdn.matrix import CI_STEPS
from conformance.families.gdn.tolerances import STATE_CHAIN
from conformance.memo import Memo
from conformance.numerics import U32, bf16_round
from conformance.studies import gdn_drift
from conformance.testing import PLANTED, verdict_of


def _ci(*words):
    cells = [c for c in gdn.cells("ci") if all(w in c.id for w in words)]
    assert len(cells) == 1, (words, [c.id for c in cells])
    return cells[0]


READOUT_CELL = ("gdn/decode/", "state=float32", "act=float16", "v=near-max", "steps=")
READOUT_SPEC_CELL = ("spec_decode/", "state=float32", "act=float16", "v=near-max")   # a grown pool
LONG = f"steps={CI_STEPS}/"                   # the long decode chains (beside the short ones)
BETA_CELL = ("recurrent/", "state=float32", "act=float16", "calls=")


class _Counting:
    """numpy_ref with a count of calls per op."""

    def __init__(self):
        self.calls = {}

    def __getattr__(self, name):
        fn = getattr(numpy_ref, name)

        def counted(*args, **kw):
            self.calls[name] = self.calls.get(name, 0) + 1
            return fn(*args, **kw)
        return counted


def test_a_decode_chain_is_one_call_per_step_on_the_pool_the_last_call_left():
    cell = _ci("decode/", "state=bfloat16", LONG)
    x = gdn.make_inputs(cell)
    impl = _Counting()
    out = gdn.run_with(impl, cell, {**x, "state": x["state"].copy()})
    steps, N = cell["steps"], cell["N"]
    assert impl.calls == {"decode": steps} and out["o"].shape[0] == steps * N
    pool = x["state"].copy()
    for s in (0, 1, 2):                     # the first calls by hand, each on the pool the last one left
        rows = slice(s * N, (s + 1) * N)
        o = numpy_ref.decode(x["q"][rows], x["k"][rows], x["v"][rows], x["A_log"], x["a"][rows], x["b"][rows],
                             x["dt_bias"], pool, x["state_indices"], state_dtype="bfloat16")
        np.testing.assert_array_equal(out["o"][rows], o)


def test_a_recurrent_chain_of_calls_equals_one_call_when_every_token_is_stored():
    cell = _ci("recurrent/", "state=bfloat16", "calls=")
    x = gdn.make_inputs(cell)
    impl = _Counting()
    chain = gdn.run_with(impl, cell, {**x, "state": x["state"].copy()})
    assert impl.calls == {"recurrent": cell["calls"]}
    whole = gdn.run_with(numpy_ref, cell, {**x, "state": x["state"].copy(), "calls": 1})
    np.testing.assert_array_equal(chain["o"], whole["o"])          # interval 1: a call's end changes nothing
    np.testing.assert_array_equal(chain["state"], whole["state"])


def test_the_adversarial_generators_make_what_they_say():
    k = gdn.make_inputs(_ci("recurrent/", "keys=near-duplicate"))["k"].astype(np.float64)
    unit = k / np.linalg.norm(k, axis=-1, keepdims=True)
    assert np.min(np.einsum("thk,hk->th", unit, unit[0])) > 0.999          # every key of a head ~ the first
    beta = gdn.make_inputs(_ci("recurrent/", "beta=edges"))["beta"].astype(np.float64)
    assert set(np.unique(beta)) == {0.0, 1.0}
    x = gdn.make_inputs(_ci("gdn/decode/", "v=near-max"))
    assert 3e4 < np.max(np.abs(x["v"].astype(np.float64))) <= 6e4 and x["v"].dtype == np.float16
    g = gdn.make_inputs(_ci("recurrent/", "decay=extreme"))["g"]
    assert np.max(g) <= -20 and np.min(g) >= -1e4
    decay = np.exp(gdn.make_inputs(_ci("recurrent/", "state=bfloat16", "calls="))["g"].astype(np.float64))
    assert np.all((decay > 0.9998) & (decay < 1.0))
    assert np.all(bf16_round(decay) == 1.0)                                # bfloat16 cannot hold the decay


@pytest.mark.parametrize("words", [READOUT_CELL, READOUT_SPEC_CELL], ids=["decode-chain", "spec-decode-grown-pool"])
def test_fp16_readout_overflow_is_caught_by_each_near_range_cell(words):
    bug = PLANTED["gdn.fp16-readout-overflow"]
    named = _ci(*words)
    memo = Memo()
    found = verdict_of(bug.plant(numpy_ref), named, "exact", memo)
    assert found.status == "fail" and "NaN/Inf" in found.reason, found.reason
    assert verdict_of(numpy_ref, named, "exact", memo).status == "pass"


def test_fp16_readout_overflow_passes_every_other_cell():
    bug = PLANTED["gdn.fp16-readout-overflow"]
    memo = Memo()
    named = {_ci(*READOUT_CELL), _ci(*READOUT_SPEC_CELL)}
    others = [c for c in gdn.cells("ci") if bug.applies(c) and c not in named]
    assert len(others) >= 10
    caught = [c.id for c in others if verdict_of(bug.plant(numpy_ref), c, "exact", memo).status == "fail"]
    assert not caught, caught


def test_beta_through_bf16_is_caught_by_the_recurrent_chain_and_not_where_beta_is_0_or_1():
    bug = PLANTED["gdn.beta-through-bf16"]
    named, edges = _ci(*BETA_CELL), _ci("recurrent/", "beta=edges")
    memo = Memo()
    assert bug.applies(named) and bug.applies(edges)
    assert verdict_of(bug.plant(numpy_ref), named, "exact", memo).status == "fail"
    assert verdict_of(numpy_ref, named, "exact", memo).status == "pass"
    assert verdict_of(bug.plant(numpy_ref), edges, "exact", memo).status == "pass"     # 0 and 1 are bf16 values
    bf16_pool = _ci("recurrent/", "state=bfloat16", "calls=")                          # below the pool's own drift
    assert bug.applies(bf16_pool) and verdict_of(bug.plant(numpy_ref), bf16_pool, "exact", memo).status == "pass"
    assert not any(bug.applies(c) for c in gdn.cells("ci") if activation(c) == "bfloat16")


def test_the_state_chain_term_decides_a_long_16bit_chain_and_not_a_single_step():
    chain = _ci("decode/", "state=bfloat16", LONG)
    found = verdict_of(numpy_ref, chain, "exact")
    assert found.status == "pass", found.reason
    assert all(STATE_CHAIN.name in c.tolerance.source for c in found.comparisons[:2])
    single = next(c for c in gdn.cells("smoke")                        # one decode call into a 16-bit pool
                  if c.op == "decode" and c["state"] != "float32" and c.get("steps") is None)
    assert STATE_CHAIN.name not in verdict_of(numpy_ref, single, "exact").comparisons[0].tolerance.source


def test_a_truncating_store_still_fails_the_16bit_chains():
    bug = PLANTED["gdn.truncating-store"]
    for cell in (_ci("decode/", "state=bfloat16", LONG), _ci("decode/", "state=float16", LONG)):
        assert verdict_of(bug.plant(numpy_ref), cell, "exact").status == "fail", cell.id


def test_the_drift_study_decode_chains_order_the_state_dtypes(capsys):
    parser = argparse.ArgumentParser()
    gdn_drift.add_arguments(parser)
    args = parser.parse_args(["--quick", "--decode-only"])
    gdn_drift.check(args)
    result = gdn_drift.run(args)
    assert "gdn-drift: decode chain, float16 state" in capsys.readouterr().err   # it shows its progress
    rows = {(r["state_dtype"], r["steps"]): r for r in result["decode_chain"]}
    for n in (64, 256):
        assert rows[("float32", n)]["state_rel_l2"] < 64 * U32
        assert rows[("bfloat16", n)]["state_rel_l2"] > rows[("float16", n)]["state_rel_l2"] > 64 * U32
    assert rows[("bfloat16", 256)]["o_rel_l2"] > rows[("bfloat16", 64)]["o_rel_l2"]      # it drifts with the chain
    assert "decode chains" in gdn_drift.summarize(result) and "length_sweep" not in result
    from reports import figures

    svg = figures.gdn_drift(result, salt="chains")
    # a --decode-only result draws its one panel, not two empty ones beside it
    assert "decode calls" in svg and svg.count('<g id="axes_') == 1 and "sequence length" not in svg


def test_the_drift_study_refuses_bad_decode_arguments():
    parser = argparse.ArgumentParser()
    gdn_drift.add_arguments(parser)
    with pytest.raises(ValueError, match="--decode-steps"):
        gdn_drift.check(parser.parse_args(["--decode-steps", "0,4096"]))
    with pytest.raises(ValueError, match="--decode-sequences"):
        gdn_drift.check(parser.parse_args(["--decode-sequences", "0"]))
