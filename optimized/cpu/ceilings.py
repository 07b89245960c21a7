"""CPU ceilings timed with the extension's own kernels on its own thread pool (no torch, whose
OpenMP threads spin after a parallel region and would steal cycles from the pool).

Each returns a no-argument callable performing one pass, for interleaved timing beside the op:
``rmw_stream`` (in place, ``nbytes`` read and written), ``copy`` (``nbytes`` read, ``nbytes``
written elsewhere), ``amx_tile_peak`` (register-resident tdpbf16ps) and ``amx_gemm`` (the chunk
kernel's own AMX GEMM at one shape, operands in cache).

The AMX unit belongs to a physical core: two threads on SMT siblings share one, so an AMX peak is
that of the physical cores its threads run on (``physical_cores``; a VM may hide siblings, so the
ratio of the N-thread to the one-thread peak tells how many units N threads really had); per
physical core it is the one-thread peak.
"""
from __future__ import annotations

import numpy as np

from optimized.cpu import _gdn, extension_status, isa_status


def _ext():
    """The package's compiled module (ImportError naming the build step when it is not built)."""
    built, why = extension_status()
    if not built:
        raise ImportError(why)
    return _gdn

AMX_PEAK_ITERS = 20_000
AMX_FLOPS_PER_ITER = 4 * 2 * 16 * 16 * 32   # four 16x16x32 tile products


def physical_cores(cpus=None) -> int:
    """Distinct physical cores (package, core id) among ``cpus`` (default: this process's affinity)."""
    import os

    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    cores = set()
    for c in cpus:
        topo = f"/sys/devices/system/cpu/cpu{c}/topology"
        try:
            with open(f"{topo}/physical_package_id") as p, open(f"{topo}/core_id") as k:
                cores.add((p.read().strip(), k.read().strip()))
        except OSError:   # no topology: count the CPU as its own core
            cores.add(("cpu", str(c)))
    return len(cores)


def rmw_stream(nbytes: int, num_threads: int):
    """One in-place pass ``x += 1`` over ``nbytes`` (rounded up to 8-byte words) of uint64 words."""
    if nbytes < 8:
        raise ValueError(f"nbytes: expected >= 8, got {nbytes}")
    buf = np.zeros(-(-nbytes // 8), np.uint64)
    ext = _ext()
    return lambda: ext.rmw_stream(buf, 1, int(num_threads))


def copy(nbytes: int, num_threads: int):
    """One ``memcpy`` of ``nbytes`` split over ``num_threads`` threads."""
    if nbytes < 1:
        raise ValueError(f"nbytes: expected >= 1, got {nbytes}")
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    ext = _ext()
    return lambda: ext.copy_bytes(dst, src, int(num_threads))


def amx_tile_peak(num_threads: int):
    """``AMX_PEAK_ITERS`` rounds of four tile products per thread; FLOPs per call:
    ``AMX_PEAK_ITERS * AMX_FLOPS_PER_ITER * num_threads``."""
    ok, why = isa_status()["amx"]
    if not ok:
        raise ValueError(f"amx: {why}")
    ext = _ext()
    return lambda: ext.amx_tile_peak_seconds(AMX_PEAK_ITERS, int(num_threads))


GEMM_SHAPE = (64, 128, 128)   # M, N, Kd: the chunk kernel's tile products (C x V x K, chunk C = 64)
GEMM_ITERS = 10_000


def gemm_flops(M: int, N: int, Kd: int, num_threads: int) -> int:
    """FLOPs of one ``amx_gemm`` call."""
    return 2 * M * N * Kd * GEMM_ITERS * num_threads


def amx_gemm(M: int, N: int, Kd: int, num_threads: int):
    """``GEMM_ITERS`` products C[M,N] = A[M,Kd] B[Kd,N] per thread through the chunk kernel's AMX
    GEMM (M, N, Kd multiples of 32); FLOPs per call: ``gemm_flops``."""
    ok, why = isa_status()["amx"]
    if not ok:
        raise ValueError(f"amx: {why}")
    ext = _ext()
    return lambda: ext.amx_gemm_seconds(int(M), int(N), int(Kd), GEMM_ITERS, int(num_threads))
