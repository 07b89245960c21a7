"""The C++ extension counts the calls it dispatches to each ISA build, and the cpu-* backends'
records name the build that ran from those counts: their own ISA, and ``scalar`` for gating (one
portable build)."""
from __future__ import annotations

import numpy as np
import pytest

import optimized.cpu as cpu
from conformance.families import gdn
from conformance.run.estimate import cell_work
from conformance.run.inprocess import run_one

BUILT, WHY = cpu.extension_status()
pytestmark = pytest.mark.skipif(not BUILT, reason=WHY)
STATUS = cpu.isa_status()
ISAS = [pytest.param(isa, marks=pytest.mark.skipif(not STATUS[isa][0], reason=f"{isa}: {STATUS[isa][1]}"))
        for isa in cpu.ISAS]


def _added(before: dict, after: dict) -> dict:
    return {isa: after[isa] - before[isa] for isa in cpu.ISAS if after[isa] != before[isa]}


@pytest.mark.parametrize("isa", ISAS)
def test_each_dispatch_counts_once_for_the_build_that_ran(isa):
    a = np.ones((32, 32), np.float32)
    before = cpu.dispatch_counts()
    cpu.gemm_bf16(a, a, isa)
    assert _added(before, cpu.dispatch_counts()) == {isa: 1}


def test_auto_counts_for_the_best_build_and_a_refused_isa_counts_nothing():
    a = np.ones((32, 32), np.float32)
    best = next(isa for isa in cpu.ISAS if STATUS[isa][0])
    before = cpu.dispatch_counts()
    cpu.gemm_bf16(a, a, "auto")
    assert _added(before, cpu.dispatch_counts()) == {best: 1}
    before = cpu.dispatch_counts()
    with pytest.raises(ValueError, match="isa: expected"):
        cpu.gemm_bf16(a, a, "sse2")
    assert cpu.dispatch_counts() == before


def _smallest(op: str):
    return min((c for c in gdn.cells("ci") if c.op == op), key=cell_work)


@pytest.mark.parametrize("isa", ISAS)
def test_records_name_the_build_the_extension_dispatched_to(isa):
    decode, gating = run_one(_smallest("decode"), f"cpu-{isa}"), run_one(_smallest("gating"), f"cpu-{isa}")
    assert (decode["status"], decode["path"]) == ("pass", isa)
    assert (gating["status"], gating["path"]) == ("pass", "scalar")


def test_a_backend_dispatching_to_another_build_than_its_own_is_recorded_so(monkeypatch):
    """cpu-avx512 whose calls reach the scalar build (a wrong check in front of the dispatch):
    its record says scalar, what ran, not avx512, what it declares."""
    from conformance.backends import cpu_kernels

    real = cpu_kernels.KernelImpl.__init__

    def to_scalar(self, isa):
        real(self, "scalar")

    monkeypatch.setattr(cpu_kernels.KernelImpl, "__init__", to_scalar)
    record = run_one(_smallest("decode"), "cpu-avx512")
    assert (record["status"], record["path"]) == ("pass", "scalar")
