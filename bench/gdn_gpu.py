"""GDN decode on a GPU (``gdn/decode-gpu``): one step of N sequences (N = 32, 128) with Qwen3-Next's
linear-attention heads (H=16, HV=32, K=V=128), fused gating, q/k l2 norm, bf16 activations (and one
float16 row), the state pool in float32, bfloat16 or float16 (N slots in a random order), updated in place.
Shapes ``N=<N>,state=<dtype>[,act=float16]``.

Implementations: ``triton-gdn`` (ours, ``optimized.triton.gdn_recurrent.decode`` with its default
tile, a preallocated workspace and output: nothing allocated in the timed call), ``triton-gdn-sm90`` (ours,
``optimized.triton.gdn_decode_sm90.decode``, the Gluon decode for sm_90, the same way), and the peers
``fla`` (FLA's ``fused_recurrent_gated_delta_rule``, ``bench/peers/fla_peers.py`` with its gating in the kernel,
``use_gate_in_kernel`` and ``use_beta_sigmoid_in_kernel``, the pool as ``initial_state`` and
``output_final_state=True``: FLA returns the final state as a new float32 tensor, whatever the pool's
dtype) and ``vllm-gdn`` (vLLM's ``fused_sigmoid_gating_delta_rule_update``, in place in a pool of its
``[slots, HV, V, K]`` layout, ``bench/peers/vllm_peers.py``). Ceiling ``gpu-copy``: the Triton copy kernel
of ``bench.gpu_ceilings`` (a captured torch ``copy_`` is a graph memcpy node, another path at some sizes), checked
by ``gpu-copy-eager`` (torch ``copy_`` of the same size, eager, timed with device events), over half
of the op's bytes (``conformance.families.gdn.cost.decode``: the state read and written once,
q, k, v, a, b and o once). Timing: medians of CUDA-graph replays.

``gdn/spec-decode-gpu``: the speculative verify, N = 32 or 128 sequences of T = 2 or 4 draft tokens each
(``T=<T>,N=<N>,state=<dtype>``), the same heads and activations, a pool of N T slots (slots a random permutation,
row n of ``spec_state_indices`` sequence n's T slots, 1 to T drafts accepted), updated in place: each sequence's
state read once, from the accepted draft's slot, and stored once per draft token. Ours is
``gdn_recurrent.spec_decode`` (preallocated workspace and output) and ``triton-gdn-sm90``
(``gdn_decode_sm90.spec_decode``, the Gluon spec decode, the same way; its V block chosen from N and the
multiprocessors); peer ``vllm-gdn`` (vLLM's
``fused_sigmoid_gating_delta_rule_update`` with ``num_accepted_tokens``, ``bench/peers/vllm_peers.py``); FLA
0.6's ``fused_recurrent_gated_delta_rule`` stores only a sequence's last state, not one per draft token, so it does
not take this call. Ceilings ``gpu-copy``: ``bench.gpu_ceilings.triton_fanout``, a source read once and written T
times (the op's read-to-write ratio), sized so that it moves the op's bytes (``cost.spec_decode``), checked
against ``gpu-copy-eager``, the plain copy's rate (torch ``copy_`` of half the op's bytes, eager, device events;
torch has no read-once-write-T copy: its broadcast copy reads the source T times).

``gdn/chunked-gpu``: chunked prefill, the same heads, bf16 activations, one 8192-token sequence or 4 x 2048
(``T=8192,state=<dtype>``, ``varlen=4x2048,state=<dtype>``), the pool in float32, bfloat16 or float16. Ours is
``optimized.triton.gdn_chunked.chunked`` (packed through ``cu_seqlens``; its cost adds the bytes its stages
pass through memory, ``gdn_chunked.stage_bytes``); peers ``fla`` and ``vllm-gdn`` (``chunk_gated_delta_rule``,
``bench/peers``), as CUDA-graph replays, and ``fla-eager``, ``vllm-gdn-eager``, the same calls launched eagerly;
ceilings ``gpu-copy`` / ``gpu-copy-eager`` over the op's bytes (``cost.chunked``) and ``gpu-matmul-bf16`` (the
tensor-core peak).
"""
from __future__ import annotations

from bench import gpu_ceilings
from bench.machine import gpu_capability
from bench.registry import Bench, Impl, register_bench, register_impl
from bench.turboquant_gpu import sm90_available
from conformance.cost import Cost
from conformance.families.gdn import cost

HEADS = dict(H=16, HV=32, K=128, V=128)
BENCH = "gdn/decode-gpu"


def _dtype(name: str):
    from conformance.torch_arrays import torch_dtype

    return torch_dtype(name)


def decode_inputs(shape: dict) -> dict:
    """Arguments on the GPU: activations in ``shape["act"]``, A_log float32, a pool of N slots in
    ``shape["state_dtype"]``, slots a random permutation."""
    import torch

    N, H, HV, K, V = (shape[k] for k in ("N", "H", "HV", "K", "V"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    act = _dtype(shape["act"])

    def randn(*size, dtype=act, s=1.0):
        return (s * torch.randn(*size, generator=gen, device="cuda")).to(dtype)

    return dict(q=randn(N, H, K), k=randn(N, H, K), v=randn(N, HV, V), A_log=randn(HV, dtype=torch.float32, s=0.5),
                a=randn(N, HV), b=randn(N, HV), dt_bias=randn(HV, s=0.5),
                state=randn(N, HV, K, V, dtype=_dtype(shape["state_dtype"]), s=0.5),
                state_indices=torch.randperm(N, generator=gen, device="cuda").to(torch.int32))


def _timed_call(decode, inputs, **config):
    """The call of ``decode`` (a launcher of ``gdn_recurrent.decode``'s arguments) on ``inputs`` into a
    preallocated output, with a preallocated workspace: nothing allocated in the timed call."""
    import torch

    from optimized.triton.gdn_recurrent import Workspace

    x = inputs
    out = torch.empty_like(x["v"])
    ws = Workspace("cuda")
    return lambda: decode(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], x["state"],
                          x["state_indices"], out=out, workspace=ws, **config)


def ours(shape, inputs, **config):
    """``Impl.prepare`` of our decode; ``config`` the launcher's tile options (block_v, num_warps)."""
    from optimized.triton.gdn_recurrent import decode

    return _timed_call(decode, inputs, **config)


def ours_sm90(shape, inputs, **config):
    """``Impl.prepare`` of the sm_90 decode; ``config`` its tile options (lanes_k, heads_per_program)."""
    from optimized.triton.gdn_decode_sm90 import decode

    return _timed_call(decode, inputs, **config)


def _copy_bytes(shape: dict) -> int:
    """Half of the op's bytes: a copy of them reads and writes the op's bytes."""
    return cost.decode(shape).bytes // 2


def _copy_cost(shape: dict) -> Cost:
    """The op's bytes, read and written by a copy of half of them (``gpu_ceilings.copy_cost``)."""
    return gpu_ceilings.copy_cost(_copy_bytes(shape))


def _gpu_copy(shape, inputs):
    return gpu_ceilings.triton_copy(_copy_bytes(shape))


def _gpu_copy_eager(shape, inputs):
    return gpu_ceilings.torch_copy(_copy_bytes(shape))


SHAPES = {f"N={N},state={s}": dict(N=N, **HEADS, state_dtype=s, act="bfloat16")
          for N in (32, 128) for s in ("float32", "bfloat16", "float16")}
SHAPES["N=128,state=bfloat16,act=float16"] = dict(N=128, **HEADS, state_dtype="bfloat16", act="float16")

register_bench(Bench(name=BENCH, device="gpu", cost=cost.decode, inputs=decode_inputs, reps=5, shapes=SHAPES))
register_impl(Impl(bench=BENCH, name="triton-gdn", role="ours", prepare=ours, available=gpu_capability))
register_impl(Impl(bench=BENCH, name="triton-gdn-sm90", role="ours", prepare=ours_sm90, available=sm90_available))
register_impl(Impl(bench=BENCH, name="gpu-copy", role="ceiling", prepare=_gpu_copy, available=gpu_capability,
                   cost=_copy_cost))
register_impl(Impl(bench=BENCH, name="gpu-copy-eager", role="ceiling", prepare=_gpu_copy_eager,
                   available=gpu_capability, cost=_copy_cost, timing="events"))


# ---------------------------------------------------------------- speculative verify

SPEC_BENCH = "gdn/spec-decode-gpu"


def spec_tables(N: int, T: int, seed: int = 2):
    """(spec_state_indices int32 [N, T], num_accepted_tokens int32 [N], cu_seqlens int32 [N + 1]) on the host:
    the N T slots of the pool in a random order, one row per sequence; 1 to T drafts accepted; T tokens each."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    spec = torch.randperm(N * T, generator=gen).to(torch.int32).view(N, T)
    acc = torch.randint(1, T + 1, (N,), generator=gen).to(torch.int32)
    return spec, acc, torch.arange(0, N * T + 1, T, dtype=torch.int32)


def spec_inputs(shape: dict) -> dict:
    """Arguments on the GPU for N sequences of T draft tokens (``spec_tables``): activations in ``shape["act"]``,
    A_log float32, a pool of N T slots in ``shape["state_dtype"]``."""
    import torch

    N, T, H, HV, K, V = (shape[k] for k in ("N", "T", "H", "HV", "K", "V"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    act = _dtype(shape["act"])

    def randn(*size, dtype=act, s=1.0):
        return (s * torch.randn(*size, generator=gen, device="cuda")).to(dtype)

    spec, acc, cu = (t.cuda() for t in spec_tables(N, T))
    return dict(q=randn(N * T, H, K), k=randn(N * T, H, K), v=randn(N * T, HV, V),
                A_log=randn(HV, dtype=torch.float32, s=0.5), a=randn(N * T, HV), b=randn(N * T, HV),
                dt_bias=randn(HV, s=0.5), state=randn(N * T, HV, K, V, dtype=_dtype(shape["state_dtype"]), s=0.5),
                spec_state_indices=spec, num_accepted_tokens=acc, cu_seqlens=cu)


def spec_ours(shape, inputs, kernel="portable", **config):
    """``Impl.prepare`` of our speculative verify: preallocated output and workspace; ``kernel`` "portable"
    (``gdn_recurrent``) or "sm90" (``gdn_decode_sm90``), ``config`` its tile options."""
    import torch

    from optimized.triton import gdn_decode_sm90, gdn_recurrent
    from optimized.triton.gdn_recurrent import Workspace

    spec_decode = {"portable": gdn_recurrent.spec_decode, "sm90": gdn_decode_sm90.spec_decode}[kernel]
    x = inputs
    out = torch.empty_like(x["v"])
    ws = Workspace("cuda")
    return lambda: spec_decode(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["b"], x["dt_bias"], x["state"],
                               x["spec_state_indices"], x["num_accepted_tokens"], x["cu_seqlens"], out=out,
                               workspace=ws, **config)


def _fanout_bytes(shape: dict) -> int:
    """The source of the fan-out ceiling: read once and written T times, it moves the op's bytes."""
    return -(-cost.spec_decode(shape).bytes // (1 + shape["T"]))


def _fanout_cost(shape: dict) -> Cost:
    return gpu_ceilings.fanout_cost(_fanout_bytes(shape), shape["T"])


SPEC_SHAPES = {f"T={T},N={N},state={s}": dict(N=N, T=T, **HEADS, state_dtype=s, act="bfloat16")
               for T in (2, 4) for N in (32, 128) for s in ("float32", "bfloat16", "float16")}

register_bench(Bench(name=SPEC_BENCH, device="gpu", cost=cost.spec_decode, inputs=spec_inputs, reps=5,
                     shapes=SPEC_SHAPES))
register_impl(Impl(bench=SPEC_BENCH, name="triton-gdn", role="ours", prepare=spec_ours, available=gpu_capability))
register_impl(Impl(bench=SPEC_BENCH, name="triton-gdn-sm90", role="ours",
                   prepare=lambda shape, inputs: spec_ours(shape, inputs, kernel="sm90"), available=sm90_available))
register_impl(Impl(bench=SPEC_BENCH, name="gpu-copy", role="ceiling",
                   prepare=lambda shape, inputs: gpu_ceilings.triton_fanout(_fanout_bytes(shape), shape["T"]),
                   available=gpu_capability, cost=_fanout_cost))
register_impl(Impl(bench=SPEC_BENCH, name="gpu-copy-eager", role="ceiling",
                   prepare=lambda shape, inputs: gpu_ceilings.torch_copy(cost.spec_decode(shape).bytes // 2),
                   available=gpu_capability,
                   cost=lambda shape: gpu_ceilings.copy_cost(cost.spec_decode(shape).bytes // 2), timing="events"))


# ---------------------------------------------------------------- chunked prefill

CHUNKED_BENCH = "gdn/chunked-gpu"


def chunked_inputs(shape: dict, device: str = "cuda") -> dict:
    """Prefill arguments on ``device`` (the GPU) for sequences of ``shape["lens"]``: q, k, v, beta in
    ``shape["act"]``, g float32 in [-0.1, -0.001], beta in [0.1, 0.9], a pool of one slot per sequence in
    ``shape["state_dtype"]`` (slots a random permutation)."""
    import torch

    H, HV, K, V = (shape[k] for k in ("H", "HV", "K", "V"))
    lens = shape["lens"]
    T, N = sum(lens), len(lens)
    gen = torch.Generator(device=device).manual_seed(1)
    act = _dtype(shape["act"])

    def randn(*size, dtype=act, s=1.0):
        return (s * torch.randn(*size, generator=gen, device=device)).to(dtype)

    def uniform(lo, hi, dtype):
        return (lo + (hi - lo) * torch.rand(T, HV, generator=gen, device=device)).to(dtype)

    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(N)], dtype=torch.int32, device=device)
    return dict(q=randn(T, H, K), k=randn(T, H, K), v=randn(T, HV, V), g=-uniform(1e-3, 0.1, torch.float32),
                beta=uniform(0.1, 0.9, act), cu_seqlens=cu,
                state=randn(N, HV, K, V, dtype=_dtype(shape["state_dtype"]), s=0.1),
                state_indices=torch.randperm(N, generator=gen, device=device).to(torch.int32))


def chunked_ours(shape, inputs):
    """``Impl.prepare`` of our chunked prefill: the launcher's kernels (checks outside the captured call)."""
    import torch

    from optimized.triton.gdn_chunked import chunked

    x = inputs
    out = torch.empty_like(x["v"])
    return lambda: chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], x["cu_seqlens"], x["state"],
                           x["state_indices"], out=out)


def chunked_staged_cost(shape: dict) -> Cost:
    """The op's cost plus the bytes our stages pass through memory (``gdn_chunked.stage_bytes``)."""
    from optimized.triton.gdn_chunked import CHUNK, stage_bytes

    c = cost.chunked(shape)
    T = sum(shape["lens"])
    chunks = sum(-(-n // CHUNK) for n in shape["lens"])
    return Cost(bytes=c.bytes + stage_bytes(T, chunks, shape["HV"], shape["K"], shape["V"]), flops=c.flops)


def _chunked_copy_bytes(shape: dict) -> int:
    return cost.chunked(shape).bytes // 2


def _chunked_copy_cost(shape: dict) -> Cost:
    return gpu_ceilings.copy_cost(_chunked_copy_bytes(shape))


CHUNKED_SHAPES = {f"{name},state={s}": dict(lens=lens, **HEADS, state_dtype=s, act="bfloat16")
                  for s in ("bfloat16", "float32", "float16")      # the gates' bf16 pools first
                  for name, lens in (("T=8192", [8192]), ("varlen=4x2048", [2048] * 4))}

register_bench(Bench(name=CHUNKED_BENCH, device="gpu", cost=cost.chunked, inputs=chunked_inputs, reps=5,
                     shapes=CHUNKED_SHAPES))
register_impl(Impl(bench=CHUNKED_BENCH, name="triton-gdn", role="ours", prepare=chunked_ours,
                   available=gpu_capability, cost=chunked_staged_cost))
register_impl(Impl(bench=CHUNKED_BENCH, name="gpu-copy", role="ceiling",
                   prepare=lambda shape, inputs: gpu_ceilings.triton_copy(_chunked_copy_bytes(shape)),
                   available=gpu_capability, cost=_chunked_copy_cost))
register_impl(Impl(bench=CHUNKED_BENCH, name="gpu-copy-eager", role="ceiling",
                   prepare=lambda shape, inputs: gpu_ceilings.torch_copy(_chunked_copy_bytes(shape)),
                   available=gpu_capability, cost=_chunked_copy_cost, timing="events"))
register_impl(Impl(bench=CHUNKED_BENCH, name="gpu-matmul-bf16", role="ceiling", prepare=gpu_ceilings.matmul,
                   available=gpu_capability, cost=gpu_ceilings.matmul_cost, metric="tflops"))
