"""The interpreter's address check (``conformance.interpreter_addresses``) as ``run_one`` applies it: every
masked-on load and store of our Triton kernels on the smoke tier's cells stays inside a tensor argument of its
launch, and a kernel whose load lost its row bound gives an error record naming the access (the interpreter
itself reads whatever address a pointer holds, so without the check the pair would pass)."""
from __future__ import annotations

import pytest
import triton
import triton.language as tl

from conformance.cells import make_cell
from conformance.run.inprocess import run_one
from conformance.run.selection import select_cells
from optimized.triton import gdn_chunked as C
from tests.unit.tq_triton_helpers import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter runs on machines without a GPU")
BACKENDS = ("triton-gdn-interpret", "triton-interpret", "triton-grouped-interpret", "triton-lut-interpret",
            "triton-unified-interpret")


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_access_on_the_smoke_tier_stays_inside_its_tensors(backend):
    ran = 0
    for cell in select_cells("smoke"):
        record = run_one(cell, backend)
        if record["status"] == "skip":
            continue
        ran += 1
        assert record["status"] == "pass", f"{cell.id}: {record['status']}: {record['reason']}"
    assert ran > 0, f"no smoke cell ran on {backend}"


@triton.jit
def _gates_without_row_bound(g_ptr, beta_ptr, t0, rows, valid, sg_t, sb_t, hv):
    every = rows >= 0
    g = tl.load(g_ptr + (t0 + rows) * sg_t + hv, mask=every, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + (t0 + rows) * sb_t + hv, mask=valid, other=0.0).to(tl.float32)
    return g, beta


def test_a_load_whose_mask_lost_its_row_bound_is_an_error_record_naming_the_access(monkeypatch):
    monkeypatch.setattr(C, "_gates", _gates_without_row_bound)
    cell = make_cell("gdn", "chunked", state="float32", H=1, HV=2, K=16, lens=(70, 5), decay="weak",
                     slots="padded", qk="unit", split=None, act="bfloat16")
    record = run_one(cell, "triton-gdn-interpret")
    assert record["status"] == "error", record
    assert record["reason"].startswith("OutOfBounds: _prep_tiles_kernel: load of bytes"), record["reason"]
    assert "test_triton_interpreter_addresses.py" in record["reason"] and "outside every argument" in record["reason"]


def test_the_check_is_restored_after_a_pair():
    from triton.runtime import interpreter as I

    before = I.InterpreterBuilder.create_masked_load
    run_one(select_cells("smoke", family="gdn")[0], "triton-gdn-interpret")
    assert I.InterpreterBuilder.create_masked_load is before
