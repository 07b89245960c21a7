"""GDN reference in JAX: functional, all sequences at once (padded to a common length, masked).

Same functions and arguments as ``numpy_ref``; ops with a state return ``(o, new_state)``:
``o`` float32 ``[T, HV, V]`` (rows of padding sequences are zero), ``new_state`` the whole pool in
its dtype. The recurrent form is one ``lax.scan`` over token positions, batched over sequences
and heads; the chunked form computes every chunk's UT transform at once (a batched triangular
solve, not numpy_ref's forward substitution) and scans over chunks. Rounding model: numpy_ref's
docstring (fp32 state rounded to nearest even into the pool dtype at the write-back points).
float64 compute runs under ``jax.enable_x64``.

All math runs in one jitted function per op; the host only lays tokens out as
[position, sequence] grids (NumPy gathers), with lengths and sequence counts padded to powers of
two so cells of similar shape share a compiled program (an eager JAX op costs a compile per shape).
"""
from __future__ import annotations

import contextlib
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from reference.gdn import arguments


def _precision(compute_dtype: str):
    """Context for the compute dtype: float64 needs JAX's x64 mode."""
    arguments.compute_dtype(compute_dtype)
    return jax.enable_x64(True) if compute_dtype == "float64" else contextlib.nullcontext()


def _round_trip(x, dtype_name):
    """x (compute dtype) -> fp32 -> nearest-even ``dtype_name`` -> compute dtype."""
    return x.astype(jnp.float32).astype(jnp.dtype(dtype_name)).astype(x.dtype)


# Which rounding a write-back applies, as a traced code (one compiled program serves all dtypes).
_ROUNDING = {None: 0, "bfloat16": 1, "float16": 2, "float32": 3}


def _round_by_code(x, code):
    """Round trip of x through the pool dtype named by ``code`` (0: no rounding)."""
    options = [_round_trip(x, name) for name in ("bfloat16", "float16", "float32")]
    return jnp.select([code == 1, code == 2, code == 3], options, x)


def _softplus(x):
    return jnp.where(x > 20.0, x, jnp.log1p(jnp.exp(jnp.minimum(x, 20.0))))


def _gates(A_log, a, b, dt_bias):
    """A_log, dt_bias [HV]; a, b [..., HV] -> (g, beta) [..., HV]."""
    return -jnp.exp(A_log) * _softplus(a + dt_bias), jax.nn.sigmoid(b)


def _prepare_qk(q, k, HV, scale, use_qk_l2norm, eps):
    """q, k [..., H, K] -> scale * l2norm(q), l2norm(k) [..., HV, K] (key head h serves value
    heads h*G .. h*G+G-1, G = HV // H). ``scale`` <= 0 means 1/sqrt(K)."""
    if use_qk_l2norm:
        q = q * jax.lax.rsqrt(jnp.sum(q * q, axis=-1, keepdims=True) + eps)
        k = k * jax.lax.rsqrt(jnp.sum(k * k, axis=-1, keepdims=True) + eps)
    *lead, H, K = q.shape
    q = q * jnp.where(scale > 0, scale, K ** -0.5).astype(q.dtype)
    expand = lambda x: jnp.broadcast_to(x[..., None, :], (*lead, H, HV // H, K)).reshape(*lead, HV, K)
    return expand(q), expand(k)


def _pow2(n: int, least: int = 1) -> int:
    return max(least, 1 << (int(n) - 1).bit_length())


def _grid(cu: np.ndarray, seqs: np.ndarray, length: int, width: int):
    """Token index and validity [length, width] of position t of the seqs[j] (0 / False past the end)."""
    lens = np.zeros(width, np.int64)
    lens[: seqs.size] = np.diff(cu)[seqs]
    starts = np.zeros(width, np.int64)
    starts[: seqs.size] = cu[:-1][seqs]
    t = np.arange(length)[:, None]
    valid = t < lens[None, :]
    return np.where(valid, starts[None, :] + t, 0), valid, lens


def _host(x, dtype) -> np.ndarray:
    return np.asarray(x).astype(dtype)


def _scalars(scale, eps, cdt):
    return np.asarray(0.0 if scale is None else scale, cdt), np.asarray(eps, cdt)


@partial(jax.jit, static_argnames=("HV", "use_qk_l2norm", "fused_gating", "emit_states"))
def _token_scan(S0, q, k, v, x1, x2, gate_params, valid, write, scale, eps, round_code, *, HV,
                use_qk_l2norm, fused_gating, emit_states):
    """The recurrent form for a grid of sequences.

    S0 [N,HV,K,V]; q, k [L,N,H,K]; v [L,N,HV,V]; (x1, x2) = (g, beta) or, with fused gating,
    (a, b) [L,N,HV] and gate_params = (A_log, dt_bias); valid, write [L,N].
    Returns o [L,N,HV,V] float32, the final state as float32 and (emit_states) every token's
    state [L,N,HV,K,V] (float32 holding values of the pool dtype once rounded).
    """
    qs, ks = _prepare_qk(q, k, HV, scale, use_qk_l2norm, eps)
    g, beta = _gates(*gate_params[:1], x1, x2, gate_params[1]) if fused_gating else (x1, x2)

    def body(S, x):
        q_t, k_t, v_t, g_t, b_t, valid_t, write_t = x
        S_dec = S * jnp.exp(g_t)[..., None, None]
        u = b_t[..., None] * (v_t - jnp.einsum("nhk,nhkv->nhv", k_t, S_dec))
        S_new = S_dec + k_t[..., :, None] * u[..., None, :]
        o_t = jnp.einsum("nhk,nhkv->nhv", q_t, S_new)
        S_new = jnp.where(write_t[:, None, None, None], _round_by_code(S_new, round_code), S_new)
        S_new = jnp.where(valid_t[:, None, None, None], S_new, S)
        return S_new, (o_t.astype(jnp.float32), S_new.astype(jnp.float32) if emit_states else None)

    S, (o, states) = jax.lax.scan(body, S0, (qs, ks, v, g, beta, valid, write))
    return o, S.astype(jnp.float32), states


def _run_token_scan(q, k, v, x1, x2, gate_params, cu, seqs, S0, write_every, *, scale, eps, HV,
                    use_qk_l2norm, round_to, cdt, emit_states=False):
    """Lay the sequences ``seqs`` of packed inputs on a grid and run ``_token_scan``.

    Returns (pos, valid, o, S_final, states) with grids [L, width] (width >= len(seqs))."""
    lens_all = np.diff(cu)[seqs]
    L, width = _pow2(lens_all.max(), 8), _pow2(seqs.size)
    pos, valid, lens = _grid(cu, seqs, L, width)
    step = np.arange(1, L + 1)[:, None]
    write = valid & ((step % write_every == 0) | (step == lens[None, :]))
    S0_pad = np.zeros((width,) + S0.shape[1:], cdt)
    S0_pad[: seqs.size] = S0
    grid = lambda x: _host(x, cdt)[pos]
    o, S, states = _token_scan(S0_pad, grid(q), grid(k), grid(v), grid(x1), grid(x2),
                               tuple(_host(p, cdt) for p in gate_params), valid, write,
                               *_scalars(scale, eps, cdt), np.int32(_ROUNDING[round_to]), HV=HV,
                               use_qk_l2norm=use_qk_l2norm, fused_gating=bool(gate_params),
                               emit_states=emit_states)
    return pos, valid, np.asarray(o), np.asarray(S)[: seqs.size], states


def _scatter_o(T: int, HV: int, V: int, pos, valid, o) -> np.ndarray:
    out = np.zeros((T, HV, V), np.float32)
    out[pos[valid]] = o[valid]
    return out


def _new_pool(state, slots: np.ndarray, values) -> jnp.ndarray:
    """A copy of the pool with ``values`` (float32 holding pool-dtype values: exact) in ``slots``."""
    pool = np.array(state)
    pool[slots] = np.asarray(values).astype(pool.dtype)
    return jnp.asarray(pool)


# ---------------------------------------------------------------- the ops

@jax.jit
def _gating_jit(A_log, a, b, dt_bias):
    g, beta = _gates(A_log, a, b, dt_bias)
    return g.astype(jnp.float32), beta.astype(jnp.float32)


def gating(A_log, a, b, dt_bias, *, compute_dtype="float32"):
    """g = -exp(A_log) * softplus(a + dt_bias) (threshold 20), beta = sigmoid(b); float32 [T, HV].

    Elementwise: the host lays the [T, HV] grid (A_log, dt_bias broadcast) flat and pads it to a
    power of two, so one compiled program serves many shapes."""
    HV = arguments.gating(A_log, a, b, dt_bias)
    T = a.shape[0]
    with _precision(compute_dtype):
        cdt = np.dtype(compute_dtype)
        size = _pow2(T * HV, 64)
        flat = lambda x: np.resize(np.broadcast_to(_host(x, cdt), (T, HV)).ravel(), size)
        g, beta = _gating_jit(*(flat(x) for x in (A_log, a, b, dt_bias)))
        return g[: T * HV].reshape(T, HV), beta[: T * HV].reshape(T, HV)


def _varlen_scan(q, k, v, x1, x2, gate_params, cu, state, idx, dims, write_every, *, scale,
                 use_qk_l2norm, l2norm_eps, state_dtype, compute_dtype):
    """Shared driver of recurrent and decode: token scan of the non-padding sequences."""
    seqs = np.flatnonzero(idx >= 0)
    if seqs.size == 0:
        return jnp.zeros((dims.T, dims.HV, dims.V), jnp.float32), jnp.asarray(state)
    with _precision(compute_dtype):
        cdt = np.dtype(compute_dtype)
        S0 = _host(np.asarray(state)[idx[seqs]], cdt)
        pos, valid, o, S, _ = _run_token_scan(
            q, k, v, x1, x2, gate_params, cu, seqs, S0, write_every, scale=scale, eps=l2norm_eps,
            HV=dims.HV, use_qk_l2norm=use_qk_l2norm,
            round_to=None if state_dtype == "float32" else state_dtype, cdt=cdt)
    return jnp.asarray(_scatter_o(dims.T, dims.HV, dims.V, pos, valid, o)), _new_pool(state, idx[seqs], S)


def recurrent(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
              l2norm_eps=1e-6, state_dtype="float32", state_write_interval=1, compute_dtype="float32"):
    """Token-by-token gated delta rule over packed sequences; returns (o, new_state)."""
    dims, cu, idx = arguments.varlen(q, k, v, g, beta, cu_seqlens, state, state_indices,
                                     state_dtype, scale, l2norm_eps)
    interval = arguments.interval(state_write_interval)
    return _varlen_scan(q, k, v, g, beta, (), cu, state, idx, dims, interval, scale=scale,
                        use_qk_l2norm=use_qk_l2norm, l2norm_eps=l2norm_eps, state_dtype=state_dtype,
                        compute_dtype=compute_dtype)


def decode(q, k, v, A_log, a, b, dt_bias, state, state_indices, *, scale=None, use_qk_l2norm=True,
           l2norm_eps=1e-6, state_dtype="float32", compute_dtype="float32"):
    """One token per sequence with fused gating; returns (o [N,HV,V], new_state)."""
    dims, idx = arguments.decode(q, k, v, A_log, a, b, dt_bias, state, state_indices,
                                 state_dtype, scale, l2norm_eps)
    cu = np.arange(dims.N + 1)
    return _varlen_scan(q, k, v, a, b, (A_log, dt_bias), cu, state, idx, dims, 1, scale=scale,
                        use_qk_l2norm=use_qk_l2norm, l2norm_eps=l2norm_eps, state_dtype=state_dtype,
                        compute_dtype=compute_dtype)


def spec_decode(q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens,
                cu_seqlens, *, scale=None, use_qk_l2norm=True, l2norm_eps=1e-6, state_dtype="float32",
                compute_dtype="float32"):
    """Speculative decode (numpy_ref.spec_decode semantics); returns (o [T,HV,V], new_state)."""
    dims, cu, spec, _, start = arguments.spec_decode(
        q, k, v, A_log, a, b, dt_bias, state, spec_state_indices, num_accepted_tokens, cu_seqlens,
        state_dtype, scale, l2norm_eps)
    seqs = np.flatnonzero(start >= 0)
    if seqs.size == 0:
        return jnp.zeros((dims.T, dims.HV, dims.V), jnp.float32), jnp.asarray(state)
    with _precision(compute_dtype):
        cdt = np.dtype(compute_dtype)
        S0 = _host(np.asarray(state)[start[seqs]], cdt)
        # every token's state is stored and the next token reads it back: round after each token
        pos, valid, o, _, states = _run_token_scan(
            q, k, v, a, b, (A_log, dt_bias), cu, seqs, S0, 1, scale=scale, eps=l2norm_eps, HV=dims.HV,
            use_qk_l2norm=use_qk_l2norm, round_to=state_dtype, cdt=cdt, emit_states=True)
    t, j = np.nonzero(valid)
    slots = spec[seqs[j], t]
    return (jnp.asarray(_scatter_o(dims.T, dims.HV, dims.V, pos, valid, o)),
            _new_pool(state, slots, np.asarray(states)[t, j]))


@partial(jax.jit, static_argnames=("HV", "use_qk_l2norm", "operand_dtype"))
def _chunk_scan(S0, q, k, v, g, beta, valid_chunk, write, scale, eps, round_code, *, HV, use_qk_l2norm,
                operand_dtype):
    """The chunked form for a grid of sequences.

    S0 [N,HV,K,V]; q, k [nC,N,C,H,K]; v [nC,N,C,HV,V]; g, beta [nC,N,C,HV]; valid_chunk, write [nC,N].
    Positions past a sequence's end carry g = beta = k = v = 0 (they change nothing).
    Returns (o [nC,N,C,HV,V] float32, final state as float32).
    """
    rnd = (lambda x: x) if operand_dtype == "float32" else (lambda x: _round_trip(x, operand_dtype))
    qs, ks = _prepare_qk(q, k, HV, scale, use_qk_l2norm, eps)
    heads_first = lambda x: jnp.swapaxes(x, 2, 3)                 # [nC, N, HV, C, ...]
    qs, ks, v = rnd(heads_first(qs)), rnd(heads_first(ks)), heads_first(v)
    g, beta = jnp.swapaxes(g, 2, 3), jnp.swapaxes(beta, 2, 3)
    C = g.shape[-1]
    G = jnp.cumsum(g, axis=-1)                                   # chunk-local
    lower = jnp.tril(jnp.ones((C, C), bool))
    strict = jnp.tril(jnp.ones((C, C), bool), -1)
    D = jnp.exp(jnp.where(lower, G[..., :, None] - G[..., None, :], -jnp.inf))
    kk = jnp.einsum("...ik,...jk->...ij", ks, ks)
    M = rnd(jnp.where(strict, beta[..., :, None] * kk * D, 0.0))
    eye = jnp.eye(C, dtype=M.dtype)
    identity = eye + 0 * M            # built at run time: a broadcast constant would be folded by XLA
    Tm = rnd(jax.lax.linalg.triangular_solve(eye + M, identity, left_side=True,
                                             lower=True, unit_diagonal=True))
    eG = jnp.exp(G)[..., None]
    W = rnd(Tm @ rnd(beta[..., None] * eG * ks))
    U = rnd(Tm @ rnd(beta[..., None] * v))
    Qg = rnd(qs * eG)
    Aqk = rnd(jnp.where(lower, jnp.einsum("...ik,...jk->...ij", qs, ks) * D, 0.0))
    to_end = rnd(ks * jnp.exp(G[..., -1:] - G)[..., None])       # K * exp(G_last - G)
    last = jnp.exp(G[..., -1])

    def body(S, x):
        W_c, U_c, Qg_c, Aqk_c, to_end_c, last_c, valid_c, write_c = x
        S_op = rnd(S)
        v_new = rnd(U_c - W_c @ S_op)
        o_c = Qg_c @ S_op + Aqk_c @ v_new
        S_next = last_c[..., None, None] * S + jnp.swapaxes(to_end_c, -1, -2) @ v_new
        S_next = jnp.where(write_c[:, None, None, None], _round_by_code(S_next, round_code), S_next)
        return jnp.where(valid_c[:, None, None, None], S_next, S), o_c.astype(jnp.float32)

    S, o = jax.lax.scan(body, S0, (W, U, Qg, Aqk, to_end, last, valid_chunk, write))
    return jnp.swapaxes(o, 2, 3), S.astype(jnp.float32)


def chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
            l2norm_eps=1e-6, state_dtype="float32", state_write_interval=None, chunk_size=64,
            operand_dtype="float32", compute_dtype="float32"):
    """Chunked (UT/WY) gated delta rule; returns (o, new_state). Arguments as numpy_ref.chunked."""
    dims, cu, idx = arguments.varlen(q, k, v, g, beta, cu_seqlens, state, state_indices,
                                     state_dtype, scale, l2norm_eps)
    C = arguments.chunk(chunk_size)
    interval = arguments.interval(C if state_write_interval is None else state_write_interval, C)
    operand_dtype = arguments.operand_dtype(operand_dtype)
    seqs = np.flatnonzero(idx >= 0)
    if seqs.size == 0:
        return jnp.zeros((dims.T, dims.HV, dims.V), jnp.float32), jnp.asarray(state)
    with _precision(compute_dtype):
        cdt = np.dtype(compute_dtype)
        nC, width = _pow2(-(-np.diff(cu)[seqs].max() // C)), _pow2(seqs.size)
        pos, valid, lens = _grid(cu, seqs, nC * C, width)              # [nC*C, width]
        pos, valid = pos.reshape(nC, C, width).swapaxes(1, 2), valid.reshape(nC, C, width).swapaxes(1, 2)
        grid = lambda x: np.where(valid.reshape(valid.shape + (1,) * (np.ndim(x) - 1)),
                                  _host(x, cdt)[pos], 0).astype(cdt)
        chunk_end = np.minimum((np.arange(nC)[:, None] + 1) * C, lens[None, :])  # tokens done [nC, width]
        valid_chunk = valid[:, :, 0]
        write = valid_chunk & ((chunk_end % interval == 0) | (chunk_end == lens[None, :]))
        S0 = np.zeros((width, dims.HV, dims.K, dims.V), cdt)
        S0[: seqs.size] = _host(np.asarray(state)[idx[seqs]], cdt)
        o, S = _chunk_scan(S0, grid(q), grid(k), grid(v), grid(g), grid(beta), valid_chunk, write,
                           *_scalars(scale, l2norm_eps, cdt),
                           np.int32(_ROUNDING[None if state_dtype == "float32" else state_dtype]),
                           HV=dims.HV, use_qk_l2norm=use_qk_l2norm, operand_dtype=operand_dtype)
    o = _scatter_o(dims.T, dims.HV, dims.V, pos, valid, np.asarray(o))
    return jnp.asarray(o), _new_pool(state, idx[seqs], np.asarray(S)[: seqs.size])
