"""torch-sdpa equals float64 attention over the unquantized cache (GQA, sinks, padding), and the
distortion study reproduces the paper's D_mse per bit width."""
import argparse

import numpy as np
import pytest

from conformance.families import turboquant as fam
from conformance.families.turboquant.matrix import decode_cell
from conformance.families.turboquant.oracle import attention64, unquantized
from conformance.families.turboquant.tolerances import attention_agreement
from conformance.numerics import U64
from conformance.testing import assert_close
from conformance.torch_arrays import to_torch
from conformance.studies import tq_distortion


def test_torch_sdpa_matches_float64_attention_with_sinks_and_gqa():
    pytest.importorskip("torch")
    from optimized.torch.tq_sdpa import paged_sdpa_decode

    cell = decode_cell("decode", "turboquant_4bit_nc", "aos", (4, 6), 16, (33, 1, 20), "hadamard", True)
    x = fam.make_inputs(cell)
    t = {k: to_torch(x[k]) for k in ("query", "key_cache", "value_cache", "block_table", "seq_lens", "sinks")}
    out = paged_sdpa_decode(t["query"].double(), t["key_cache"].double(), t["value_cache"].double(),
                            t["block_table"], t["seq_lens"], x["scale"], t["sinks"].double())
    keys, values = unquantized(x)
    ref = attention64(x["query"].astype(np.float64), keys, values, 6, x["scale"], x["sinks"].astype(np.float64))
    q = x["query"].astype(np.float64)
    assert_close("out", out.numpy(), ref, attention_agreement(q, keys, values, 6, x["scale"], unit=U64))
    with pytest.raises(ValueError, match="block_table"):
        paged_sdpa_decode(t["query"], t["key_cache"], t["value_cache"], t["block_table"] + 1000, t["seq_lens"])


def test_distortion_study_reproduces_the_paper():
    parser = argparse.ArgumentParser()
    tq_distortion.add_arguments(parser)
    result = tq_distortion.run(parser.parse_args(["--vectors", "4000"]))
    for row in result["rows"]:
        assert row["mse"] == pytest.approx(row["gaussian_mse_theory"], rel=0.05)
        assert row["mse"] < row["paper_upper_bound"]
    assert "D_mse" in tq_distortion.summarize(result)
