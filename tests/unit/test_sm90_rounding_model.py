"""The sm_90 decode's rounding model ``act-mma-table``: its oracle dequantizes keys through the centroid table
rounded to the activation dtype (the norm scaling the score exactly) and keeps the values exact, and the
NumPy emulation of the kernel's roundings (``bench.probes.sm90_numerics``) passes it on the full-tier cell
whose margin under ``act-mma`` was 1.07 on the H200 and on the H100."""
from __future__ import annotations

import numpy as np

from conformance import families
from conformance.families.turboquant.oracle import dequantized, key_table
from conformance.memo import Memo
from conformance.numerics import to_activation
from conformance.run.selection import select_cells
from reference.turboquant import numpy_ref

FAILED_ID = ("turboquant/decode/preset=turboquant_4bit_nc/layout=soa/Hk=8/G=16/bs=16/lens=256/rotation=hadamard/"
             "sinks=off/D=128/range=unit/act=bfloat16/seed=0")


def test_table_keys_are_the_norm_times_the_rounded_centroid():
    fam = families.get("turboquant")
    cell = next(c for c in select_cells("full", "turboquant") if c.id == FAILED_ID)
    inputs = fam.make_inputs(cell)
    table = key_table(inputs["preset"], 128, "bfloat16")
    assert np.array_equal(table, to_activation(numpy_ref.centroids(4, 128), "bfloat16").astype(np.float32))
    assert key_table("turboquant_k8v4", 128, "bfloat16") is None          # FP8 keys: no table
    (k_table,), (v_table,) = dequantized(inputs, inputs["kv_cache"], table)
    (k_plain,), (v_plain,) = dequantized(inputs, inputs["kv_cache"])
    assert np.array_equal(v_table, v_plain) and not np.array_equal(k_table, k_plain)
    ratio = k_table.astype(np.float64) / k_plain
    assert np.max(np.abs(ratio - 1)) <= 2.0**-8                            # one bf16 rounding of the centroid


def test_the_emulated_sm90_roundings_pass_act_mma_table_where_act_mma_failed():
    from bench.probes.sm90_numerics import Emulation

    fam = families.get("turboquant")
    cell = next(c for c in select_cells("full", "turboquant") if c.id == FAILED_ID)
    inputs, memo = fam.make_inputs(cell), Memo()
    out = fam.run_with(Emulation(), cell, inputs)
    table = fam.check(cell, "act-mma-table", inputs, out, memo)
    assert table.status == "pass" and table.worst().metrics["margin"] < 0.5, table.reason
    assert fam.check(cell, "act-mma", inputs, out, memo).status == "fail"   # the H200 and H100 verdict
