"""TurboQuant decode on a GPU: B=32, Hk=8, G=8, D=128, turboquant_4bit_nc, SoA cache, block size
16, every sequence L tokens long (L = 8192, 32768), block table a random permutation of blocks;
activations (query, output, the stored keys and values) in bfloat16 (shapes ``L=<L>``) and float16
(shapes ``L=<L>,act=float16``).

Implementations: ``triton-grouped`` (ours, the portable Triton grouped decode with its default
configuration: MMA operands in the query's dtype), ``triton-sm90`` (ours, the Gluon decode for sm_90, its
default configuration; only on compute capability 9.0), ``torch-sdpa`` (baseline: SDPA decode on a contiguous cache of the same shape in the
activation dtype, cost model ``attention_decode_bf16``). Ceilings (``bench.gpu_ceilings``): ``gpu-copy`` (a
Triton copy kernel of the op's bytes: the compressed cache, queries and outputs), ``gpu-copy-eager`` (torch
``copy_`` of the same size, launched eagerly: the independent check of ``gpu-copy``) and ``gpu-matmul-bf16``
(an 8192^3 bf16 matmul). Peers (vLLM's TurboQuant Triton decode) register themselves through
``bench.registry.register_impl``. Timing: medians of CUDA-graph replays (``gpu-copy-eager``: of eager
launches timed with device events). The caches are gigabytes, far beyond L2.
"""
from __future__ import annotations

from conformance.cost import Cost
from conformance.families.turboquant import cost
from bench import gpu_ceilings
from bench.machine import gpu_capability
from bench.registry import Bench, Impl, register_bench, register_impl

PRESET = "turboquant_4bit_nc"


def act_dtype(shape: dict):
    """The torch dtype of the shape's activations."""
    from conformance.torch_arrays import torch_dtype

    return torch_dtype(shape["act"])


def decode_inputs(shape: dict) -> dict:
    """A full SoA cache of B sequences of L tokens written by the Triton store kernel from keys and values
    in the activation dtype, a random block table, queries in that dtype and the Hadamard rotation."""
    import torch

    from optimized.triton.tq_store import store
    from reference.turboquant.presets import preset
    from reference.turboquant.rotation import hadamard

    B, Hk, G, D, L, bs = (shape[k] for k in ("B", "Hk", "G", "D", "L", "block_size"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    nblocks = B * L // bs
    cache = torch.empty(nblocks, bs, Hk, preset(shape["preset"]).slot_size(D), dtype=torch.uint8, device="cuda")
    rot = torch.from_numpy(hadamard(D)).cuda()
    slots = torch.arange(nblocks * bs, device="cuda")
    chunk = 1 << 19
    for s0 in range(0, nblocks * bs, chunk):
        n = min(chunk, nblocks * bs - s0)
        k = torch.randn(n, Hk, D, generator=gen, device="cuda", dtype=act_dtype(shape))
        v = torch.randn(n, Hk, D, generator=gen, device="cuda", dtype=act_dtype(shape))
        store(cache, k, v, slots[s0:s0 + n], preset=shape["preset"], layout=shape["layout"], rotation=rot)
    perm = torch.randperm(nblocks, generator=gen, device="cuda").to(torch.int32)
    return dict(cache=cache, block_table=perm.view(B, L // bs).contiguous(),
                seq_lens=torch.full((B,), L, dtype=torch.int32, device="cuda"),
                query=torch.randn(B, Hk * G, D, generator=gen, device="cuda", dtype=act_dtype(shape)), rotation=rot)


def launcher(load, **kw):
    """``Impl.prepare`` of a Triton decode launcher (``load()`` imports and returns it) with a
    preallocated workspace and an output in the activation dtype; ``kw`` its configuration."""
    def prepare(shape, inputs):
        import torch

        from optimized.triton.tq_decode_launch import DecodeWorkspace

        B, Hq, D = shape["B"], shape["Hk"] * shape["G"], shape["D"]
        ws = DecodeWorkspace(B, Hq, D, max_splits=32)
        out = torch.empty(B, Hq, D, dtype=act_dtype(shape), device="cuda")
        fn = load()
        return lambda: fn(inputs["query"], inputs["cache"], inputs["block_table"], inputs["seq_lens"],
                          preset=shape["preset"], layout=shape["layout"], rotation=inputs["rotation"],
                          workspace=ws, out=out, **kw)
    return prepare


def grouped():
    from optimized.triton.tq_decode_grouped import decode_grouped

    return decode_grouped


def sm90():
    from optimized.triton.tq_decode_sm90 import decode_sm90

    return decode_sm90


def sm90_available() -> tuple[bool, str]:
    """A GPU the sm_90 decode runs on (compute capability 9.0), or why not."""
    ok, why = gpu_capability()
    if not ok:
        return ok, why
    import torch

    from optimized.triton.tq_decode_sm90 import device_problem

    problem = device_problem(torch.device("cuda"))
    return problem is None, problem or why


def sm90_supports(shape: dict) -> str | None:
    """The sm_90 decode takes bfloat16 and float16 queries (``tq_decode_sm90.dtype_problem``)."""
    from optimized.triton.tq_decode_sm90 import dtype_problem

    return dtype_problem(shape["act"])


def _torch_sdpa(shape, inputs):
    import torch
    import torch.nn.functional as F

    B, Hk, G, D, L = (shape[k] for k in ("B", "Hk", "G", "D", "L"))
    dt = act_dtype(shape)
    q = torch.randn(B, Hk * G, 1, D, device="cuda", dtype=dt)
    k = torch.randn(B, Hk, L, D, device="cuda", dtype=dt)
    v = torch.randn(B, Hk, L, D, device="cuda", dtype=dt)
    return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _copy_cost(shape: dict) -> Cost:
    """The op's bytes (``cost.decode``) read and written once (``gpu_ceilings.copy_cost``)."""
    return gpu_ceilings.copy_cost(cost.decode(shape).bytes)


def _gpu_copy(shape, inputs):
    return gpu_ceilings.triton_copy(cost.decode(shape).bytes)


def _gpu_copy_eager(shape, inputs):
    return gpu_ceilings.torch_copy(cost.decode(shape).bytes)


register_bench(Bench(
    name="turboquant/decode", device="gpu", cost=cost.decode, inputs=decode_inputs, reps=5,
    shapes={f"L={L}" + ("" if act == "bfloat16" else f",act={act}"):
            dict(B=32, Hk=8, G=8, D=128, L=L, preset=PRESET, layout="soa", block_size=16, act=act)
            for act in ("bfloat16", "float16") for L in (8192, 32768)}))
register_impl(Impl(bench="turboquant/decode", name="triton-grouped", role="ours", prepare=launcher(grouped),
                   available=gpu_capability))
register_impl(Impl(bench="turboquant/decode", name="triton-sm90", role="ours", prepare=launcher(sm90),
                   available=sm90_available, supports=sm90_supports))
register_impl(Impl(bench="turboquant/decode", name="torch-sdpa", role="baseline", prepare=_torch_sdpa,
                   available=gpu_capability, cost=cost.attention_decode_bf16))
register_impl(Impl(bench="turboquant/decode", name="gpu-copy", role="ceiling", prepare=_gpu_copy,
                   available=gpu_capability, cost=_copy_cost))
register_impl(Impl(bench="turboquant/decode", name="gpu-copy-eager", role="ceiling", prepare=_gpu_copy_eager,
                   available=gpu_capability, cost=_copy_cost, timing="events"))
register_impl(Impl(bench="turboquant/decode", name="gpu-matmul-bf16", role="ceiling", prepare=gpu_ceilings.matmul,
                   available=gpu_capability, cost=gpu_ceilings.matmul_cost, metric="tflops"))
