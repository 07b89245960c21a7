"""GDN token-by-token kernels (``reference.gdn.numpy_ref``'s ``decode``, ``spec_decode`` and
``recurrent``) for CUDA and ROCm GPUs, and for the CPU through ``TRITON_INTERPRET=1``.

- ``decode``: one token per sequence, sigmoid gating fused in (g = -exp(A_log) softplus(a + dt_bias),
  beta = sigmoid(b)); the pool ``[S, HV, K, V]`` is updated in place at ``state_indices`` (-1: padding:
  no slot read or written, its output rows zero, as the reference writes them).
- ``spec_decode``: draft tokens of packed sequences (``cu_seqlens``), resumed from slot
  ``spec_state_indices[n, max(num_accepted_tokens[n] - 1, 0)]``; the state after draft token t is
  stored into ``spec_state_indices[n, t]`` and token t + 1 continues from the stored value.
- ``recurrent``: packed sequences with g and beta given; the carried state is rounded to the pool's
  dtype after token t when ``(t + 1) % state_write_interval == 0`` or t is the sequence's last.

One program per (sequence, value head hv, V-tile of BV columns): value head hv reads key head
hv // (HV // H); the [K, BV] block of the state is loaded once in its storage dtype (float32,
bfloat16, float16) and kept in fp32 registers; gating, the l2 norm of q and k (eps added to the sum
of squares), the decay, the delta-rule update and the readout are fp32; each write-back stores every
element once, rounded to nearest even (the conversion instruction on a GPU; in the interpreter, whose
fp32 -> bf16 conversion truncates, bfloat16 through its bits). o is written in ``out``'s dtype (default: q's), rounded to nearest even once.
Rounding model "exact".

Inputs are checked before launch (``ValueError``/``TypeError`` naming the argument): shapes, dtypes,
device, strides (last dimension contiguous; a pool slot contiguous), outputs overlapping inputs or
the pool, slot tables, NaN/Inf activations and scalars, log-decays outside the gate contract
(``reference.gdn.arguments``: g in [G_MIN, 0], exp(A_log) and a + dt_bias finite; checked on the device as the
kernel computes g), all before the pool is touched. The checks that read values copy the index
tables to the host and read one flag buffer of ``Workspace``; they are skipped while a CUDA graph is
captured (a captured call replays the shapes a checked call validated). With a ``Workspace`` and
``out`` given, ``decode`` allocates nothing on the device.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.checks import (FLOAT_DTYPES, capturing, check_no_overlap, check_output, check_positive,
                                     check_tensor, index_tensor)
from optimized.triton.tq_decode_launch import interpreting

SUPPORTED_POOL_DTYPES = ("float32", "bfloat16", "float16")
MAX_HEAD = 256
WARPS = (1, 2, 4, 8, 16)
# The default tile on a GPU, BK * BV = 4096 elements (16 KiB of fp32 state) in 2 warps: the fastest of BV 16, 32,
# 64 x 2, 4, 8 warps at K = V = 128 on the H200 for fp32 and bf16 pools (ledger/h200/README.md)
TILE_ELEMENTS = 4096
FLAGS = 8                     # NaN/Inf flags of one launch's float inputs, the last one its log-decays
DECAY_BLOCK = 1024            # log-decays per program of the decay check


def problem(*, K: int, V: int, state_dtype: str, act: str, H: int | None = None, HV: int | None = None,
            device=None) -> str | None:
    """Why these kernels cannot serve a call with head sizes K, V, a pool of ``state_dtype`` and
    activations of ``act`` (dtype names), H key and HV value heads; None when they can. Any
    ``device`` Triton runs on is served (a GPU, or the CPU through the interpreter)."""
    if not 1 <= K <= MAX_HEAD:
        return f"q: key head size K={K} is outside [1, {MAX_HEAD}]"
    if not 1 <= V <= MAX_HEAD:
        return f"v: value head size V={V} is outside [1, {MAX_HEAD}]"
    if state_dtype not in SUPPORTED_POOL_DTYPES:
        return f"state: dtype {state_dtype} is not one of {SUPPORTED_POOL_DTYPES}"
    if act not in FLOAT_DTYPES:
        return f"q: dtype {act} is not one of {FLOAT_DTYPES}"
    if H is not None and HV is not None and (H < 1 or HV % H):
        return f"v: HV={HV} value heads is not a multiple of H={H} key heads"
    return None


class Workspace:
    """The flag buffer of the value checks (int32 [FLAGS]), allocated once and reused, so a decode
    with ``out`` given allocates nothing on the device."""

    def __init__(self, device="cuda"):
        import torch

        self.flags = torch.zeros(FLAGS, dtype=torch.int32, device=device)


# ---------------------------------------------------------------- the kernels

@triton.jit
def _rounded(x, ptr, BF16_BITS: tl.constexpr):
    """fp32 ``x`` in the element type of ``ptr``, rounded to nearest even: the conversion instruction on a
    GPU; with BF16_BITS (the interpreter, whose fp32 -> bf16 conversion truncates) bf16 through its bits."""
    if BF16_BITS and ptr.dtype.element_ty == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(ptr.dtype.element_ty)


@triton.jit
def _log1p(y):
    """log(1 + y) for y >= 0, accurate for small y (Goldberg: log(w) * y / (w - 1), w = 1 + y)."""
    w = 1.0 + y
    return tl.where(w == 1.0, y, tl.log(w) * (y / tl.where(w == 1.0, 1.0, w - 1.0)))


@triton.jit
def _gdn_kernel(q_ptr, k_ptr, v_ptr, x_ptr, y_ptr, A_log_ptr, dt_bias_ptr, state_ptr, table_ptr, cu_ptr, acc_ptr,
                o_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sx_t, sy_t, so_t, so_h, s_slot, s_table, interval,
                scale, eps, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                BK: tl.constexpr, BV: tl.constexpr, GATED: tl.constexpr, SPEC: tl.constexpr,
                VARLEN: tl.constexpr, L2NORM: tl.constexpr, BF16_BITS: tl.constexpr):
    """One program per (sequence n, value head hv, V-tile). Tokens: n (not VARLEN) or cu[n]..cu[n+1].
    GATED: x, y are a and b (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)), else g and beta.
    SPEC: resume from slot table[n, max(acc[n] - 1, 0)] and store after token t into table[n, t];
    else from slot table[n], the carried state rounded after every ``interval``-th token, stored (rounded)
    once after the last. The per-token work is written out here rather than in helpers: the
    interpreter pays milliseconds for every call of a jit function."""
    NV: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0)
    vt = pid % NV
    n = pid // NV // HV
    hv = pid // NV % HV
    row = table_ptr + n.to(tl.int64) * s_table
    if VARLEN:
        bos = tl.load(cu_ptr + n).to(tl.int64)
        length = tl.load(cu_ptr + n + 1).to(tl.int64) - bos
    else:
        bos = n.to(tl.int64)
        length = 1
    if SPEC:
        slot = tl.load(row + tl.maximum(tl.load(acc_ptr + n) - 1, 0)).to(tl.int64)
    else:
        slot = tl.load(row).to(tl.int64)
    if slot >= 0:
        kk = tl.arange(0, BK)
        vv = vt * BV + tl.arange(0, BV)
        km = kk < K
        vm = vv < V
        m2 = km[:, None] & vm[None, :]
        tile = hv * (K * V) + kk[:, None] * V + vv[None, :]
        S = tl.load(state_ptr + slot * s_slot + tile, mask=m2, other=0.0).to(tl.float32)
        h = hv // (HV // H)
        if GATED:
            A = tl.exp(tl.load(A_log_ptr + hv).to(tl.float32))
            dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
        for t in range(0, length):
            i = bos + t
            q = tl.load(q_ptr + i * sq_t + h * sq_h + kk, mask=km, other=0.0).to(tl.float32)
            k = tl.load(k_ptr + i * sk_t + h * sk_h + kk, mask=km, other=0.0).to(tl.float32)
            if L2NORM:
                q = tl.math.div_rn(q, tl.sqrt_rn(tl.sum(q * q, axis=0) + eps))
                k = tl.math.div_rn(k, tl.sqrt_rn(tl.sum(k * k, axis=0) + eps))
            q = q * scale
            v = tl.load(v_ptr + i * sv_t + hv * sv_h + vv, mask=vm, other=0.0).to(tl.float32)
            x = tl.load(x_ptr + i * sx_t + hv).to(tl.float32)
            y = tl.load(y_ptr + i * sy_t + hv).to(tl.float32)
            if GATED:
                x = x + dt_bias
                g = -A * tl.where(x > 20.0, x, _log1p(tl.exp(tl.minimum(x, 20.0))))
                beta = 1.0 / (1.0 + tl.exp(-y))
            else:
                g = x
                beta = y
            S = S * tl.exp(g)
            u = beta * (v - tl.sum(S * k[:, None], axis=0))
            S = S + k[:, None] * u[None, :]
            o = tl.sum(S * q[:, None], axis=0)
            tl.store(o_ptr + i * so_t + hv * so_h + vv, _rounded(o, o_ptr, BF16_BITS), mask=vm)
            if SPEC:
                stored = _rounded(S, state_ptr, BF16_BITS)
                tl.store(state_ptr + tl.load(row + t).to(tl.int64) * s_slot + tile, stored, mask=m2)
                S = stored.to(tl.float32)
            elif state_ptr.dtype.element_ty != tl.float32:
                if ((t + 1) % interval == 0) & (t + 1 < length):
                    S = _rounded(S, state_ptr, BF16_BITS).to(tl.float32)
        if not SPEC:
            tl.store(state_ptr + slot * s_slot + tile, _rounded(S, state_ptr, BF16_BITS), mask=m2)
    else:
        vv = vt * BV + tl.arange(0, BV)
        for t in range(0, length):
            tl.store(o_ptr + (bos + t) * so_t + hv * so_h + vv, tl.zeros((BV,), tl.float32), mask=vv < V)


@triton.jit
def _decay_kernel(x_ptr, A_log_ptr, dt_bias_ptr, flags_ptr, flag, rows, HV, sx_t, g_min, GATED: tl.constexpr,
                  BLOCK: tl.constexpr):
    """flags[flag] = max(flags[flag], 1 if a log-decay of this program's BLOCK of the [rows, HV] x breaks the gate
    contract (``reference.gdn.arguments``): g = x (not GATED) or g = -exp(A_log) softplus(x + dt_bias) (GATED,
    computed as ``_gdn_kernel`` computes it) outside [g_min, 0] or NaN; exp(A_log) or x + dt_bias not finite."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < rows * HV
    t = (i // HV).to(tl.int64)
    hv = i % HV
    x = tl.load(x_ptr + t * sx_t + hv, mask=live, other=0.0).to(tl.float32)
    if GATED:
        A = tl.exp(tl.load(A_log_ptr + hv, mask=live, other=0.0).to(tl.float32))
        x = x + tl.load(dt_bias_ptr + hv, mask=live, other=0.0).to(tl.float32)
        g = -A * tl.where(x > 20.0, x, _log1p(tl.exp(tl.minimum(x, 20.0))))
        bad = (A == float("inf")) | (tl.abs(x) == float("inf")) | (x != x) | (g != g) | (g < g_min)
    else:
        bad = (x != x) | (x > 0.0) | (x < g_min)
    tl.atomic_max(flags_ptr + flag, tl.max((bad & live).to(tl.int32), axis=0))


@triton.jit
def _nonfinite_kernel(x_ptr, flags_ptr, flag, rows, B, s0, s1, C: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_C: tl.constexpr):
    """flags[flag] = max(flags[flag], 1 if a NaN/Inf is among x[r // B, r % B, :C], rows r of this program)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    base = (r // B).to(tl.int64) * s0 + (r % B).to(tl.int64) * s1
    bad = tl.zeros((), tl.int32)
    for c0 in tl.static_range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(x_ptr + base[:, None] + c[None, :], mask=(r < rows)[:, None] & (c < C)[None, :],
                    other=0.0).to(tl.float32)
        bad = tl.maximum(bad, tl.max(tl.max(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=1), axis=0))
    tl.atomic_max(flags_ptr + flag, bad)


# ---------------------------------------------------------------- checks

def _rows(name: str, t) -> None:
    """The last dimension contiguous (what the kernels index with stride 1)."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {list(t.stride())}")


def _span(t) -> tuple[int, int]:
    """[first, last) byte addresses ``t`` can touch."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    return start, start + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def _disjoint(name: str, t, others: dict) -> None:
    """ValueError naming ``name`` when its bytes overlap those of any tensor in ``others``."""
    a0, a1 = _span(t)
    for other, x in others.items():
        b0, b1 = _span(x)
        if a0 < b1 and b0 < a1:
            raise ValueError(f"{name} overlaps {other} (a kernel writing it would change what it reads)")


def _scalars(scale, l2norm_eps, K: int) -> tuple[float, float]:
    from reference.gdn.arguments import scalars

    scalars(scale, l2norm_eps)
    return (K ** -0.5 if scale is None else float(scale)), float(l2norm_eps)


def _pool(state, HV: int, K: int, V: int, dev):
    check_tensor("state", state, (None, HV, K, V), SUPPORTED_POOL_DTYPES, dev)
    if state.shape[0] < 1:
        raise ValueError("state must hold at least one slot, got shape [0, ...]")
    if tuple(state.stride()[1:]) != (K * V, V, 1):
        raise ValueError(f"state slots must be contiguous [HV, K, V] blocks, got strides {list(state.stride())}")
    check_no_overlap("state", state)
    return state


def _out(out, shape: tuple, like, dev):
    import torch

    if out is None:
        return torch.empty(shape, dtype=like.dtype, device=dev)
    return check_output("out", out, shape, FLOAT_DTYPES, dev)


def _config(K: int, V: int, block_v, num_warps) -> tuple[int, int, int]:
    """(BK, BV, warps): BV a power of two (default ``TILE_ELEMENTS // BK``); in the interpreter all of V
    in one tile (fewest programs)."""
    BK = triton.next_power_of_2(K)
    if block_v is None:
        block_v = triton.next_power_of_2(V) if interpreting() else min(triton.next_power_of_2(V),
                                                                       max(16, TILE_ELEMENTS // BK))
    if isinstance(block_v, bool) or not isinstance(block_v, int) or block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two, got {block_v!r}")
    num_warps = 2 if num_warps is None else num_warps
    if num_warps not in WARPS:
        raise ValueError(f"num_warps must be one of {WARPS}, got {num_warps!r}")
    return BK, block_v, num_warps


def _finite(named: dict, workspace, decay: tuple) -> None:
    """ValueError naming the first of ``named`` (name -> tensor, at most FLAGS - 1, last dimension
    contiguous, up to 3-d) that holds a NaN or Inf, else naming the gate arguments when a log-decay breaks the
    gate contract (``reference.gdn.arguments``: g in [G_MIN, 0], exp(A_log) and a + dt_bias finite): ``decay``
    is ``(g, None, None)`` or ``(a, A_log, dt_bias)`` (fused gating). One flag kernel per tensor and one for the
    decays, one host read."""
    from reference.gdn.arguments import G_MIN

    flags = workspace.flags
    flags.zero_()
    for i, (name, x) in enumerate(named.items()):
        v = x.reshape((1,) * (3 - x.dim()) + tuple(x.shape)) if x.dim() < 3 else x
        A, B, C = v.shape
        s0, s1 = v.stride(0), v.stride(1)
        rows = A * B
        block_r = 64
        _nonfinite_kernel[(triton.cdiv(rows, block_r),)](v, flags, i, rows, B, s0, s1, C=C, BLOCK_R=block_r,
                                                         BLOCK_C=min(triton.next_power_of_2(C), 256))
    x, A_log, dt_bias = decay
    gated = A_log is not None
    rows, HV = x.shape
    _decay_kernel[(triton.cdiv(rows * HV, DECAY_BLOCK),)](x, A_log if gated else x, dt_bias if gated else x, flags,
                                                         FLAGS - 1, rows, HV, x.stride(0), G_MIN, GATED=gated,
                                                         BLOCK=DECAY_BLOCK)
    bad = flags.cpu().tolist()
    for i, name in enumerate(named):
        if bad[i]:
            raise ValueError(f"{name} holds NaN or Inf")
    if bad[FLAGS - 1] and gated:
        raise ValueError(f"A_log, a, dt_bias: the gate -exp(A_log) * softplus(a + dt_bias) overflows float32 "
                         f"(exp(A_log) or a + dt_bias beyond float32, or g below {G_MIN:.4g}, where a 64-token "
                         "chunk's sum of g overflows)")
    if bad[FLAGS - 1]:
        raise ValueError(f"g: expected log-decays in [{G_MIN:.4g}, 0] (above 0 the state grows; below, a 64-token "
                         "chunk's sum of g overflows float32)")


def _host(t):
    """An index tensor's values on the host (NumPy), for the reference's checks."""
    return t.detach().cpu().numpy()


def _common(q, k, v, state, dev):
    """Shapes, dtypes, devices and strides shared by the three ops; returns (T, H, HV, K, V)."""
    check_tensor("q", q, (None, None, None), FLOAT_DTYPES)
    T, H, K = q.shape
    check_tensor("q", q, (T, H, K), FLOAT_DTYPES, dev)
    check_tensor("k", k, (T, H, K), (str(q.dtype).removeprefix("torch."),), dev)
    check_tensor("v", v, (T, None, None), (str(q.dtype).removeprefix("torch."),), dev)
    HV, V = v.shape[1], v.shape[2]
    check_positive("T (tokens in q)", T)
    why = problem(K=K, V=V, state_dtype=str(state.dtype).removeprefix("torch."),
                  act=str(q.dtype).removeprefix("torch."), H=H, HV=HV)
    if why:
        raise ValueError(why)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _rows(name, x)
    return T, H, HV, K, V


def _device(state):
    import torch

    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state must be a torch tensor, got {type(state).__name__}")
    return state.device


def _gating_args(A_log, a, b, dt_bias, T: int, HV: int, dev):
    check_tensor("A_log", A_log, (HV,), FLOAT_DTYPES, dev, contiguous=True)
    check_tensor("dt_bias", dt_bias, (HV,), FLOAT_DTYPES, dev, contiguous=True)
    check_tensor("a", a, (T, HV), FLOAT_DTYPES, dev)
    check_tensor("b", b, (T, HV), FLOAT_DTYPES, dev)
    _rows("a", a)
    _rows("b", b)


# ---------------------------------------------------------------- the launchers

def decode_arguments(q, k, v, A_log, a, b, dt_bias, state, state_indices, scale, l2norm_eps, out, workspace):
    """The checks of ``decode`` (the module docstring's list), for every kernel that serves it: returns
    ((N, H, HV, K, V), state_indices as an int32 tensor, scale, eps, out)."""
    dev = _device(state)
    N, H, HV, K, V = _common(q, k, v, state, dev)
    _gating_args(A_log, a, b, dt_bias, N, HV, dev)
    _pool(state, HV, K, V, dev)
    state_indices = index_tensor("state_indices", state_indices, dev)
    check_tensor("state_indices", state_indices, (N,), ("int32",), dev, contiguous=True)
    scale, eps = _scalars(scale, l2norm_eps, K)
    inputs = dict(q=q, k=k, v=v, A_log=A_log, a=a, b=b, dt_bias=dt_bias, state_indices=state_indices)
    _disjoint("state", state, inputs)
    out = _out(out, (N, HV, V), q, dev)
    _disjoint("out", out, {**inputs, "state": state})
    if not capturing(state):
        from reference.gdn.arguments import slot_indices

        workspace = workspace or Workspace(dev)
        _finite({n: inputs[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias")}, workspace, (a, A_log, dt_bias))
        slot_indices("state_indices", _host(state_indices), (N,), state.shape[0])
    return (N, H, HV, K, V), state_indices, scale, eps, out


def decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, *, scale=None, use_qk_l2norm=True,
           l2norm_eps=1e-6, out=None, workspace=None, block_v=None, num_warps=None):
    """One decode step of N sequences (module docstring): q, k ``[N, H, K]``, v ``[N, HV, V]`` (one
    float dtype), A_log and dt_bias ``[HV]``, a and b ``[N, HV]``; ``state [S, HV, K, V]`` float32,
    bfloat16 or float16, updated in place; ``state_indices`` int32 ``[N]`` (a Python list is
    converted). Returns ``out`` ``[N, HV, V]`` (default: a new tensor of q's dtype)."""
    (N, H, HV, K, V), state_indices, scale, eps, out = decode_arguments(
        q, k, v, A_log, a, b, dt_bias, state, state_indices, scale, l2norm_eps, out, workspace)
    BK, BV, warps = _config(K, V, block_v, num_warps)
    _gdn_kernel[(N * HV * triton.cdiv(V, BV),)](
        q, k, v, a, b, A_log, dt_bias, state, state_indices, None, None, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        out.stride(0), out.stride(1), state.stride(0), 1, 1, scale, eps,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, GATED=True, SPEC=False, VARLEN=False, L2NORM=bool(use_qk_l2norm),
        BF16_BITS=interpreting(), num_warps=warps)
    return out


def spec_arguments(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens, scale,
                   l2norm_eps, out, workspace):
    """The checks of ``spec_decode`` (the module docstring's list), for every kernel that serves it: returns
    ((T, H, HV, K, V, N), spec_state_indices, num_accepted_tokens and cu_seqlens as int32 tensors, scale, eps,
    out)."""
    dev = _device(state)
    T, H, HV, K, V = _common(q, k, v, state, dev)
    _gating_args(A_log, a, b, dt_bias, T, HV, dev)
    _pool(state, HV, K, V, dev)
    spec = index_tensor("spec_state_indices", spec_state_indices, dev)
    acc = index_tensor("num_accepted_tokens", num_accepted_tokens, dev)
    cu = index_tensor("cu_seqlens", cu_seqlens, dev)
    check_tensor("cu_seqlens", cu, (None,), ("int32",), dev, contiguous=True)
    N = cu.shape[0] - 1
    check_positive("N (sequences in cu_seqlens)", N)
    check_tensor("spec_state_indices", spec, (N, None), ("int32",), dev)
    _rows("spec_state_indices", spec)
    check_tensor("num_accepted_tokens", acc, (N,), ("int32",), dev, contiguous=True)
    scale, eps = _scalars(scale, l2norm_eps, K)
    inputs = dict(q=q, k=k, v=v, A_log=A_log, a=a, b=b, dt_bias=dt_bias, spec_state_indices=spec,
                  num_accepted_tokens=acc, cu_seqlens=cu)
    _disjoint("state", state, inputs)
    out = _out(out, (T, HV, V), q, dev)
    _disjoint("out", out, {**inputs, "state": state})
    if not capturing(state):
        from reference.gdn.arguments import spec_tables

        _finite({n: inputs[n] for n in ("q", "k", "v", "A_log", "a", "b", "dt_bias")}, workspace or Workspace(dev),
                (a, A_log, dt_bias))
        spec_tables(_host(cu), _host(spec), _host(acc),
                    T, state.shape[0])
    return (T, H, HV, K, V, N), spec, acc, cu, scale, eps, out


def spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens, *,
                scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, out=None, workspace=None, block_v=None,
                num_warps=None):
    """Speculative decode (module docstring): q, k ``[T, H, K]``, v ``[T, HV, V]``, a, b ``[T, HV]``,
    ``spec_state_indices`` int32 ``[N, S]`` (rows contiguous), ``num_accepted_tokens`` int32 ``[N]``,
    ``cu_seqlens`` int32 ``[N + 1]``; ``state`` updated in place. Returns ``out [T, HV, V]``."""
    (T, H, HV, K, V, N), spec, acc, cu, scale, eps, out = spec_arguments(
        q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens, scale, l2norm_eps,
        out, workspace)
    BK, BV, warps = _config(K, V, block_v, num_warps)
    _gdn_kernel[(N * HV * triton.cdiv(V, BV),)](
        q, k, v, a, b, A_log, dt_bias, state, spec, cu, acc, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        out.stride(0), out.stride(1), state.stride(0), spec.stride(0), 1, scale, eps,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, GATED=True, SPEC=True, VARLEN=True, L2NORM=bool(use_qk_l2norm),
        BF16_BITS=interpreting(), num_warps=warps)
    return out


def _packed(q, k, v, g, beta, cu_seqlens, state, state_indices, scale, l2norm_eps, out, workspace):
    """The argument checks of the packed-sequence launchers (recurrent, chunked): shapes, dtypes,
    device, strides, overlaps, finite inputs, cu_seqlens and slots. Returns (device, (T, H, HV, K,
    V, N), cu_seqlens and state_indices as int32 tensors, scale, eps, out)."""
    dev = _device(state)
    T, H, HV, K, V = _common(q, k, v, state, dev)
    check_tensor("g", g, (T, HV), ("float32",), dev)
    check_tensor("beta", beta, (T, HV), FLOAT_DTYPES, dev)
    _rows("g", g)
    _rows("beta", beta)
    _pool(state, HV, K, V, dev)
    cu = index_tensor("cu_seqlens", cu_seqlens, dev)
    idx = index_tensor("state_indices", state_indices, dev)
    check_tensor("cu_seqlens", cu, (None,), ("int32",), dev, contiguous=True)
    N = cu.shape[0] - 1
    check_positive("N (sequences in cu_seqlens)", N)
    check_tensor("state_indices", idx, (N,), ("int32",), dev, contiguous=True)
    scale, eps = _scalars(scale, l2norm_eps, K)
    inputs = dict(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, state_indices=idx)
    _disjoint("state", state, inputs)
    out = _out(out, (T, HV, V), q, dev)
    _disjoint("out", out, {**inputs, "state": state})
    if not capturing(state):
        from reference.gdn.arguments import cu_seqlens as check_cu, slot_indices

        _finite({n: inputs[n] for n in ("q", "k", "v", "g", "beta")}, workspace or Workspace(dev), (g, None, None))
        check_cu(_host(cu), T)
        slot_indices("state_indices", _host(idx), (N,), state.shape[0])
    return dev, (T, H, HV, K, V, N), cu, idx, scale, eps, out


def recurrent(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
              l2norm_eps=1e-6, state_write_interval=1, out=None, workspace=None, block_v=None, num_warps=None):
    """Packed sequences (module docstring): q, k ``[T, H, K]``, v ``[T, HV, V]``, g (float32 log decay)
    and beta ``[T, HV]``, ``cu_seqlens`` int32 ``[N + 1]``, ``state_indices`` int32 ``[N]``; ``state``
    updated in place. Returns ``out [T, HV, V]``."""
    from reference.gdn.arguments import interval as check_interval

    every = check_interval(state_write_interval)
    dev, (T, H, HV, K, V, N), cu, idx, scale, eps, out = _packed(
        q, k, v, g, beta, cu_seqlens, state, state_indices, scale, l2norm_eps, out, workspace)
    BK, BV, warps = _config(K, V, block_v, num_warps)
    _gdn_kernel[(N * HV * triton.cdiv(V, BV),)](
        q, k, v, g, beta, None, None, state, idx, cu, None, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
        out.stride(0), out.stride(1), state.stride(0), 1, every, scale, eps,
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, GATED=False, SPEC=False, VARLEN=True, L2NORM=bool(use_qk_l2norm),
        BF16_BITS=interpreting(), num_warps=warps)
    return out


ENTRY_POINTS = {"decode": decode, "spec_decode": spec_decode, "recurrent": recurrent}


def compile_specs():
    """The kernel at Qwen3-Next's heads (H=16, HV=32, K=V=128) with bf16 activations and o: decode and spec
    decode (fused gating) and recurrent, for each state dtype, and the NaN/Inf flag kernel (``compile_check``)."""
    from optimized.triton.compile_check import CompileSpec

    strides = {n: "i32" for n in ("sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "sx_t", "sy_t", "so_t", "so_h",
                                  "s_slot", "s_table", "interval")}
    BK, BV, _ = _config(128, 128, None, None)
    out = []
    for op, gated, spec in (("decode", True, False), ("spec_decode", True, True), ("recurrent", False, False)):
        for state in ("fp32", "bf16", "fp16"):
            types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", x_ptr="*bf16" if gated else "*fp32",
                         y_ptr="*bf16", A_log_ptr="*fp32", dt_bias_ptr="*bf16", state_ptr=f"*{state}",
                         table_ptr="*i32", cu_ptr="*i32", acc_ptr="*i32", o_ptr="*bf16", scale="fp32", eps="fp32",
                         **strides)
            out.append(CompileSpec(f"gdn {op} state={state}", _gdn_kernel, types, dict(
                H=16, HV=32, K=128, V=128, BK=BK, BV=BV, GATED=gated, SPEC=spec, VARLEN=spec or not gated,
                L2NORM=True, BF16_BITS=False)))
    out.append(CompileSpec("gdn nonfinite flags", _nonfinite_kernel, dict(
        x_ptr="*bf16", flags_ptr="*i32", flag="i32", rows="i32", B="i32", s0="i32", s1="i32"),
        dict(C=128, BLOCK_R=64, BLOCK_C=128)))
    for gated, x in ((True, "*bf16"), (False, "*fp32")):
        out.append(CompileSpec(f"gdn decay flags gated={gated}", _decay_kernel, dict(
            x_ptr=x, A_log_ptr="*fp32", dt_bias_ptr="*bf16", flags_ptr="*i32", flag="i32", rows="i32", HV="i32",
            sx_t="i32", g_min="fp32"), dict(GATED=gated, BLOCK=DECAY_BLOCK)))
    return out
