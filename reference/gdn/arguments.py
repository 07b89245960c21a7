"""Validation of GDN reference arguments, shared by ``numpy_ref`` and ``jax_ref`` and reused by the launchers.

Only shapes, dtypes and values are checked here (host-side NumPy); the math lives in the two references.
Every error names the argument and what was expected.

The gate contract, the same for every GDN implementation (the family's refusal table,
``conformance.families.gdn.REFUSALS``, holds each one to it): every log-decay g, given (recurrent, chunked:
``decays``) or computed in float32 as -exp(A_log) softplus(a + dt_bias) (gating, decode, spec_decode:
``gate_product``), lies in [``G_MIN``, 0]. Above 0 it is a growth, not a decay (the state blows up); below
``G_MIN`` = -float32 max / 64 the sum of one 64-token chunk's log-decays (the chunked form's cumulative
decay) overflows float32 and exp(G_i - G_j) is NaN. exp(A_log) and a + dt_bias must be finite in float32.
Nothing else is refused: softplus(x) = x above 20, so a + dt_bias of 100 or 10^4 gives g = -exp(A_log) x,
far inside the range, and a g of -10^30 decays the state to 0 as the math says.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from reference.arguments import array, indices

# the NumPy dtype of a state pool, per state_dtype name
POOL_DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16),
               "float16": np.dtype(np.float16)}
COMPUTE_DTYPES = {"float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
OPERAND_DTYPES = ("float32", "bfloat16", "float16")
ROUNDING_POINTS = ("cpu", "fla")
FP32_MAX = float(np.finfo(np.float32).max)
CHUNK = 64                     # tokens of the chunked form's chunk
G_MIN = -FP32_MAX / CHUNK      # the most negative log-decay: a chunk's sum stays finite in float32


@dataclass(frozen=True)
class Dims:
    T: int
    H: int
    HV: int
    K: int
    V: int
    N: int      # sequences
    slots: int  # state pool size S


def state_dtype(name: str) -> np.dtype:
    if name not in POOL_DTYPES:
        raise ValueError(f"state_dtype: expected one of {sorted(POOL_DTYPES)}, got {name!r}")
    return POOL_DTYPES[name]


def compute_dtype(name: str) -> np.dtype:
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype: expected one of {sorted(COMPUTE_DTYPES)}, got {name!r}")
    return COMPUTE_DTYPES[name]


def operand_dtype(name: str) -> str:
    if name not in OPERAND_DTYPES:
        raise ValueError(f"operand_dtype: expected one of {list(OPERAND_DTYPES)}, got {name!r}")
    return name


def rounding_points(name: str, operand_dtype_name: str) -> str:
    if name not in ROUNDING_POINTS:
        raise ValueError(f"rounding_points: expected one of {list(ROUNDING_POINTS)}, got {name!r}")
    if name != "cpu" and operand_dtype_name == "float32":
        raise ValueError(f"rounding_points: {name!r} places 16-bit roundings; it needs operand_dtype "
                         "'bfloat16' or 'float16'")
    return name


def segment_chunks(value, fla: bool) -> int:
    """Chunks per segment of a segmented chunked pass: a positive int (not with FLA's rounding points)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"segment_chunks: expected None or a positive int (chunks per segment), got {value!r}")
    if fla:
        raise ValueError("segment_chunks: segments are modelled at the 'cpu' rounding points, not 'fla'")
    return int(value)


def _floating(name: str, x, ndim: int) -> None:
    array(name, x)
    dt = np.dtype(x.dtype)
    if not (dt.kind == "f" or dt.name == "bfloat16"):
        raise TypeError(f"{name}: expected a floating array, got dtype {dt.name}")
    if len(x.shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")


def _finite(name: str, x) -> None:
    if not np.all(np.isfinite(np.asarray(x, dtype=np.float32))):
        raise ValueError(f"{name}: contains NaN or Inf")


def _integer(name: str, x, ndim: int) -> np.ndarray:
    a = np.asarray(indices(name, x))
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected an integer array (int32), got dtype {a.dtype.name}")
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    return a.astype(np.int64)


def cu_seqlens(cu, T: int) -> np.ndarray:
    """Checked cumulative sequence offsets ``[N+1]``: start 0, strictly increasing, end T."""
    cu = _integer("cu_seqlens", cu, 1)
    if cu.size < 2:
        raise ValueError(f"cu_seqlens: expected at least 2 entries [N+1], got {cu.size}")
    if cu[0] != 0 or cu[-1] != T:
        raise ValueError(f"cu_seqlens: expected to start at 0 and end at T={T}, got {cu[0]}..{cu[-1]}")
    if np.any(np.diff(cu) <= 0):
        raise ValueError("cu_seqlens: expected strictly increasing offsets (no empty sequence)")
    return cu


def slot_indices(name: str, idx, shape: tuple, slots: int) -> np.ndarray:
    """Checked slot indices: in [-1, slots), valid slots distinct (two writers would race)."""
    idx = _integer(name, idx, len(shape))
    if idx.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {idx.shape}")
    if np.any((idx < -1) | (idx >= slots)):
        raise ValueError(f"{name}: slot index out of range [-1, {slots}) (got {idx.min()}..{idx.max()})")
    used = idx[idx >= 0]
    if np.unique(used).size != used.size:
        raise ValueError(f"{name}: a slot appears twice")
    return idx


def gating(A_log, a, b, dt_bias) -> int:
    """Check gating arguments; returns HV."""
    _floating("A_log", A_log, 1)
    HV = A_log.shape[0]
    for name, x in (("a", a), ("b", b)):
        _floating(name, x, 2)
        if x.shape[1] != HV:
            raise ValueError(f"{name}: expected shape [T, HV={HV}], got {tuple(x.shape)}")
        if x.shape[0] == 0:
            raise ValueError(f"{name}: zero-length (T=0)")
    if a.shape != b.shape:
        raise ValueError(f"b: expected the shape of a {tuple(a.shape)}, got {tuple(b.shape)}")
    _floating("dt_bias", dt_bias, 1)
    if dt_bias.shape != (HV,):
        raise ValueError(f"dt_bias: expected shape [HV={HV}], got {tuple(dt_bias.shape)}")
    for name, x in (("A_log", A_log), ("a", a), ("b", b), ("dt_bias", dt_bias)):
        _finite(name, x)
    gate_product(np.asarray(A_log, np.float32), np.asarray(a, np.float32), np.asarray(dt_bias, np.float32))
    return HV


def gate_product(A_log: np.ndarray, a: np.ndarray, dt_bias: np.ndarray) -> None:
    """ValueError naming the gate arguments unless exp(A_log) and a + dt_bias are finite in float32 and
    g = -exp(A_log) * softplus(a + dt_bias) is at least ``G_MIN`` (the gate contract: the kernels compute g in
    float32, where an overflow gives -Inf, or NaN as Inf * 0, that poisons the state). Float32 host arrays
    A_log, dt_bias [HV], a [T, HV]."""
    x = a.astype(np.float64) + dt_bias.astype(np.float64)
    softplus = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    decay = np.exp(A_log.astype(np.float64))
    g = decay * softplus
    if decay.max(initial=0.0) > FP32_MAX or np.max(np.abs(x), initial=0.0) > FP32_MAX or \
            g.max(initial=0.0) > -G_MIN:
        raise ValueError(f"A_log, a, dt_bias: the gate -exp(A_log) * softplus(a + dt_bias) overflows float32 "
                         f"(largest exp(A_log) {decay.max(initial=0.0):.4g}, |a + dt_bias| "
                         f"{np.max(np.abs(x), initial=0.0):.4g}, |g| {g.max(initial=0.0):.4g}; float32 holds "
                         f"{FP32_MAX:.4g}, and a 64-token chunk's sum of g must too: |g| <= {-G_MIN:.4g})")


def decays(g) -> None:
    """ValueError naming ``g`` unless every log-decay is finite and in [``G_MIN``, 0] (the gate contract:
    exp(g) <= 1, the state decays; a 64-token chunk's sum of g is finite in float32)."""
    g = np.asarray(g, np.float32)
    if not np.all(np.isfinite(g)):
        raise ValueError("g: contains NaN or Inf")
    largest = float(np.max(g, initial=-np.inf))
    if largest > 0:
        raise ValueError(f"g: expected log-decays <= 0 (exp(g) <= 1), got a largest value {largest:.4g}")
    smallest = float(np.min(g, initial=0.0))
    if smallest < G_MIN:
        raise ValueError(f"g: expected log-decays >= {G_MIN:.4g} (a 64-token chunk's sum must be finite in "
                         f"float32), got a smallest value {smallest:.4g}")


def qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """Check q [T,H,K], k [T,H,K], v [T,HV,V]; returns (T, H, HV, K, V)."""
    dims = qkv_shapes(q, k, v)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _finite(name, x)
    return dims


def qkv_shapes(q, k, v) -> tuple[int, int, int, int, int]:
    """The shape and dtype checks of ``qkv``, no value read (q, k, v: anything with a shape and a dtype,
    a file's headers included); returns (T, H, HV, K, V)."""
    _floating("q", q, 3)
    _floating("k", k, 3)
    _floating("v", v, 3)
    T, H, K = q.shape
    if T == 0:
        raise ValueError("q: zero-length (T=0)")
    if k.shape != q.shape:
        raise ValueError(f"k: expected the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[0] != T:
        raise ValueError(f"v: expected T={T} tokens, got shape {tuple(v.shape)}")
    HV, V = v.shape[1], v.shape[2]
    if K == 0 or V == 0 or H == 0 or HV == 0:
        raise ValueError(f"q/v: zero-sized head or head dim (q {tuple(q.shape)}, v {tuple(v.shape)})")
    if HV % H != 0:
        raise ValueError(f"v: HV={HV} value heads is not a multiple of H={H} key heads")
    return T, H, HV, K, V


def pool(state, state_dtype_name: str, HV: int, K: int, V: int) -> int:
    """Check the state pool [S, HV, K, V] in the named dtype; returns S."""
    array("state", state)
    expected = state_dtype(state_dtype_name)
    if np.dtype(state.dtype) != expected:
        raise TypeError(f"state: expected dtype {expected.name} (state_dtype), got {np.dtype(state.dtype).name}")
    if len(state.shape) != 4 or tuple(state.shape[1:]) != (HV, K, V):
        raise ValueError(f"state: expected shape [S, HV={HV}, K={K}, V={V}], got {tuple(state.shape)}")
    return state.shape[0]


def per_token(name: str, x, T: int, HV: int) -> None:
    _floating(name, x, 2)
    if tuple(x.shape) != (T, HV):
        raise ValueError(f"{name}: expected shape [T={T}, HV={HV}], got {tuple(x.shape)}")
    _finite(name, x)


def _real(name: str, x) -> None:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected a real number, got {type(x).__name__}")


def scalars(scale, l2norm_eps) -> None:
    """``scale`` None or a positive number finite in float32 (the kernels scale in float32),
    ``l2norm_eps`` a finite number >= 0."""
    if scale is not None:
        _real("scale", scale)
        if not (np.isfinite(scale) and 0 < scale <= FP32_MAX):
            raise ValueError(f"scale: expected a positive finite number, at most float32's largest "
                             f"{FP32_MAX:.8g}, or None, got {scale!r}")
    _real("l2norm_eps", l2norm_eps)
    if not (np.isfinite(l2norm_eps) and l2norm_eps >= 0):
        raise ValueError(f"l2norm_eps: expected a finite number >= 0, got {l2norm_eps!r}")


def interval(value, chunk_size: int | None = None) -> int:
    """Check ``state_write_interval``; for the chunked form it must be a multiple of the chunk."""
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"state_write_interval: expected an integer >= 1, got {value!r}")
    if chunk_size is not None and value % chunk_size != 0:
        raise ValueError(f"state_write_interval: the chunked form rounds only at chunk ends; expected a "
                         f"multiple of chunk_size={chunk_size}, got {value}")
    return int(value)


def chunk(chunk_size) -> int:
    if not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected an integer >= 1, got {chunk_size!r}")
    return int(chunk_size)


def varlen(q, k, v, g, beta, cu, state, state_indices, state_dtype_name, scale, l2norm_eps):
    """All checks of recurrent/chunked; returns (Dims, cu_seqlens int64, state_indices int64)."""
    T, H, HV, K, V = qkv(q, k, v)
    per_token("g", g, T, HV)
    decays(g)
    per_token("beta", beta, T, HV)
    cu = cu_seqlens(cu, T)
    S = pool(state, state_dtype_name, HV, K, V)
    idx = slot_indices("state_indices", state_indices, (cu.size - 1,), S)
    scalars(scale, l2norm_eps)
    return Dims(T, H, HV, K, V, cu.size - 1, S), cu, idx


def _gates_match(gate_heads: int, a, T: int, HV: int) -> None:
    if gate_heads != HV:
        raise ValueError(f"A_log: expected HV={HV} value heads (v has {HV}), got {gate_heads}")
    if a.shape[0] != T:
        raise ValueError(f"a: expected one row per token [T={T}, HV], got {tuple(a.shape)}")


def decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, state_dtype_name, scale, l2norm_eps):
    """Checks of decode (one token per sequence, T = N); returns (Dims, state_indices)."""
    T, H, HV, K, V = qkv(q, k, v)
    _gates_match(gating(A_log, a, b, dt_bias), a, T, HV)
    S = pool(state, state_dtype_name, HV, K, V)
    idx = slot_indices("state_indices", state_indices, (T,), S)
    scalars(scale, l2norm_eps)
    return Dims(T, H, HV, K, V, T, S), idx


def spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                cu, state_dtype_name, scale, l2norm_eps):
    """Checks of spec_decode; returns (Dims, cu, spec_state_indices, num_accepted, start slots)."""
    T, H, HV, K, V = qkv(q, k, v)
    _gates_match(gating(A_log, a, b, dt_bias), a, T, HV)
    S = pool(state, state_dtype_name, HV, K, V)
    cu, spec, acc, start = spec_tables(cu, spec_state_indices, num_accepted_tokens, T, S)
    scalars(scale, l2norm_eps)
    return Dims(T, H, HV, K, V, cu.size - 1, S), cu, spec, acc, start


def spec_tables(cu, spec_state_indices, num_accepted_tokens, T: int, S: int):
    """Checks of spec_decode's index tables for T tokens and a pool of S slots; returns (cu_seqlens,
    spec_state_indices, num_accepted_tokens, start slots), int64."""
    cu = cu_seqlens(cu, T)
    N = cu.size - 1
    spec = _integer("spec_state_indices", spec_state_indices, 2)
    if spec.shape[0] != N:
        raise ValueError(f"spec_state_indices: expected [N={N}, S], got {spec.shape}")
    spec = slot_indices("spec_state_indices", spec, spec.shape, S)
    acc = _integer("num_accepted_tokens", num_accepted_tokens, 1)
    if acc.shape != (N,):
        raise ValueError(f"num_accepted_tokens: expected shape [N={N}], got {acc.shape}")
    if np.any((acc < 0) | (acc > spec.shape[1])):
        raise ValueError(f"num_accepted_tokens: expected values in [0, {spec.shape[1]}], got {acc}")
    lens = np.diff(cu)
    if np.any(lens > spec.shape[1]):
        raise ValueError(f"cu_seqlens: a sequence has more tokens than spec_state_indices has columns "
                         f"({lens.max()} > {spec.shape[1]})")
    start = spec[np.arange(N), np.maximum(acc - 1, 0)]
    for n in np.flatnonzero(start >= 0):
        if np.any(spec[n, :lens[n]] < 0):
            raise ValueError(f"spec_state_indices: sequence {n} has a padding slot (-1) among the "
                             f"columns of its {lens[n]} tokens")
    return cu, spec, acc, start
