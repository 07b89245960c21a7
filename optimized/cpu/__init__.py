"""C++ GDN kernels for the CPU (AMX / AVX-512 / portable scalar), from the nanobind module ``_gdn``.

Conventions are ``reference.gdn``'s: q, k ``[T, H, K]``, v ``[T, HV, V]``, state pool
``[S, HV, K, V]`` updated in place (each slot contiguous, any slot stride), ``state_indices`` int32
with -1 for padding sequences (their output rows are zero, their slots untouched).
Inputs may be NumPy arrays (bf16 as ``ml_dtypes.bfloat16`` or as a uint16 view of the bits), torch
tensors (float32, bfloat16, float16) or JAX arrays; the state must be a writable NumPy array or
torch tensor. Everything computes in fp32; the state is stored in its own dtype, rounded to
nearest even once per write-back (decode / spec decode: every token; chunk prefill: every 64
tokens of a sequence and at its end). The chunk kernel rounds its GEMM operands to bf16
(``reference.gdn.numpy_ref.chunked(operand_dtype="bfloat16")``). ``o`` has ``out_dtype``
(default: q's dtype), in q's framework (JAX inputs give a JAX array).

``out``: None (a new array), or a preallocated output checked like the inputs: a writable NumPy
array or torch tensor (like q's framework; not JAX) of shape ``[T, HV, V]``, C-contiguous, in
``out_dtype`` (default: its own dtype, one of float32, bfloat16, float16).

``isa``: "auto" (best available), "amx", "avx512" or "scalar"; an ISA this CPU cannot run raises
ValueError. ``num_threads``: default all CPUs of this process, else an integer in ``[1, MAX_THREADS]``;
work is split over (sequence, head). Data arrays given as Python lists are refused (TypeError naming
the argument); index sequences (``state_indices``, ``cu_seqlens``, ...) as lists are converted to int32.
Scalars are checked as the references check them (``reference.gdn.arguments.scalars``), and so are
the gates: gate arguments whose g = -exp(A_log) softplus(a + dt_bias) overflows float32 are refused,
and so is a chunk-prefill ``g`` above 0 (a growth, not a decay). A NaN or Inf in a state slot the op
reads is not refused (looking would read the pool twice): it reaches that sequence's ``o`` and slot.
"""
from __future__ import annotations

import math
import numbers
import os

import numpy as np

from reference.arguments import array, indices
from reference.gdn.arguments import decays, gate_product, scalars

# KERNEL_LAB_GDN_MODULE names another build of the module to load instead (`make sanitize`: ASan + UBSan).
SANITIZED = os.environ.get("KERNEL_LAB_GDN_MODULE")


def _load_other_build(path: str):
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader("optimized.cpu._gdn", path)
    spec = importlib.util.spec_from_file_location("optimized.cpu._gdn", path, loader=loader)
    if spec is None:
        raise ImportError(f"KERNEL_LAB_GDN_MODULE={path}: not a loadable extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


try:
    if SANITIZED:
        _gdn = _load_other_build(SANITIZED)
    else:
        from optimized.cpu import _gdn
    BUILD_ERROR = ""
except ImportError as exc:  # not built: every entry point says so
    _gdn = None
    BUILD_ERROR = (f"the C++ extension optimized.cpu._gdn is not built ({exc}); "
                   "run `make extension`")

ISAS = ("amx", "avx512", "scalar")
# How decode walks the state (gdn_api.hpp, DecodePlan); every plan gives the same bits.
# KERNEL_LAB_GDN_DECODE_PLAN picks one (the probe bench.probes.gdn_decode_plans times each).
DECODE_PLANS = ("pipelined", "blocked", "blocked-keep")
DEFAULT_DECODE_PLAN = "pipelined"
_DTYPE_NAMES = ("float32", "bfloat16", "float16")

__all__ = ["gdn_gating", "gdn_decode", "gdn_spec_decode", "gdn_chunk_prefill", "isa_status", "dispatch_counts",
           "default_threads",
           "decode_plan", "DECODE_PLANS",
           "extension_status", "head_limits", "problem", "gemm_bf16", "ISAS"]


def extension_status() -> tuple[bool, str]:
    """(built, reason in words)."""
    return (_gdn is not None, BUILD_ERROR or "optimized.cpu._gdn is built")


def _ext():
    if _gdn is None:
        raise ImportError(BUILD_ERROR)
    return _gdn


def head_limits() -> dict[str, int]:
    """The head sizes the kernels take, as the extension states them: ``decode_max_head`` (decode and
    spec decode: K, V up to it), ``chunk_head_step`` and ``chunk_max_head`` (chunk prefill: K, V
    multiples of the step up to the maximum)."""
    ext = _ext()
    return {"decode_max_head": ext.DECODE_MAX_HEAD, "chunk_head_step": ext.CHUNK_HEAD_STEP,
            "chunk_max_head": ext.CHUNK_MAX_HEAD}


def problem(op: str, K: int, V: int) -> str | None:
    """Why the kernels cannot serve an ``op`` ("decode", "spec_decode", "chunk_prefill" or "gating") of
    head sizes ``K``, ``V``, or None; the limits are ``head_limits()``, and an unbuilt extension is
    the reason itself."""
    if _gdn is None:
        return BUILD_ERROR
    limits = head_limits()
    if op == "chunk_prefill":
        step, top = limits["chunk_head_step"], limits["chunk_max_head"]
        if K % step or V % step or K > top or V > top:
            return f"the chunk kernel needs K, V multiples of {step} up to {top} (K={K}, V={V})"
    elif op in ("decode", "spec_decode"):
        top = limits["decode_max_head"]
        if K > top or V > top:
            return f"decode kernels take K, V up to {top} (K={K}, V={V})"
    elif op != "gating":
        raise ValueError(f"op: expected decode, spec_decode, chunk_prefill or gating, got {op!r}")
    return None


def isa_status() -> dict[str, tuple[bool, str]]:
    """{isa: (available, reason)} for amx, avx512, scalar (probing AMX asks for tile permission)."""
    if _gdn is None:
        return {isa: (False, BUILD_ERROR) for isa in ISAS}
    return dict(_gdn.isa_status())


def dispatch_counts() -> dict[str, int]:
    """{isa: calls this process dispatched to that ISA build} for amx, avx512, scalar, as the
    extension counts them (gating has one portable build and counts as scalar); the difference
    over a call says which build ran it."""
    return dict(_ext().dispatch_counts())


# ---------------------------------------------------------------- array plumbing

def _framework(x) -> str:
    mod = type(x).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return "jax"
    return "numpy"


def _dtype_name(x) -> str:
    """float32 / bfloat16 / float16 / other, for NumPy, ml_dtypes, torch and JAX arrays."""
    name = str(x.dtype).replace("torch.", "")
    return "bfloat16" if name == "uint16" else name


def _kernel_inputs(**arrays) -> list:
    """The arguments as nanobind takes them (ml_dtypes bf16 NumPy arrays as uint16 views), after
    refusing non-arrays and empty arrays by name (they never reach the extension)."""
    out = []
    for name, x in arrays.items():
        array(name, x)
        if int(np.prod(x.shape)) == 0:
            raise ValueError(f"{name}: zero-length array of shape {tuple(x.shape)}; nothing to compute")
        out.append(x.view(np.uint16) if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16" else x)
    return out


def _writable(name: str, x, what: str):
    """``x`` as the kernel writes it: refused (by name) unless a writable NumPy array or torch tensor."""
    array(name, x)
    if _framework(x) == "jax":
        raise TypeError(f"{name}: JAX arrays are immutable; pass a writable NumPy array or torch tensor ({what})")
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"{name}: the NumPy array is read-only; {what}")
    return _kernel_inputs(**{name: x})[0]


def _kernel_state(state):
    return _writable("state", state, "the pool is updated in place")


def _index_inputs(**sequences) -> list:
    """Index arguments for the kernel: Python lists of integers converted to int32 arrays."""
    return _kernel_inputs(**{name: indices(name, x) for name, x in sequences.items()})


def _output(q, shape, out_dtype, out=None):
    """(array handed to the kernel, array returned to the caller) of ``shape`` in q's framework, or
    the caller's ``out`` (its shape, dtype and strides are checked by the extension)."""
    if out is not None:
        if out_dtype is not None and _dtype_name(out) != str(out_dtype).replace("torch.", ""):
            raise ValueError(f"out: dtype {_dtype_name(out)} differs from out_dtype {out_dtype!r}")
        if _framework(out) != _framework(q) and _framework(q) != "jax":
            raise TypeError(f"out: expected a {_framework(q)} array like q, got {type(out).__name__}")
        return _writable("out", out, "the output is written in place"), out
    name = _dtype_name(q) if out_dtype is None else str(out_dtype).replace("torch.", "")
    if out_dtype is None and name not in _DTYPE_NAMES:
        raise TypeError(f"q: expected float32, bfloat16 (or a uint16 view of bf16 bits) or float16, got {name}")
    if name not in _DTYPE_NAMES:
        raise ValueError(f"out_dtype: expected one of {_DTYPE_NAMES} or None (q's dtype), got {out_dtype!r}")
    if _framework(q) == "torch":
        import torch
        out = torch.zeros(shape, dtype=getattr(torch, name))
        return out, out
    if name == "bfloat16":
        import ml_dtypes
        out = np.zeros(shape, ml_dtypes.bfloat16)
        if isinstance(q, np.ndarray) and q.dtype == np.uint16:
            out = out.view(np.uint16)  # uint16-view in, uint16-view out
    else:
        out = np.zeros(shape, name)
    return (out.view(np.uint16) if out.dtype.name == "bfloat16" else out), out


def _returned(q, out):
    if _framework(q) == "jax":
        import jax.numpy as jnp
        return jnp.asarray(out)
    return out


def _scalars(scale, l2norm_eps, K: int) -> tuple[float, float]:
    """(scale, l2norm_eps) as the kernel takes them, checked as the references check them."""
    scalars(scale, l2norm_eps)
    return (1.0 / math.sqrt(K) if scale is None else float(scale)), float(l2norm_eps)


def default_threads() -> int:
    """The default num_threads: the CPUs this process may run on."""
    return _ext().default_threads()


def _threads(num_threads) -> int:
    """None: ``default_threads()``; else an integer in ``[1, MAX_THREADS]`` (ValueError naming it)."""
    if num_threads is None:
        return default_threads()
    most = _ext().MAX_THREADS
    if isinstance(num_threads, bool) or not isinstance(num_threads, numbers.Integral) or not 1 <= num_threads <= most:
        raise ValueError(f"num_threads: expected an integer in [1, {most}], got {num_threads!r}")
    return int(num_threads)


def _host_f32(x) -> np.ndarray:
    """A float32 NumPy copy of an array of any accepted framework (bf16 uint16 views decoded)."""
    if _framework(x) == "torch":
        return x.detach().float().cpu().numpy()
    a = np.asarray(x)
    if a.dtype == np.uint16:
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def decode_plan() -> str:
    """The decode plan of this process: KERNEL_LAB_GDN_DECODE_PLAN if set (one of DECODE_PLANS, else
    ValueError naming the variable), else DEFAULT_DECODE_PLAN."""
    plan = os.environ.get("KERNEL_LAB_GDN_DECODE_PLAN") or DEFAULT_DECODE_PLAN
    if plan not in DECODE_PLANS:
        raise ValueError(f"KERNEL_LAB_GDN_DECODE_PLAN: expected one of {DECODE_PLANS}, got {plan!r}")
    return plan


def _gates(A_log, a, dt_bias) -> None:
    """Refuse gate arguments whose gate overflows float32 (shapes are the extension's to check)."""
    for name, x in (("A_log", A_log), ("a", a), ("dt_bias", dt_bias)):
        array(name, x)
    if len(a.shape) == 2 and tuple(A_log.shape) == tuple(dt_bias.shape) == (a.shape[1],):
        gate_product(_host_f32(A_log), _host_f32(a), _host_f32(dt_bias))


def _shape(x, name: str, ndim: int) -> tuple:
    array(name, x)
    shape = tuple(int(d) for d in x.shape)
    if len(shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {shape}")
    return shape


# ---------------------------------------------------------------- the ops

def gdn_gating(A_log, a, b, dt_bias):
    """g = -exp(A_log) softplus(a + dt_bias) (threshold 20), beta = sigmoid(b): float32 [T, HV] each,
    as NumPy arrays (torch tensors when ``a`` is one)."""
    ext = _ext()
    T, HV = _shape(a, "a", 2)
    _gates(A_log, a, dt_bias)
    g, beta = np.zeros((T, HV), np.float32), np.zeros((T, HV), np.float32)
    ext.gdn_gating(*_kernel_inputs(A_log=A_log, a=a, b=b, dt_bias=dt_bias), g, beta)
    if _framework(a) == "torch":
        import torch
        return torch.from_numpy(g), torch.from_numpy(beta)
    return _returned(a, g), _returned(a, beta)


def gdn_decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, *, scale=None, use_qk_l2norm=True,
               l2norm_eps=1e-6, out_dtype=None, out=None, isa="auto", num_threads=None):
    """One token per sequence with fused gating: q, k [N, H, K], v [N, HV, V], a, b [N, HV],
    A_log, dt_bias [HV], state_indices int32 [N]. Returns o [N, HV, V]; the state is rounded
    after the token (the output uses the fp32 state)."""
    ext = _ext()
    N, _, K = _shape(q, "q", 3)
    _, HV, V = _shape(v, "v", 3)
    scale, l2norm_eps = _scalars(scale, l2norm_eps, K)
    _gates(A_log, a, dt_bias)
    kernel_out, out = _output(q, (N, HV, V), out_dtype, out)
    ext.gdn_decode(*_kernel_inputs(q=q, k=k, v=v, A_log=A_log, a=a, b=b, dt_bias=dt_bias), _kernel_state(state),
                   *_index_inputs(state_indices=state_indices), kernel_out, scale, bool(use_qk_l2norm),
                   l2norm_eps, str(isa), _threads(num_threads), decode_plan())
    return _returned(q, out)


def gdn_spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                    cu_seqlens, *, scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, out_dtype=None, out=None,
                    isa="auto", num_threads=None):
    """Speculative decode over packed drafts: q, k [T, H, K], v [T, HV, V], a, b [T, HV],
    spec_state_indices int32 [N, S], num_accepted_tokens int32 [N], cu_seqlens int32 [N+1].
    Sequence n resumes from slot spec_state_indices[n, max(acc-1, 0)] (-1: padding) and stores
    the state after its token t (rounded) into spec_state_indices[n, t]. Returns o [T, HV, V]."""
    ext = _ext()
    T, _, K = _shape(q, "q", 3)
    _, HV, V = _shape(v, "v", 3)
    scale, l2norm_eps = _scalars(scale, l2norm_eps, K)
    _gates(A_log, a, dt_bias)
    kernel_out, out = _output(q, (T, HV, V), out_dtype, out)
    ext.gdn_spec_decode(*_kernel_inputs(q=q, k=k, v=v, A_log=A_log, a=a, b=b, dt_bias=dt_bias),
                        _kernel_state(state),
                        *_index_inputs(spec_state_indices=spec_state_indices,
                                       num_accepted_tokens=num_accepted_tokens, cu_seqlens=cu_seqlens),
                        kernel_out, scale, bool(use_qk_l2norm), l2norm_eps, str(isa), _threads(num_threads))
    return _returned(q, out)


def gdn_chunk_prefill(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
                      l2norm_eps=1e-6, out_dtype=None, out=None, isa="auto", num_threads=None):
    """Chunked prefill (chunk 64): q, k [T, H, K], v [T, HV, V], g float32 [T, HV], beta [T, HV],
    cu_seqlens int32 [N+1] (strictly increasing), state_indices int32 [N]; K, V multiples of 32 up
    to 256. Returns o [T, HV, V]; the state is rounded at every chunk end and at sequence end."""
    ext = _ext()
    T, _, K = _shape(q, "q", 3)
    _, HV, V = _shape(v, "v", 3)
    scale, l2norm_eps = _scalars(scale, l2norm_eps, K)
    array("g", g)
    decays(_host_f32(g))
    kernel_out, out = _output(q, (T, HV, V), out_dtype, out)
    ext.gdn_chunk_prefill(*_kernel_inputs(q=q, k=k, v=v, g=g, beta=beta), *_index_inputs(cu_seqlens=cu_seqlens),
                          _kernel_state(state), *_index_inputs(state_indices=state_indices), kernel_out, scale,
                          bool(use_qk_l2norm), l2norm_eps, str(isa), _threads(num_threads))
    return _returned(q, out)


# ---------------------------------------------------------------- test hooks

def gemm_bf16(a: np.ndarray, b: np.ndarray, isa: str = "auto") -> np.ndarray:
    """bf16(a) @ bf16(b) with fp32 accumulation through one ISA's packing and GEMM (float32 in/out;
    M, N, Kd multiples of 32)."""
    a, b = np.asarray(a), np.asarray(b)
    c = np.zeros((a.shape[0], b.shape[-1]), np.float32)
    _ext().gemm_bf16(str(isa), a, b, c)
    return c
