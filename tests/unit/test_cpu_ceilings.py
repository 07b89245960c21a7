"""The CPU ceilings of the benches (optimized.cpu.ceilings): the physical cores of an AMX ceiling,
the chunk kernel's AMX GEMM at one shape (its argument checks everywhere, its timing where AMX runs)."""
from __future__ import annotations

import os

import pytest

import optimized.cpu as cpu
from optimized.cpu import ceilings

BUILT, WHY = cpu.extension_status()
pytestmark = pytest.mark.skipif(not BUILT, reason=WHY)
AMX, AMX_WHY = cpu.isa_status()["amx"]


def test_physical_cores_counts_distinct_cores_of_the_affinity():
    cpus = sorted(os.sched_getaffinity(0))
    assert 1 <= ceilings.physical_cores() <= len(cpus)
    assert ceilings.physical_cores(cpus[:1]) == 1


@pytest.mark.parametrize("shape", [(33, 128, 128), (64, 0, 128), (64, 128, 8192)])
def test_amx_gemm_refuses_shapes_the_gemm_does_not_take(shape):
    with pytest.raises(ValueError, match="M, N, Kd: expected positive multiples of 32"):
        cpu._gdn.amx_gemm_seconds(*shape, 1, 1)


@pytest.mark.skipif(AMX, reason="this CPU has AMX")
def test_amx_gemm_without_amx_says_why():
    with pytest.raises(ValueError, match="amx: "):
        ceilings.amx_gemm(*ceilings.GEMM_SHAPE, 1)


@pytest.mark.skipif(not AMX, reason=f"amx: {AMX_WHY}")
def test_amx_gemm_times_its_products():
    seconds = ceilings.amx_gemm(*ceilings.GEMM_SHAPE, 2)()
    flops = ceilings.gemm_flops(*ceilings.GEMM_SHAPE, 2)
    assert seconds > 0 and flops / seconds > 1e9
