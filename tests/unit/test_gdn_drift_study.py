"""The gdn-drift study: JSON result, expected ordering of errors, overflow reported not hidden."""
from __future__ import annotations

import argparse
import json

import pytest

from conformance.numerics import U32, UBF16
from conformance.studies import gdn_drift


def _args(*argv):
    parser = argparse.ArgumentParser()
    gdn_drift.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(scope="module")
def quick():
    return gdn_drift.run(_args("--quick"))


def test_quick_study_is_json_and_summarizes(quick):
    json.dumps(quick)
    text = gdn_drift.summarize(quick)
    assert "bfloat16" in text and "float16" in text and "overflow probe" in text


def test_bf16_drifts_more_than_fp16_and_fp32_split_does_not_drift(quick):
    sweep = {(r["state_dtype"], r["tokens"]): r for r in quick["length_sweep"]}
    T = quick["config"]["tokens"]
    assert sweep[("bfloat16", T)]["state_rel_l2"] > sweep[("float16", T)]["state_rel_l2"] > 0
    trips = {(r["state_dtype"], r["round_trips"]): r for r in quick["round_trips"]}
    assert trips[("float32", 4)]["state_rel_l2"] < 256 * U32       # fp32 splits: rounding noise only
    assert trips[("bfloat16", 4)]["state_rel_l2"] > UBF16 / 32     # bf16 round trips: bf16-sized drift


def test_float16_overflow_is_detected_and_reported():
    args = _args("--quick", "--v-scale", "1e5")
    x = gdn_drift.draw_inputs(__import__("numpy").random.default_rng(0), 256, 2, 4, 64, "weak", args.v_scale)
    probe = gdn_drift.overflow_probe(x)
    assert probe["fp32_state_exceeds_fp16_range"]
    assert probe["float16"]["nonfinite"] and not probe["bfloat16"]["nonfinite"]
    assert "OVERFLOW" in gdn_drift.overflow_text(probe["float16"])
