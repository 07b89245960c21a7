"""GDN on the CPU, Qwen3-Next linear-attention heads (H=16, HV=32, K=V=128), 2 threads:

- ``gdn/decode``: one step of a batch of 128 sequences, state slots in a random order, one shape
  per state dtype (fp32, bf16, fp16) with bf16 activations, and the bf16 state with fp16
  activations (``act=float16``); fused gating, q/k l2norm.
- ``gdn/chunked``: chunked prefill, 8192 tokens in one sequence (bf16 and fp16 activations) and
  4 x 2048 varlen (bf16), bf16 state.

Implementations: ``cpu`` (ours, the C++ kernels, best ISA), ``torch-eager`` (the plain-torch
chunked baseline). Ceilings, on the extension's own thread pool (never torch's): ``cpu-rmw-stream``
(in place over a buffer of the state pool's size: the state update's access pattern),
``cpu-copy`` (the same size copied), ``amx-bf16`` (tile peak, when the CPU has AMX) and
``amx-gemm-64x128x128`` (the chunk kernel's own AMX GEMM at the shape of its tile products,
operands in cache). Both AMX ceilings are those of the physical cores the threads run on
(``optimized.cpu.ceilings.physical_cores``).
"""
from __future__ import annotations

import numpy as np

from bench.registry import Bench, Impl, register_bench, register_impl
from conformance.cost import Cost
from conformance.families.gdn import cost
from conformance.numerics import ACTIVATIONS
from conformance.torch_arrays import to_torch
from reference.gdn.arguments import POOL_DTYPES
HEADS = dict(H=16, HV=32, K=128, V=128)
THREADS = 2
DECODE_BATCH = 128


def _extension() -> tuple[bool, str]:
    import optimized.cpu as cpu

    return cpu.extension_status()


def _amx() -> tuple[bool, str]:
    import optimized.cpu as cpu

    return cpu.isa_status()["amx"]


def _torch() -> tuple[bool, str]:
    try:
        import torch
    except ImportError as exc:
        return False, f"torch is not importable ({exc})"
    return True, f"torch {torch.__version__}"


# ---------------------------------------------------------------- decode

def decode_inputs(shape: dict) -> dict:
    """Decode arguments (activations in ``shape["act"]``) and a seeded state pool of the shape's dtype."""
    rng = np.random.default_rng(0)
    N, H, HV, K, V = (shape[k] for k in ("N", "H", "HV", "K", "V"))
    act = ACTIVATIONS[shape["act"]]
    args = dict(q=rng.normal(size=(N, H, K)).astype(act), k=rng.normal(size=(N, H, K)).astype(act),
                v=rng.normal(size=(N, HV, V)).astype(act), A_log=rng.normal(size=HV).astype(np.float32),
                a=rng.normal(size=(N, HV)).astype(act), b=rng.normal(size=(N, HV)).astype(act),
                dt_bias=rng.normal(size=HV).astype(act), state_indices=rng.permutation(N).astype(np.int32))
    pool = (0.5 * rng.standard_normal((N, HV, K, V), np.float32)).astype(POOL_DTYPES[shape["state_dtype"]])
    return dict(args=args, state=pool)


def _decode_cpu(shape, inputs):
    import optimized.cpu as cpu

    return lambda: cpu.gdn_decode(**inputs["args"], state=inputs["state"], num_threads=shape["threads"])


register_bench(Bench(
    name="gdn/decode", device="cpu", cost=cost.decode, inputs=decode_inputs, reps=15,
    shapes={**{f"state={d}": dict(N=DECODE_BATCH, **HEADS, state_dtype=d, act="bfloat16", threads=THREADS)
               for d in POOL_DTYPES},
            "state=bfloat16/act=float16": dict(N=DECODE_BATCH, **HEADS, state_dtype="bfloat16", act="float16",
                                               threads=THREADS)}))
register_impl(Impl(bench="gdn/decode", name="cpu", role="ours", prepare=_decode_cpu, available=_extension))


# ---------------------------------------------------------------- chunked prefill

def chunked_inputs(shape: dict) -> dict:
    """Prefill arguments for sequences of ``shape["lens"]`` (q, k, v, beta in ``shape["act"]``; fp32 g)
    and a zero state pool, one slot per sequence."""
    rng = np.random.default_rng(1)
    H, HV, K, V = (shape[k] for k in ("H", "HV", "K", "V"))
    lens, act = shape["lens"], ACTIVATIONS[shape["act"]]
    T = sum(lens)
    args = dict(q=rng.normal(size=(T, H, K)).astype(act), k=rng.normal(size=(T, H, K)).astype(act),
                v=rng.normal(size=(T, HV, V)).astype(act), g=-rng.uniform(1e-3, 0.1, (T, HV)).astype(np.float32),
                beta=rng.uniform(0.1, 0.9, (T, HV)).astype(act),
                cu_seqlens=np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                state_indices=np.arange(len(lens), dtype=np.int32))
    return dict(args=args, state=np.zeros((len(lens), HV, K, V), POOL_DTYPES[shape["state_dtype"]]))


def _chunked_cpu(shape, inputs):
    import optimized.cpu as cpu

    return lambda: cpu.gdn_chunk_prefill(**inputs["args"], state=inputs["state"], num_threads=shape["threads"])


def _chunked_torch_eager(shape, inputs):
    import torch

    from optimized.torch import gdn_chunked

    targs = {n: to_torch(x) for n, x in inputs["args"].items()}
    targs["beta"] = targs["beta"].float()
    pool = to_torch(inputs["state"].copy())

    def run():
        previous = torch.get_num_threads()
        torch.set_num_threads(shape["threads"])
        try:
            gdn_chunked.chunked(**targs, state=pool, state_dtype=shape["state_dtype"])
        finally:
            torch.set_num_threads(previous)
    return run


register_bench(Bench(
    name="gdn/chunked", device="cpu", cost=cost.chunked, inputs=chunked_inputs, reps=3,
    shapes={"T=8192": dict(lens=[8192], **HEADS, state_dtype="bfloat16", act="bfloat16", threads=THREADS),
            "T=8192/act=float16": dict(lens=[8192], **HEADS, state_dtype="bfloat16", act="float16", threads=THREADS),
            "varlen=4x2048": dict(lens=[2048] * 4, **HEADS, state_dtype="bfloat16", act="bfloat16",
                                  threads=THREADS)}))
register_impl(Impl(bench="gdn/chunked", name="cpu", role="ours", prepare=_chunked_cpu, available=_extension))
register_impl(Impl(bench="gdn/chunked", name="torch-eager", role="baseline", prepare=_chunked_torch_eager,
                   available=_torch))


# ---------------------------------------------------------------- ceilings

def _state_stream_cost(shape: dict) -> Cost:
    """The state pool read and written once."""
    return Cost(bytes=2 * cost.state_bytes(shape), flops=0)


def _rmw(shape, inputs):
    from optimized.cpu import ceilings

    return ceilings.rmw_stream(cost.state_bytes(shape), shape["threads"])


def _copy(shape, inputs):
    from optimized.cpu import ceilings

    return ceilings.copy(cost.state_bytes(shape), shape["threads"])


def _amx_cost(shape: dict) -> Cost:
    from optimized.cpu import ceilings

    return Cost(bytes=0, flops=ceilings.AMX_PEAK_ITERS * ceilings.AMX_FLOPS_PER_ITER * shape["threads"])


def _amx_peak(shape, inputs):
    from optimized.cpu import ceilings

    return ceilings.amx_tile_peak(shape["threads"])


def _gemm_cost(shape: dict) -> Cost:
    from optimized.cpu import ceilings

    return Cost(bytes=0, flops=ceilings.gemm_flops(*ceilings.GEMM_SHAPE, shape["threads"]))


def _gemm(shape, inputs):
    from optimized.cpu import ceilings

    return ceilings.amx_gemm(*ceilings.GEMM_SHAPE, shape["threads"])


register_impl(Impl(bench="gdn/decode", name="cpu-rmw-stream", role="ceiling", prepare=_rmw,
                   available=_extension, cost=_state_stream_cost))
register_impl(Impl(bench="gdn/decode", name="cpu-copy", role="ceiling", prepare=_copy,
                   available=_extension, cost=_state_stream_cost))
register_impl(Impl(bench="gdn/chunked", name="amx-bf16", role="ceiling", prepare=_amx_peak,
                   available=_amx, cost=_amx_cost, metric="tflops"))
register_impl(Impl(bench="gdn/chunked", name="amx-gemm-64x128x128", role="ceiling", prepare=_gemm,
                   available=_amx, cost=_gemm_cost, metric="tflops"))
