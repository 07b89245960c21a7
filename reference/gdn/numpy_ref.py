"""GDN reference in NumPy: loops over sequences and tokens (or 64-token chunks), batched over heads.

Shapes and conventions: ``reference.gdn``. Every function computes in
``compute_dtype`` (float32 by default; float64 makes an independent higher-precision oracle) and
returns ``o`` as float32 ``[T, HV, V]``; rows of padding sequences (slot -1) are zero.
The state pool is updated in place.

Rounding model of the state: the state is computed in fp32 and stored in the pool's dtype by
round-to-nearest-even (a float64 state is first taken to fp32: it stands in for an exact fp32
computation). With a 16-bit ``state_dtype`` the carried state is replaced by its stored value
after token t of a sequence when ``(t+1) % state_write_interval == 0`` or t is the sequence's last
token (t counts from the sequence's start in this call); the output of token t uses the state
before that rounding. The chunked form rounds at chunk ends (relative to the sequence start).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from reference.arguments import in_place
from reference.gdn import arguments

IN_PLACE = "the NumPy reference updates the state pool in place"

_BF16 = np.dtype(ml_dtypes.bfloat16)


# ---------------------------------------------------------------- small pieces (one job each)

def _softplus(x: np.ndarray) -> np.ndarray:
    """softplus with beta 1 and threshold 20 (x > 20 -> x), as torch and the kernels."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _gates(A_log, a, b, dt_bias, cdt) -> tuple[np.ndarray, np.ndarray]:
    A_log, a, b, dt_bias = (np.asarray(x, cdt) for x in (A_log, a, b, dt_bias))
    g = -np.exp(A_log) * _softplus(a + dt_bias)
    beta = 1.0 / (1.0 + np.exp(-b))
    return g, beta


def _expand_heads(x: np.ndarray, HV: int) -> np.ndarray:
    """[T, H, D] -> [T, HV, D]; value head hv uses key head hv // (HV // H) (repeat-interleave)."""
    return np.repeat(x, HV // x.shape[1], axis=1)


def _l2norm(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def prepare_qk(q, k, HV, scale, use_qk_l2norm, eps, cdt):
    """q, k [T, H, K] -> scale * l2norm(q), l2norm(k) as [T, HV, K] in ``cdt``."""
    q, k = np.asarray(q, cdt), np.asarray(k, cdt)
    if use_qk_l2norm:
        q, k = _l2norm(q, eps), _l2norm(k, eps)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    return _expand_heads(q * cdt.type(scale), HV), _expand_heads(k, HV)


def _load_state(state: np.ndarray, slot: int, cdt) -> np.ndarray:
    """The [HV, K, V] state of one slot, in the compute dtype."""
    return state[slot].astype(cdt)


def _to_state(S: np.ndarray, sdt) -> np.ndarray:
    """The stored value: S taken to fp32, then rounded to nearest even in the state dtype."""
    return np.asarray(S, np.float32).astype(sdt)


def _stored(S: np.ndarray, sdt) -> np.ndarray:
    """What a kernel reads back after storing S (same dtype as S)."""
    return _to_state(S, sdt).astype(S.dtype)


def _operand_rounding(operand_dtype: str):
    """Identity, or a bf16 / fp16 round trip of a GEMM operand (fp32 first, then round-to-nearest-even)."""
    if operand_dtype == "float32":
        return lambda x: x
    narrow = _BF16 if operand_dtype == "bfloat16" else np.dtype(np.float16)
    return lambda x: np.asarray(x, np.float32).astype(narrow).astype(x.dtype)


def token_step(S, q, k, v, g, beta):
    """One token for all heads. S [HV,K,V]; q, k [HV,K]; v [HV,V]; g, beta [HV] -> (S_t, o_t)."""
    S = S * np.exp(g)[:, None, None]
    kv = (k[:, None, :] @ S)[:, 0, :]
    u = beta[:, None] * (v - kv)
    S = S + k[:, :, None] * u[:, None, :]
    return S, (q[:, None, :] @ S)[:, 0, :]


def _unit_lower_inverse(A: np.ndarray) -> np.ndarray:
    """(I - A)^-1 for strictly lower A [HV, C, C], by forward substitution row by row."""
    X = A.copy()
    for i in range(1, A.shape[-1]):
        X[:, i, :i] += np.einsum("hk,hkj->hj", X[:, i, :i], X[:, :i, :i])
    return X + np.eye(A.shape[-1], dtype=A.dtype)


def _tf32(x: np.ndarray) -> np.ndarray:
    """``x`` as a tensor core reads an fp32 operand at TF32 input precision: rounded to fp32, then its low 13
    mantissa bits dropped (truncated to 10); returned in ``x``'s dtype."""
    bits = np.asarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
    return bits.view(np.float32).astype(x.dtype)


def _fla_unit_lower_inverse(A: np.ndarray) -> np.ndarray:
    """(I - A)^-1 for strictly lower A [HV, C, C] (C <= 64) as fla-core 0.6.0 computes it on an NVIDIA GPU
    (``chunk_gated_delta_rule_fwd_kkt_solve_kernel``, the chunk padded to 64 rows): each 16-row diagonal block
    by substitution, the off-diagonal blocks merged by products whose operands the tensor cores read at TF32
    input precision (``SOLVE_TRIL_DOT_PRECISION = 'tf32'``), in the kernel's order and grouping."""
    C = A.shape[-1]
    P = np.zeros(A.shape[:-2] + (64, 64), A.dtype)
    P[..., :C, :C] = A
    b = [[P[..., 16 * i:16 * i + 16, 16 * j:16 * j + 16] for j in range(4)] for i in range(4)]

    def dot(x, y):
        return _tf32(x) @ _tf32(y)

    d = [_unit_lower_inverse(b[i][i]) for i in range(4)]
    X = {(i, i): d[i] for i in range(4)}
    for i in (1, 2, 3):
        X[i, i - 1] = dot(dot(d[i], b[i][i - 1]), d[i - 1])
    X[2, 0] = dot(d[2], dot(b[2][0], d[0]) + dot(b[2][1], X[1, 0]))
    X[3, 1] = dot(d[3], dot(b[3][1], d[1]) + dot(b[3][2], X[2, 1]))
    X[3, 0] = dot(d[3], dot(b[3][0], d[0]) + dot(b[3][1], X[1, 0]) + dot(b[3][2], X[2, 0]))
    out = np.zeros_like(P)
    for (i, j), x in X.items():
        out[..., 16 * i:16 * i + 16, 16 * j:16 * j + 16] = x
    return out[..., :C, :C]


def _chunk_forward(S, q, k, v, g, beta, rnd, fla_scale=None):
    """One chunk of one sequence, UT/WY form, all heads at once.

    S [HV,K,V] (state at chunk start); q, k [C,HV,K]; v [C,HV,V]; g, beta [C,HV].
    ``rnd`` rounds GEMM operands (identity for the exact form). Returns (o [C,HV,V], S_next).
    ``fla_scale`` (None: the CPU kernel's rounding points) selects the rounding points of FLA's chunk
    kernels with q unscaled: the -beta*D*kk^T matrix is inverted unrounded; q's scale and exp(G) multiply
    the readout's products; v_new is rounded only for the readout; the state increment is
    k^T rnd(v_new * exp(G_last - G)); o is rounded; T is FLA's (``_fla_unit_lower_inverse``: TF32 merge).
    """
    q, k, v = (x.transpose(1, 0, 2) for x in (q, k, v))
    g, beta = g.T, beta.T
    C = g.shape[1]
    G = np.cumsum(g, axis=1)                                   # chunk-local cumsum [HV, C]
    lower = np.tril(np.ones((C, C), dtype=bool))
    D = np.exp(np.where(lower, G[:, :, None] - G[:, None, :], -np.inf))   # exp(G_i - G_j), j <= i
    strict = np.tril(np.ones((C, C), dtype=bool), -1)
    A = np.where(strict, -beta[:, :, None] * (k @ k.transpose(0, 2, 1)) * D, 0.0)
    Tm = rnd(_fla_unit_lower_inverse(A) if fla_scale is not None else _unit_lower_inverse(rnd(A)))   # (I + M)^-1
    eG = np.exp(G)[:, :, None]
    W = rnd(Tm @ rnd(beta[:, :, None] * eG * k))
    U = rnd(Tm @ rnd(beta[:, :, None] * v))
    S_op = rnd(S)
    v_new = U - W @ S_op
    decay = np.exp(G[:, -1])[:, None, None]
    qkD = rnd(np.where(lower, (q @ k.transpose(0, 2, 1)) * D, 0.0))
    if fla_scale is None:
        v_new = rnd(v_new)
        o = rnd(q * eG) @ S_op + qkD @ v_new
        to_end = rnd(k * np.exp(G[:, -1:] - G)[:, :, None])    # K * exp(G_last - G)
        S_next = decay * S + to_end.transpose(0, 2, 1) @ v_new
    else:
        o = rnd(fla_scale * (q @ S_op) * eG + fla_scale * (qkD @ rnd(v_new)))
        S_next = decay * S + k.transpose(0, 2, 1) @ rnd(v_new * np.exp(G[:, -1:] - G)[:, :, None])
    return o.transpose(1, 0, 2), S_next


def _segment_starts(S, qs, ks, v, g, beta, s0: int, s1: int, span: int, C: int, rnd) -> dict:
    """{first token of segment i > 0: its start state} of the sequence of tokens s0 .. s1 - 1 in segments of
    ``span`` tokens from S [HV, K, V]: S_{i+1} = A_i S_i + B_i, [A_i | B_i] [HV, K, K + V] the affine map of
    segment i's (full) chunks: ``_chunk_forward`` on M = [A | B] from [I | 0] with values [0 | v] (per chunk
    M = exp(G_last) M + Kd^T rnd([0 | U] - W rnd(M)), U's zero columns exact), every segment but the last."""
    HV, K, V = S.shape
    first = np.concatenate([np.broadcast_to(np.eye(K, dtype=S.dtype), (HV, K, K)), np.zeros_like(S)], axis=2)
    starts = {}
    for b in range(s0, s1 - span, span):
        M = first
        for c0 in range(b, b + span, C):
            values = np.concatenate([np.zeros((C, HV, K), v.dtype), v[c0:c0 + C]], axis=2)
            _, M = _chunk_forward(M, qs[c0:c0 + C], ks[c0:c0 + C], values, g[c0:c0 + C], beta[c0:c0 + C], rnd)
        S = M[:, :, :K] @ S + M[:, :, K:]
        starts[b + span] = S
    return starts


def _write_back(step: int, length: int, interval: int) -> bool:
    """Is the state stored after position ``step`` (1-based count of tokens done)?"""
    return step % interval == 0 or step == length


# ---------------------------------------------------------------- the ops

def gating(A_log, a, b, dt_bias, *, compute_dtype="float32"):
    """g = -exp(A_log) * softplus(a + dt_bias) (threshold 20), beta = sigmoid(b).

    A_log, dt_bias [HV]; a, b [T, HV] -> (g, beta) float32 [T, HV].
    """
    arguments.gating(A_log, a, b, dt_bias)
    g, beta = _gates(A_log, a, b, dt_bias, arguments.compute_dtype(compute_dtype))
    return g.astype(np.float32), beta.astype(np.float32)


def recurrent(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
              l2norm_eps=1e-6, state_dtype="float32", state_write_interval=1, compute_dtype="float32"):
    """Token-by-token gated delta rule over packed sequences; updates ``state`` in place; returns o."""
    in_place("state", state, IN_PLACE)
    dims, cu, idx = arguments.varlen(q, k, v, g, beta, cu_seqlens, state, state_indices,
                                     state_dtype, scale, l2norm_eps)
    interval = arguments.interval(state_write_interval)
    cdt, sdt = arguments.compute_dtype(compute_dtype), arguments.state_dtype(state_dtype)
    qs, ks = prepare_qk(q, k, dims.HV, scale, use_qk_l2norm, l2norm_eps, cdt)
    v, g, beta = (np.asarray(x, cdt) for x in (v, g, beta))
    o = np.zeros((dims.T, dims.HV, dims.V), np.float32)
    for n in np.flatnonzero(idx >= 0):
        s0, s1 = cu[n], cu[n + 1]
        S = _load_state(state, idx[n], cdt)
        for i in range(s0, s1):
            S, o[i] = token_step(S, qs[i], ks[i], v[i], g[i], beta[i])
            if sdt != np.float32 and _write_back(i + 1 - s0, s1 - s0, interval):
                S = _stored(S, sdt)
        state[idx[n]] = _to_state(S, sdt)
    return o


def chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
            l2norm_eps=1e-6, state_dtype="float32", state_write_interval=None, chunk_size=64,
            operand_dtype="float32", rounding_points="cpu", compute_dtype="float32", segment_chunks=None):
    """Chunked (UT/WY) gated delta rule; same contract as ``recurrent``.

    ``state_write_interval`` defaults to ``chunk_size`` and must be a multiple of it.
    ``operand_dtype="bfloat16"`` models the CPU chunk kernel (optimized/cpu): q and k
    after l2norm/scale, the -beta*D*kk^T matrix, its inverse T, W, U, the chunk-start state copy
    used for W@S and the readout, v_new = U - W@S, and the other GEMM operands are rounded to bf16;
    products accumulate in the compute dtype; the carried state stays in the compute dtype.
    ``operand_dtype="float16"`` rounds the same operands to fp16. ``rounding_points="fla"`` (with
    16-bit operands: FLA rounds to its inputs' dtype) rounds where fla-core 0.6.0's chunk_gated_delta_rule
    does instead: q and k straight after the l2 norm (the scale applied to the readout's products),
    the inverse T but not the matrix inverted, W, U, the chunk-start state copy, v_new for the readout,
    v_new * exp(G_last - G) for the state increment, and the output o; T is merged from 16-row blocks by
    products of TF32-truncated operands, as FLA's solve does on an NVIDIA GPU.
    ``segment_chunks`` (None: the chunks in order) models a segmented state pass: each sequence split into
    segments of that many chunks (the last: the rest), segment i > 0 starting from S_i = A_{i-1} S_{i-1} + B_{i-1}
    (``_segment_starts``: the affine maps of the segments' chunks, with the state's operand roundings but no
    storage rounding), that start state rounded to the state dtype where a write-back falls on its first token.
    """
    in_place("state", state, IN_PLACE)
    dims, cu, idx = arguments.varlen(q, k, v, g, beta, cu_seqlens, state, state_indices,
                                     state_dtype, scale, l2norm_eps)
    C = arguments.chunk(chunk_size)
    interval = arguments.interval(C if state_write_interval is None else state_write_interval, C)
    cdt, sdt = arguments.compute_dtype(compute_dtype), arguments.state_dtype(state_dtype)
    rnd = _operand_rounding(arguments.operand_dtype(operand_dtype))
    fla = arguments.rounding_points(rounding_points, operand_dtype) == "fla"
    span = C * arguments.segment_chunks(segment_chunks, fla) if segment_chunks is not None else None
    fla_scale = cdt.type(1.0 / np.sqrt(dims.K) if scale is None else scale) if fla else None
    qs, ks = prepare_qk(q, k, dims.HV, 1.0 if fla else scale, use_qk_l2norm, l2norm_eps, cdt)
    qs, ks = rnd(qs), rnd(ks)
    v, g, beta = (np.asarray(x, cdt) for x in (v, g, beta))
    o = np.zeros((dims.T, dims.HV, dims.V), np.float32)
    for n in np.flatnonzero(idx >= 0):
        s0, s1 = cu[n], cu[n + 1]
        S = _load_state(state, idx[n], cdt)
        starts = {} if span is None else _segment_starts(S, qs, ks, v, g, beta, s0, s1, span, C, rnd)
        for c0 in range(s0, s1, C):
            c1 = min(c0 + C, s1)
            if c0 in starts:
                S = starts[c0]
                if sdt != np.float32 and _write_back(c0 - s0, s1 - s0, interval):
                    S = _stored(S, sdt)
            o[c0:c1], S = _chunk_forward(S, qs[c0:c1], ks[c0:c1], v[c0:c1], g[c0:c1], beta[c0:c1], rnd,
                                              fla_scale)
            if sdt != np.float32 and _write_back(c1 - s0, s1 - s0, interval):
                S = _stored(S, sdt)
        state[idx[n]] = _to_state(S, sdt)
    return o


def decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, *, scale=None, use_qk_l2norm=True,
           l2norm_eps=1e-6, state_dtype="float32", compute_dtype="float32"):
    """One token per sequence with fused gating: q, k [N,H,K], v [N,HV,V], a, b [N,HV].

    The state is rounded after every token (the sequence's only token); returns o [N, HV, V].
    """
    in_place("state", state, IN_PLACE)
    dims, idx = arguments.decode(q, k, v, A_log, a, b, dt_bias, state, state_indices,
                                 state_dtype, scale, l2norm_eps)
    g, beta = _gates(A_log, a, b, dt_bias, arguments.compute_dtype(compute_dtype))
    cu = np.arange(dims.N + 1, dtype=np.int32)
    return recurrent(q, k, v, g, beta, cu, state, idx, scale=scale, use_qk_l2norm=use_qk_l2norm,
                     l2norm_eps=l2norm_eps, state_dtype=state_dtype, state_write_interval=1,
                     compute_dtype=compute_dtype)


def spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                cu_seqlens, *, scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, state_dtype="float32",
                compute_dtype="float32", resume_from_stored=True):
    """Speculative decode: sequence n resumes from slot ``spec_state_indices[n, max(acc-1, 0)]`` and
    stores the state after its draft token t into ``spec_state_indices[n, t]`` (rounded); the next
    token reads that stored state (``resume_from_stored=False``: it goes on from the unrounded state in
    ``compute_dtype``, each stored copy rounded once from it). q, k [T,H,K], v [T,HV,V], a, b [T,HV];
    returns o [T, HV, V].
    """
    in_place("state", state, IN_PLACE)
    dims, cu, spec, _, start = arguments.spec_decode(
        q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens,
        state_dtype, scale, l2norm_eps)
    cdt, sdt = arguments.compute_dtype(compute_dtype), arguments.state_dtype(state_dtype)
    g, beta = _gates(A_log, a, b, dt_bias, cdt)
    qs, ks = prepare_qk(q, k, dims.HV, scale, use_qk_l2norm, l2norm_eps, cdt)
    v = np.asarray(v, cdt)
    o = np.zeros((dims.T, dims.HV, dims.V), np.float32)
    for n in np.flatnonzero(start >= 0):
        S = _load_state(state, start[n], cdt)
        for t, i in enumerate(range(cu[n], cu[n + 1])):
            S, o[i] = token_step(S, qs[i], ks[i], v[i], g[i], beta[i])
            state[spec[n, t]] = _to_state(S, sdt)
            if resume_from_stored:
                S = _load_state(state, spec[n, t], cdt)
    return o
