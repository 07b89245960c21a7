"""GDN decode and spec decode (``reference.gdn.numpy_ref.decode``, ``spec_decode``) for NVIDIA sm_90 whose
reductions over K stay in registers.

The op and its argument contract are ``gdn_recurrent.decode``'s (one token per sequence, gating fused in:
g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); q and k l2-normalised (eps added to the sum of
squares), q scaled; the pool ``[S, HV, K, V]`` float32, bfloat16 or float16 updated in place at
``state_indices``, -1: padding, no slot read or written, its output rows zero); its checks are that
module's ``decode_arguments``. Served: K = V = 128, any H and HV = G H, any float activations
(``problem`` names the rest, which stays on the portable kernel).

Written in Gluon (``triton.experimental.gluon``: explicit layouts), NVIDIA sm_90 only. One program per
(sequence n, key head h, block of ``heads_per_program`` of its G value heads): q and k are normalised once
per program in a compact layout (each lane K/32 elements), then broadcast to the state layout; the
program walks its value heads, and for each computes the gating once and updates the ``[K, V]`` state in
``V / (TV VEC)`` warps: a warp owns ``TV VEC`` columns, lane ``(i, j)`` (``i < LANES_K`` along K,
``j < TV = 32 / LANES_K`` along V) owns rows ``[i K / LANES_K, (i + 1) K / LANES_K)`` of ``VEC``
consecutive columns, ``VEC`` = 16 bytes of the pool's dtype (one 16-byte load per row). A column's K
values are thus in ``LANES_K`` lanes of one warp: the sums over K (``S^T k`` and ``S^T q``) are
``K / LANES_K`` in-thread fused multiply-adds and ``log2(LANES_K)`` butterfly shuffles, no shared
memory and no barrier (only the q/k broadcast, once per program, goes through shared memory). The state is
read once in its storage dtype, 16 bytes a load, and kept in fp32 registers; with ``stages`` it streams into
registers through a ring of shared-memory stages instead (16-byte cp.async copies, each thread reading back the
elements it copied; no registers held while in flight), in a grid of one program per item or a persistent one.

Spec decode (``spec_decode``, arguments and checks ``gdn_recurrent.spec_decode``'s, its ``spec_arguments``): one
program per (sequence, value head, block of BV columns) in the same state layout (``BV / (TV VEC)`` warps, BV
chosen per launch: ``spec_config``), the draft tokens in turn with the state in registers; q and k are loaded
straight into the state's row layout (their norms, like the sums over K, without shared memory or a barrier).

Order of operations per value head and token, fp32 (``gdn_recurrent``'s): ``S = S exp(g)``; ``u = beta (v -
S^T k)``; ``S = S + k u^T``; ``o = S^T q`` (the updated, unrounded state); the state stored once, rounded to
nearest even by the conversion instruction (spec decode: each draft token continues from the stored, rounded
value, as the reference does); o rounded once to ``out``'s dtype. Rounding model "exact". The spec decode
normalises q and k by multiplying with the reciprocal of the norm (q: scale / norm), one division a token
rather than one an element, within an ulp of the division per element.
"""
from __future__ import annotations

import functools
import itertools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from optimized.triton.gdn_recurrent import decode_arguments, problem as portable_problem, spec_arguments

# The Gluon names differ between Triton versions: 3.6 (the H200's) and 3.8 (the CPU machines' compile check).
_async_copy = getattr(async_copy, "async_copy_global_to_shared", None) or async_copy.async_load
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

HEAD = 128                   # the K and V this kernel's layout is built for
LANES_K = (1, 2, 4, 8, 16, 32)
# Lanes along K by the pool's element size: 128 fp32 state registers per thread either way (a warp owns 32
# columns, V / 32 = 4 warps per program)
DEFAULT_LANES_K = {4: 4, 2: 8}
STAGES = (2, 3)              # shared-memory stages of the cp.async ring (``decode``'s ``stages``)
SMEM_LIMIT = 227 * 1024      # shared memory a program may have on sm_90
SMEM_SCRATCH = 1024          # shared memory the compiler adds (the q/k broadcast), rounded up
SPEC_BLOCK_V = (16, 32, 64, 128)   # the V blocks of a spec decode program (``spec_config``)
# Lanes along K of the spec decode by the pool's element size: 8 for both (an fp32 pool at 4 lanes, 128 state
# registers a thread beside two tokens' q and k rows, spills to local memory; at 8 it uses 227 registers, no spill)
SPEC_LANES_K = {4: 8, 2: 8}
# The spec decode's default V block: the whole of V while its grid gives every multiprocessor at least this many
# programs, else halved (more, smaller programs) until it does or a block is one warp's columns. On the H100
# (2026-12-06, N=32 with HV=32: 7.8 programs a multiprocessor at the whole of V) the whole V block streamed
# 86.5-87.7% of the copy with a 16-bit pool, halving to 32 columns 79.8-83.6%
SPEC_PROGRAMS_PER_SM = 4


def problem(*, K: int, V: int, state_dtype: str, act: str, H: int | None = None, HV: int | None = None,
            device=None) -> str | None:
    """Why this kernel cannot serve a decode with head sizes K, V, a pool of ``state_dtype``, activations of
    ``act`` (dtype names), H key and HV value heads, on the torch ``device`` (None: not asked); None when it
    can, for decode and spec decode alike. Recurrent stays on the portable kernel (``gdn_recurrent``): this
    module's ``ENTRY_POINTS`` hold decode and spec_decode."""
    why = portable_problem(K=K, V=V, state_dtype=state_dtype, act=act, H=H, HV=HV)
    if why:
        return why
    if K != HEAD or V != HEAD:
        return (f"q, v: the sm_90 GDN decode is laid out for K = V = {HEAD}, got K={K}, V={V} (the portable kernel "
                "serves it)")
    if device is not None:
        from optimized.triton.tq_decode_sm90 import device_problem

        why = device_problem(device)
        return f"state: {why}" if why else None
    return None


def config(element_size: int, V: int, G: int, lanes_k=None, heads_per_program=None) -> tuple[int, int, int, int]:
    """(VEC, LANES_K, warps, value heads per program) for a pool of ``element_size`` bytes: VEC elements are
    16 bytes; ``lanes_k`` (default ``DEFAULT_LANES_K``) one of ``LANES_K``; warps = V / (32 / LANES_K * VEC);
    ``heads_per_program`` a divisor of G (default G: q and k normalised once per key head)."""
    vec = 16 // element_size
    lanes_k = DEFAULT_LANES_K[element_size] if lanes_k is None else lanes_k
    if lanes_k not in LANES_K:
        raise ValueError(f"lanes_k must be one of {LANES_K}, got {lanes_k!r}")
    cols = 32 // lanes_k * vec
    if V % cols:
        raise ValueError(f"lanes_k={lanes_k}: a warp's {cols} columns do not divide V={V}")
    hpp = G if heads_per_program is None else heads_per_program
    if isinstance(hpp, bool) or not isinstance(hpp, int) or hpp < 1 or G % hpp:
        raise ValueError(f"heads_per_program must divide G={G} (value heads per key head), got {hpp!r}")
    return vec, lanes_k, V // cols, hpp


# ---------------------------------------------------------------- the kernel

@gluon.jit
def _log1p(y):
    """log(1 + y) for y >= 0, accurate for small y (Goldberg: log(w) * y / (w - 1), w = 1 + y)."""
    w = 1.0 + y
    return gl.where(w == 1.0, y, gl.log(w) * (y / gl.where(w == 1.0, 1.0, w - 1.0)))


@gluon.jit
def _normalised(ptr, eps, K: gl.constexpr, L2NORM: gl.constexpr, FLAT: gl.constexpr, ROW: gl.constexpr):
    """The ``K`` values at ``ptr`` in fp32, divided by sqrt(sum of squares + eps) when ``L2NORM`` (in the
    compact layout ``FLAT``), then broadcast to ``ROW``."""
    x = gl.load(ptr + gl.arange(0, K, layout=FLAT)).to(gl.float32)
    if L2NORM:
        x = gl.div_rn(x, gl.sqrt_rn(gl.sum(x * x, axis=0) + eps))
    return gl.convert_layout(x, ROW)


@gluon.jit
def _issue(ring, c, pid, nprog, items, table_ptr, state_ptr, s_slot, tile, H: gl.constexpr, G: gl.constexpr,
           HPP: gl.constexpr, K: gl.constexpr, V: gl.constexpr, STAGES: gl.constexpr, STATE: gl.constexpr):
    """cp.async of this program's value head ``c`` (head ``c % HPP`` of its item ``c // HPP``, the grid's item
    ``pid + (c // HPP) nprog``) into ring stage ``c % STAGES``, one commit group; zero-filled, nothing read, past
    the last of the ``items`` or for a padding slot."""
    item = pid + (c // HPP) * nprog
    live = item < items
    item = item % items
    slot = gl.load(table_ptr + item // (H * (G // HPP))).to(gl.int64)
    hv = item // (G // HPP) % H * G + item % (G // HPP) * HPP + c % HPP
    _async_copy(ring.index(c % STAGES), state_ptr + slot * s_slot + hv * (K * V) + tile,
                gl.full([K, V], live & (slot >= 0), gl.int1, STATE))
    async_copy.commit_group()


@gluon.jit
def _item(pid, it, ring, nprog, items, tile, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr,
          table_ptr, o_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sb_t, so_t, so_h, s_slot, scale, eps,
          H: gl.constexpr, G: gl.constexpr, K: gl.constexpr, V: gl.constexpr, HPP: gl.constexpr, WARPS: gl.constexpr,
          PREFETCH: gl.constexpr, STAGES: gl.constexpr, L2NORM: gl.constexpr, STATE: gl.constexpr):
    """Program ``pid``'s item ``it``, the grid's item ``pid + it nprog``: (sequence n, key head h, block of HPP
    value heads of h) (module docstring); with a ring (``STAGES`` > 0) its value heads are the program's heads
    ``c0 .. c0 + HPP - 1`` (c0 = it HPP), each taken from its stage, the stage refilled with head c + STAGES once
    head c is in registers."""
    ROW: gl.constexpr = gl.SliceLayout(1, STATE)   # [K]: a thread's rows, replicated along V
    COL: gl.constexpr = gl.SliceLayout(0, STATE)   # [V]: a thread's VEC columns, replicated along K
    FLAT: gl.constexpr = gl.BlockedLayout([K // 32], [32], [WARPS], [0])
    item = pid + it * nprog
    c0 = it * HPP
    n = item // (H * (G // HPP))
    h = item // (G // HPP) % H
    hv0 = h * G + item % (G // HPP) * HPP
    n64 = n.to(gl.int64)
    cols = gl.arange(0, V, layout=COL)
    slot = gl.load(table_ptr + n).to(gl.int64)
    if slot >= 0:
        heads = state_ptr + slot * s_slot + hv0 * (K * V) + tile
        if STAGES == 0:
            raw = gl.load(heads)  # the first value head's state, in flight while q and k are normalised
        q = _normalised(q_ptr + n64 * sq_t + h * sq_h, eps, K, L2NORM, FLAT, ROW) * scale
        k = _normalised(k_ptr + n64 * sk_t + h * sk_h, eps, K, L2NORM, FLAT, ROW)
        qc = gl.expand_dims(q, 1)
        kc = gl.expand_dims(k, 1)
        for j in range(HPP):
            hv = hv0 + j
            pool = heads + j * (K * V)
            if STAGES > 0:
                async_copy.wait_group(STAGES - 1)  # this thread's copies of head c0 + j landed
                _barrier()
                raw = ring.index((c0 + j) % STAGES).load(STATE)  # each thread reads the elements it copied
            if PREFETCH:  # the next value head's state, in flight while this one is computed
                nxt = gl.load(pool + K * V, mask=gl.full([K, V], j + 1 < HPP, gl.int1, STATE))
            x = gl.load(a_ptr + n64 * sa_t + hv).to(gl.float32) + gl.load(dt_bias_ptr + hv).to(gl.float32)
            y = gl.load(b_ptr + n64 * sb_t + hv).to(gl.float32)
            g = -gl.exp(gl.load(A_log_ptr + hv).to(gl.float32)) * gl.where(
                x > 20.0, x, _log1p(gl.exp(gl.minimum(x, 20.0))))
            beta = 1.0 / (1.0 + gl.exp(-y))
            v = gl.load(v_ptr + n64 * sv_t + hv * sv_h + cols).to(gl.float32)
            S = raw.to(gl.float32) * gl.exp(g)
            if STAGES > 0:  # the stage is free once its head is in registers
                _issue(ring, c0 + j + STAGES, pid, nprog, items, table_ptr, state_ptr, s_slot, tile, H, G, HPP, K, V,
                       STAGES, STATE)
            u = beta * (v - gl.sum(S * kc, axis=0))
            S = S + kc * gl.expand_dims(u, 0)
            o = gl.sum(S * qc, axis=0)
            gl.store(pool, S.to(state_ptr.dtype.element_ty))
            gl.store(o_ptr + n64 * so_t + hv * so_h + cols, o.to(o_ptr.dtype.element_ty))
            if PREFETCH:
                raw = nxt
            elif STAGES == 0:
                raw = gl.load(pool + K * V, mask=gl.full([K, V], j + 1 < HPP, gl.int1, STATE))
    else:
        for j in range(HPP):
            if STAGES > 0:  # the ring's order kept: head c0 + j (zero-filled) taken, its stage refilled
                async_copy.wait_group(STAGES - 1)
                _barrier()
                _issue(ring, c0 + j + STAGES, pid, nprog, items, table_ptr, state_ptr, s_slot, tile, H, G, HPP, K, V,
                       STAGES, STATE)
            gl.store(o_ptr + n64 * so_t + (hv0 + j) * so_h + cols, gl.zeros([V], gl.float32, COL).to(
                o_ptr.dtype.element_ty))


@gluon.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, table_ptr, o_ptr,
                   sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sb_t, so_t, so_h, s_slot, scale, eps, items, nprog,
                   H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, HPP: gl.constexpr,
                   VEC: gl.constexpr, LANES: gl.constexpr, WARPS: gl.constexpr, PREFETCH: gl.constexpr,
                   STAGES: gl.constexpr, L2NORM: gl.constexpr):
    """``items`` = N H (G / HPP) grid items (module docstring). ``STAGES`` = 0: one program per item, its states
    loaded into registers. ``STAGES`` > 0: program p of ``nprog`` takes items p, p + nprog, ... (one per item, or a
    persistent grid) and streams their value heads, in order, through a ring of ``STAGES`` shared-memory stages
    (cp.async, no registers held while in flight): the first STAGES at the start, head c + STAGES into stage
    c % STAGES once head c is in registers, so STAGES heads stay in flight across items."""
    STATE: gl.constexpr = gl.BlockedLayout([K // LANES, VEC], [LANES, 32 // LANES], [1, WARPS], [1, 0])
    G: gl.constexpr = HV // H
    pid = gl.program_id(0)
    tile = (gl.expand_dims(gl.arange(0, K, layout=gl.SliceLayout(1, STATE)), 1) * V
            + gl.expand_dims(gl.arange(0, V, layout=gl.SliceLayout(0, STATE)), 0))
    if STAGES > 0:
        # the 16-byte vectors of lane row i XOR i: the LANES rows a warp's load meets at once spread over the
        # banks (without it a 16-bit pool's lanes meet half of them, two wavefronts where one would do)
        RING: gl.constexpr = gl.SwizzledSharedLayout(vec=VEC, per_phase=K // LANES, max_phase=LANES, order=[1, 0])
        ring = gl.allocate_shared_memory(state_ptr.dtype.element_ty, [STAGES, K, V], RING)
        for c in gl.static_range(STAGES):
            _issue(ring, c, pid, nprog, items, table_ptr, state_ptr, s_slot, tile, H, G, HPP, K, V, STAGES, STATE)
        for it in range((items - pid + nprog - 1) // nprog):
            _item(pid, it, ring, nprog, items, tile, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr,
                  dt_bias_ptr, state_ptr, table_ptr, o_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sb_t, so_t, so_h,
                  s_slot, scale, eps, H, G, K, V, HPP, WARPS, PREFETCH, STAGES, L2NORM, STATE)
        async_copy.wait_group(0)  # no copy outlives the program
    else:
        _item(pid, 0, 0, 1, items, tile, q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr,
              table_ptr, o_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sb_t, so_t, so_h, s_slot, scale, eps,
              H, G, K, V, HPP, WARPS, PREFETCH, STAGES, L2NORM, STATE)


@gluon.jit
def _spec_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, table_ptr, cu_ptr, acc_ptr,
                 o_ptr, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sb_t, so_t, so_h, s_slot, s_table, scale, eps,
                 H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                 VEC: gl.constexpr, LANES: gl.constexpr, WARPS: gl.constexpr, L2NORM: gl.constexpr):
    """Speculative decode: one program per (sequence n, value head hv, block of BV columns; the block fastest),
    tokens cu[n] .. cu[n + 1] - 1 in turn. The ``[K, BV]`` state is read once from slot
    ``table[n, max(acc[n] - 1, 0)]`` in the decode's layout (``STATE``: ``WARPS = BV / (TV VEC)`` warps) and kept
    in fp32 registers; after token t it is stored, rounded once, into slot ``table[n, t]`` and the next token
    continues from the rounded value (the stores wait on nothing that follows). Token t + 1's q, k, v, a, b are
    loaded before token t's state is updated (in flight while it is), and its gating and the l2 norms of q and
    k are computed apart from the state (they depend on no state value). q and k are loaded in the state's row
    layout (each thread its K / LANES_K rows), so their norms are in-thread sums and butterfly shuffles like the
    sums over K: no shared memory, no barrier."""
    STATE: gl.constexpr = gl.BlockedLayout([K // LANES, VEC], [LANES, 32 // LANES], [1, WARPS], [1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, STATE)
    COL: gl.constexpr = gl.SliceLayout(0, STATE)
    NV: gl.constexpr = V // BV
    pid = gl.program_id(0)
    vt = pid % NV
    hv = pid // NV % HV
    n = pid // NV // HV
    h = hv // (HV // H)
    row = table_ptr + n.to(gl.int64) * s_table
    bos = gl.load(cu_ptr + n).to(gl.int64)
    length = gl.load(cu_ptr + n + 1) - gl.load(cu_ptr + n)
    cols = vt * BV + gl.arange(0, BV, layout=COL)
    rows = gl.arange(0, K, layout=ROW)
    # token 0's inputs and the head's gate parameters, in flight while the slot is looked up (they depend on none
    # of its loads)
    live = length > 0
    qr = gl.load(q_ptr + bos * sq_t + h * sq_h + rows, mask=gl.full([K], live, gl.int1, ROW))
    kr = gl.load(k_ptr + bos * sk_t + h * sk_h + rows, mask=gl.full([K], live, gl.int1, ROW))
    vr = gl.load(v_ptr + bos * sv_t + hv * sv_h + cols, mask=gl.full([BV], live, gl.int1, COL))
    ar = gl.load(a_ptr + bos * sa_t + hv, mask=live)
    br = gl.load(b_ptr + bos * sb_t + hv, mask=live)
    A = gl.exp(gl.load(A_log_ptr + hv).to(gl.float32))
    dt_bias = gl.load(dt_bias_ptr + hv).to(gl.float32)
    slot = gl.load(row + gl.maximum(gl.load(acc_ptr + n) - 1, 0)).to(gl.int64)
    if slot >= 0:
        pool = state_ptr + hv * (K * V) + gl.expand_dims(rows, 1) * V + gl.expand_dims(cols, 0)
        S = gl.load(pool + slot * s_slot).to(gl.float32)
        for t in range(length):
            i = bos + t
            more = t + 1 < length  # token t + 1's inputs, in flight while token t is computed
            qn = gl.load(q_ptr + (i + 1) * sq_t + h * sq_h + rows, mask=gl.full([K], more, gl.int1, ROW))
            kn = gl.load(k_ptr + (i + 1) * sk_t + h * sk_h + rows, mask=gl.full([K], more, gl.int1, ROW))
            vn = gl.load(v_ptr + (i + 1) * sv_t + hv * sv_h + cols, mask=gl.full([BV], more, gl.int1, COL))
            an = gl.load(a_ptr + (i + 1) * sa_t + hv, mask=more)
            bn = gl.load(b_ptr + (i + 1) * sb_t + hv, mask=more)
            dst = gl.load(row + t).to(gl.int64)
            x = ar.to(gl.float32) + dt_bias
            g = -A * gl.where(x > 20.0, x, _log1p(gl.exp(gl.minimum(x, 20.0))))
            beta = 1.0 / (1.0 + gl.exp(-br.to(gl.float32)))
            q = qr.to(gl.float32)
            k = kr.to(gl.float32)
            if L2NORM:  # one division a token: each thread holds K / LANES_K elements of q and of k
                q = q * gl.div_rn(scale, gl.sqrt_rn(gl.sum(q * q, axis=0) + eps))
                k = k * gl.div_rn(1.0, gl.sqrt_rn(gl.sum(k * k, axis=0) + eps))
            else:
                q = q * scale
            qc = gl.expand_dims(q, 1)
            kc = gl.expand_dims(k, 1)
            S = S * gl.exp(g)
            u = beta * (vr.to(gl.float32) - gl.sum(S * kc, axis=0))
            S = S + kc * gl.expand_dims(u, 0)
            o = gl.sum(S * qc, axis=0)
            stored = S.to(state_ptr.dtype.element_ty)
            gl.store(pool + dst * s_slot, stored)
            gl.store(o_ptr + i * so_t + hv * so_h + cols, o.to(o_ptr.dtype.element_ty))
            S = stored.to(gl.float32)
            qr, kr, vr, ar, br = qn, kn, vn, an, bn
    else:
        for t in range(length):
            gl.store(o_ptr + (bos + t) * so_t + hv * so_h + cols, gl.zeros([BV], gl.float32, COL).to(
                o_ptr.dtype.element_ty))


# ---------------------------------------------------------------- the launcher

def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_options(*, prefetch=False, stages=0, persistent=False, registers=None) -> None:
    """ValueError naming the option when ``decode``'s loading options do not go together: ``stages`` 0 or one of
    ``STAGES`` (each fits ``SMEM_LIMIT`` for any pool dtype at K = V = ``HEAD``), not with ``prefetch``;
    ``persistent`` only with a ring; ``registers`` None or an int in [32, 255]."""
    if isinstance(stages, bool) or (stages != 0 and stages not in STAGES):
        raise ValueError(f"stages must be 0 or one of {STAGES}, got {stages!r}")
    if prefetch and stages:
        raise ValueError("prefetch, stages: one way of loading the next value head's state, got both")
    if persistent and not stages:
        raise ValueError("persistent: a persistent grid streams through the ring; give stages too")
    if registers is not None and (isinstance(registers, bool) or not isinstance(registers, int)
                                  or not 32 <= registers <= 255):
        raise ValueError(f"registers must be None or an int in [32, 255], got {registers!r}")


def programs_per_sm(stages: int, element_size: int, warps: int, registers=None) -> int:
    """Programs a multiprocessor holds at once: by registers (``registers`` a thread, default 255, allocated 256
    a warp at a time; 64 Ki a multiprocessor) and by the ring's shared memory (``SMEM_LIMIT``)."""
    per_warp = -(-(255 if registers is None else registers) * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    by_smem = SMEM_LIMIT // (stages * HEAD * HEAD * element_size + SMEM_SCRATCH)
    return max(1, min(by_regs, by_smem))


def decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, *, scale=None, use_qk_l2norm=True,
           l2norm_eps=1e-6, out=None, workspace=None, lanes_k=None, heads_per_program=None, prefetch=False,
           stages=0, persistent=False, registers=None):
    """``gdn_recurrent.decode`` (same arguments, checks and result) on sm_90: q, k ``[N, H, K]``, v ``[N, HV, V]``,
    A_log and dt_bias ``[HV]``, a and b ``[N, HV]``; ``state [S, HV, K, V]`` updated in place; ``state_indices``
    int32 ``[N]``. Tile options: ``lanes_k`` and ``heads_per_program`` (``config``); ``prefetch``: a program's next
    value head's state is loaded before the current one is computed (else after it is stored); ``stages`` (0, or
    one of ``STAGES``): the states go through a ring of that many shared-memory stages by cp.async instead
    (``stages`` value heads in flight without holding registers; ``stages`` K V pool elements of shared memory a
    program); ``persistent`` (with a ring): as many programs as the multiprocessors hold at once
    (``programs_per_sm``), each streaming its items' heads through its ring, instead of one program per item;
    ``registers``: a cap on the registers a thread uses (``maxnreg``, 32 to 255; default the compiler's choice), so
    that more programs fit on a multiprocessor (what does not fit spills to local memory). ValueError naming the
    argument for a call ``problem`` leaves to the portable kernel, or for options that do not go together
    (``check_options``)."""
    (N, H, HV, K, V), idx, scale, eps, out = decode_arguments(
        q, k, v, A_log, a, b, dt_bias, state, state_indices, scale, l2norm_eps, out, workspace)
    why = problem(K=K, V=V, state_dtype=_name(state.dtype), act=_name(q.dtype), H=H, HV=HV, device=state.device)
    if why:
        raise ValueError(why)
    vec, lanes, warps, hpp = config(state.element_size(), V, HV // H, lanes_k, heads_per_program)
    check_options(prefetch=prefetch, stages=stages, persistent=persistent, registers=registers)
    items = N * H * (HV // H // hpp)
    grid = items
    if persistent:
        import torch

        sms = torch.cuda.get_device_properties(state.device).multi_processor_count
        grid = min(items, sms * programs_per_sm(stages, state.element_size(), warps, registers))
    _decode_kernel[(grid,)](
        q, k, v, a, b, A_log, dt_bias, state, idx, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        out.stride(0), out.stride(1), state.stride(0), scale, eps, items, grid,
        H=H, HV=HV, K=K, V=V, HPP=hpp, VEC=vec, LANES=lanes, WARPS=warps, PREFETCH=bool(prefetch),
        STAGES=stages, L2NORM=bool(use_qk_l2norm),
        num_warps=warps, **({} if registers is None else {"maxnreg": registers}))
    return out


def spec_config(element_size: int, V: int, lanes_k=None, block_v=None, items=None, sms=None
                ) -> tuple[int, int, int, int]:
    """(VEC, LANES_K, warps, BV) of a spec decode program for a pool of ``element_size`` bytes: VEC as in
    ``config``, ``lanes_k`` one of ``LANES_K`` (default ``SPEC_LANES_K``); ``block_v`` one of ``SPEC_BLOCK_V``, a
    multiple of a warp's 32 / LANES_K VEC columns dividing V; default (``items`` = N HV (sequence, value head)
    pairs, ``sms`` multiprocessors) V, halved while the grid gives a multiprocessor fewer than
    ``SPEC_PROGRAMS_PER_SM`` programs and a block is more than one warp's columns; warps = BV / columns of a
    warp."""
    vec = 16 // element_size
    lanes_k = SPEC_LANES_K[element_size] if lanes_k is None else lanes_k
    if lanes_k not in LANES_K:
        raise ValueError(f"lanes_k must be one of {LANES_K}, got {lanes_k!r}")
    cols = 32 // lanes_k * vec
    if block_v is None:
        block_v = V
        while block_v > cols and items * (V // block_v) < SPEC_PROGRAMS_PER_SM * sms:
            block_v //= 2
    if block_v not in SPEC_BLOCK_V or block_v % cols or V % block_v:
        raise ValueError(f"block_v must be one of {SPEC_BLOCK_V}, a multiple of {cols} (a warp's columns at "
                         f"lanes_k={lanes_k}) that divides V={V}, got {block_v!r}")
    return vec, lanes_k, block_v // cols, block_v


@functools.cache
def _multiprocessors(index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(index).multi_processor_count


def spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens, *,
                scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, out=None, workspace=None, lanes_k=None,
                block_v=None):
    """``gdn_recurrent.spec_decode`` (same arguments, checks and result) on sm_90: q, k ``[T, H, K]``, v ``[T, HV,
    V]``, a, b ``[T, HV]``, ``spec_state_indices`` int32 ``[N, S]``, ``num_accepted_tokens`` int32 ``[N]``,
    ``cu_seqlens`` int32 ``[N + 1]``; ``state`` updated in place; returns ``out [T, HV, V]``. Tile options
    ``lanes_k`` and ``block_v`` (``spec_config``; the default V block is chosen from N HV and the device's
    multiprocessors). ValueError naming the argument for a call ``problem`` leaves to the portable kernel."""
    (T, H, HV, K, V, N), spec, acc, cu, scale, eps, out = spec_arguments(
        q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens, scale, l2norm_eps,
        out, workspace)
    why = problem(K=K, V=V, state_dtype=_name(state.dtype), act=_name(q.dtype), H=H, HV=HV, device=state.device)
    if why:
        raise ValueError(why)
    sms = None if block_v is not None else _multiprocessors(state.device.index or 0)
    vec, lanes, warps, bv = spec_config(state.element_size(), V, lanes_k, block_v, N * HV, sms)
    _spec_kernel[(N * HV * (V // bv),)](
        q, k, v, a, b, A_log, dt_bias, state, spec, cu, acc, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        out.stride(0), out.stride(1), state.stride(0), spec.stride(0), scale, eps,
        H=H, HV=HV, K=K, V=V, BV=bv, VEC=vec, LANES=lanes, WARPS=warps, L2NORM=bool(use_qk_l2norm), num_warps=warps)
    return out


ENTRY_POINTS = {"decode": decode, "spec_decode": spec_decode}


# What a launch at Qwen3-Next's heads specialises as multiples of 16 (fresh tensors; strides H K, K, HV V, V, HV)
SPEC_ALIGNED = ("state_ptr", "s_slot", "q_ptr", "k_ptr", "v_ptr", "o_ptr", "sq_t", "sq_h", "sk_t", "sk_h", "sv_t",
                "sv_h", "so_t", "so_h", "sa_t", "sb_t")


def compile_specs():
    """The decode at Qwen3-Next's heads (H=16, HV=32, K=V=128), bf16 activations and o, its default tile for each
    pool dtype, loaded directly and through each ring of shared-memory stages (``stages``), and the spec decode at
    V blocks of 32 and 128 columns, for CUDA only (Gluon, sm_90) (``compile_check``)."""
    from optimized.triton.compile_check import CompileSpec

    strides = {n: "i32" for n in ("sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "sa_t", "sb_t", "so_t", "so_h",
                                  "s_slot")}
    out = []
    for (state, size), stages in itertools.product((("fp32", 4), ("bf16", 2), ("fp16", 2)), (0, *STAGES)):
        types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", a_ptr="*bf16", b_ptr="*bf16", A_log_ptr="*fp32",
                     dt_bias_ptr="*bf16", state_ptr=f"*{state}", table_ptr="*i32", o_ptr="*bf16", scale="fp32",
                     eps="fp32", items="i32", nprog="i32", **strides)
        vec, lanes, warps, hpp = config(size, 128, 2)
        out.append(CompileSpec(f"sm90 gdn decode state={state}" + (f" stages={stages}" if stages else ""),
                               _decode_kernel, types,
                               dict(H=16, HV=32, K=128, V=128, HPP=hpp, VEC=vec, LANES=lanes, WARPS=warps,
                                    PREFETCH=False, STAGES=stages, L2NORM=True), vendors=("cuda",), warps=warps,
                               aligned=("state_ptr", "s_slot")))
    spec_strides = {n: "i32" for n in ("sq_t", "sq_h", "sk_t", "sk_h", "sv_t", "sv_h", "sa_t", "sb_t", "so_t", "so_h",
                                       "s_slot", "s_table")}
    for (state, size), block_v in itertools.product((("fp32", 4), ("bf16", 2), ("fp16", 2)), (32, 128)):
        types = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", a_ptr="*bf16", b_ptr="*bf16", A_log_ptr="*fp32",
                     dt_bias_ptr="*bf16", state_ptr=f"*{state}", table_ptr="*i32", cu_ptr="*i32", acc_ptr="*i32",
                     o_ptr="*bf16", scale="fp32", eps="fp32", **spec_strides)
        vec, lanes, warps, bv = spec_config(size, 128, block_v=block_v)
        out.append(CompileSpec(f"sm90 gdn spec_decode state={state} block_v={bv}", _spec_kernel, types,
                               dict(H=16, HV=32, K=128, V=128, BV=bv, VEC=vec, LANES=lanes, WARPS=warps, L2NORM=True),
                               vendors=("cuda",), warps=warps, aligned=SPEC_ALIGNED))
    return out
