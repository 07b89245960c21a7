"""GPU ceilings measured in the same run as the kernels they bound: a device copy, a fan-out copy (one read,
several writes) and a bf16 matmul.

The copy ceiling is a Triton copy kernel over two uint8 buffers of the op's size (rounded up to
``COPY_ALIGN`` bytes), timed like the kernels (CUDA-graph replays), counting bytes read plus bytes
written. It is not ``torch`` ``copy_``: a captured ``cudaMemcpyAsync`` becomes a graph memcpy node,
which the driver may run on another path than the eager copy (on the H200 some sizes replay at about
two thirds of the eager rate), so a captured memcpy is not a ceiling of captured kernels. The
independent check is ``gpu-copy-eager``: ``torch`` ``copy_`` of the same size launched eagerly and
timed with device events (``Impl.timing = "events"``); the gates ``gpu-copy-*-vs-eager`` hold the two
within 5% of each other in the same run.
"""
from __future__ import annotations

import triton
import triton.language as tl

from conformance.cost import Cost

COPY_ALIGN = 1 << 16       # buffer sizes: a multiple of the copy kernel's block
COPY_BLOCK = 1 << 16       # bytes per program: 128 per thread of 16 warps, eight 16-byte accesses in flight
COPY_WARPS = 16
COPY_STREAMING = False
MATMUL_N = 8192


@triton.jit
def _copy_kernel(src, dst, BLOCK: tl.constexpr, STREAMING: tl.constexpr):
    """``dst[i] = src[i]`` over ``BLOCK`` bytes per program (the buffers are a whole number of blocks);
    ``STREAMING``: loads past L1 (.cg), stores marked streaming (.cs)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    if STREAMING:
        tl.store(dst + offs, tl.load(src + offs, cache_modifier=".cg"),
                 cache_modifier=".cs")
    else:
        tl.store(dst + offs, tl.load(src + offs))


@triton.jit
def _fanout_kernel(src, dst, n, COPIES: tl.constexpr, BLOCK: tl.constexpr):
    """``dst[c n + i] = src[i]`` for each of ``COPIES`` copies c, over ``BLOCK`` bytes of ``src`` per program
    (``n``, the bytes of ``src``, a whole number of blocks): each byte read once and written ``COPIES`` times."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(src + offs)
    for c in tl.static_range(COPIES):
        tl.store(dst + c * n.to(tl.int64) + offs, x)


def copy_bytes(nbytes: int) -> int:
    """The size of the copy buffers for an op of ``nbytes``: rounded up to ``COPY_ALIGN``."""
    if nbytes < 1:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    return -(-nbytes // COPY_ALIGN) * COPY_ALIGN


def copy_cost(nbytes: int) -> Cost:
    """Both buffers of ``copy_bytes(nbytes)``: read once and written once."""
    return Cost(bytes=2 * copy_bytes(nbytes), flops=0)


def _buffers(nbytes: int):
    import torch

    n = copy_bytes(nbytes)
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 256)
    return a, torch.empty_like(a)


def triton_copy(nbytes: int, block: int = COPY_BLOCK, warps: int = COPY_WARPS, streaming: bool = COPY_STREAMING):
    """The timed call of the copy ceiling: ``_copy_kernel`` over fresh random buffers of ``copy_bytes(nbytes)``,
    ``block`` bytes per program (a divisor of ``COPY_ALIGN``), ``warps`` warps."""
    if COPY_ALIGN % block:
        raise ValueError(f"block must divide {COPY_ALIGN}, got {block}")
    a, b = _buffers(nbytes)
    grid = (a.numel() // block,)
    return lambda: _copy_kernel[grid](a, b, BLOCK=block, STREAMING=streaming, num_warps=warps)


def fanout_cost(nbytes: int, copies: int) -> Cost:
    """A source of ``copy_bytes(nbytes)`` read once and written ``copies`` times."""
    return Cost(bytes=(1 + copies) * copy_bytes(nbytes), flops=0)


def _fanout_buffers(nbytes: int, copies: int):
    import torch

    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be a positive int, got {copies!r}")
    src = torch.empty(copy_bytes(nbytes), dtype=torch.uint8, device="cuda").random_(0, 256)
    return src, torch.empty(copies, src.numel(), dtype=torch.uint8, device="cuda")


def triton_fanout(nbytes: int, copies: int, block: int = COPY_BLOCK, warps: int = COPY_WARPS):
    """The timed call of the fan-out ceiling: ``_fanout_kernel`` from a fresh random source of
    ``copy_bytes(nbytes)`` into ``copies`` destinations of that size."""
    if COPY_ALIGN % block:
        raise ValueError(f"block must divide {COPY_ALIGN}, got {block}")
    src, dst = _fanout_buffers(nbytes, copies)
    grid = (src.numel() // block,)
    return lambda: _fanout_kernel[grid](src, dst, src.numel(), COPIES=copies, BLOCK=block, num_warps=warps)


def torch_copy(nbytes: int):
    """The independent check: ``torch`` ``copy_`` over fresh random buffers of ``copy_bytes(nbytes)``
    (to be launched eagerly)."""
    a, b = _buffers(nbytes)
    return lambda: b.copy_(a)


def matmul_cost(shape: dict) -> Cost:
    return Cost(bytes=3 * 2 * MATMUL_N * MATMUL_N, flops=2 * MATMUL_N ** 3)


def matmul(shape: dict, inputs):
    """An ``MATMUL_N``^3 bf16 matmul on random data into a preallocated output."""
    import torch

    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    return lambda: torch.matmul(a, b, out=c)
