"""The GDN family's planted bugs (``PLANTED``): each turns an implementation with the reference's
function names (``reference.gdn.numpy_ref``, a kernel wrapper) into the same one with one classic
kernel bug; ``tolerances.SPECS`` names the bugs each tolerance is shown to catch."""
from __future__ import annotations

import numpy as np

from conformance.cells import activation
from conformance.numerics import bf16_round
from conformance.planting import PlantedBug, Wrapped, fp16_as_bf16
from reference.gdn.numpy_ref import prepare_qk


def _result(res, state):
    """(o, pool) of a GDN call in NumPy form (returns o, mutates the pool) or JAX form."""
    return res if isinstance(res, tuple) else (res, state)


_VARLEN = ("recurrent", "chunked")
_POOL_OPS = ("recurrent", "chunked", "decode", "spec_decode")
_TOKEN_OPS = ("recurrent", "decode", "spec_decode")           # o read out token by token: o_t = S_t^T q_t


def _wrap_pool_ops(impl, ops, around):
    """``impl`` with each of ``ops`` it has replaced by ``around(name, fn, pos, args, kw)``, where
    ``pos`` is the state pool's position in ``args`` (6 for recurrent and chunked, else 7)."""
    def wrap(name):
        fn = getattr(impl, name)
        pos = 6 if name in _VARLEN else 7
        return lambda *args, **kw: around(name, fn, pos, args, kw)
    return Wrapped(impl, **{name: wrap(name) for name in ops if hasattr(impl, name)})


def _tiled_heads(impl):
    def around(name, fn, pos, args, kw):
        q, k, v = args[:3]
        order = np.arange(v.shape[1]) % q.shape[1]          # value head hv -> key head hv % H
        return fn(np.ascontiguousarray(q[:, order]), np.ascontiguousarray(k[:, order]), *args[2:], **kw)
    return _wrap_pool_ops(impl, _POOL_OPS, around)


def _token_call(fn, args: tuple, kw: dict, state, lo: int, hi: int):
    """Call a varlen op on tokens [lo, hi) of every sequence that has any; (tokens, o, pool)."""
    q, k, v, g, beta, cu, _, idx = args
    starts, ends = cu[:-1].astype(np.int64), cu[1:].astype(np.int64)
    a, b = np.minimum(starts + lo, ends), np.minimum(starts + hi, ends)
    keep = b > a
    tokens = np.concatenate([np.arange(x, y) for x, y, kept in zip(a, b, keep) if kept])
    sub_cu = np.concatenate([[0], np.cumsum((b - a)[keep])]).astype(np.int32)
    o, pool = _result(fn(q[tokens], k[tokens], v[tokens], g[tokens], beta[tokens], sub_cu, state, idx[keep],
                         **kw), state)
    return tokens, np.asarray(o, np.float32), pool


def _pieces(args, bounds, run_piece):
    """Run a varlen call (``args`` in the reference's order) as pieces of every sequence that start
    at the token offsets ``bounds`` (the last runs to the end); ``run_piece(lo, hi, pool) ->
    (tokens, o, pool)``. Returns (o, final pool)."""
    q, v, cu, state = args[0], args[2], args[5], args[6]
    o = np.zeros((q.shape[0],) + tuple(v.shape[1:]), np.float32)
    longest = int(np.max(np.diff(cu))) if len(cu) > 1 else 0
    edges = [b for b in bounds if b < longest] + [longest]
    for lo, hi in zip(edges[:-1], edges[1:]):
        tokens, part, state = run_piece(lo, hi, state)
        o[tokens] = part
    return o, state


def _skip_second_chunk(impl):
    """chunked: the second chunk of every sequence computes o but keeps the state it began with."""
    def chunked(*args, chunk_size=64, **kw):
        kw = {**kw, "chunk_size": chunk_size}

        def piece(lo, hi, state):
            if lo == chunk_size:            # this chunk's state update is lost
                tokens, o, _ = _token_call(impl.chunked, args, kw, np.array(state, copy=True), lo, hi)
                return tokens, o, state
            return _token_call(impl.chunked, args, kw, state, lo, hi)

        o, state = _pieces(args, (0, chunk_size, 2 * chunk_size), piece)
        return _written(args[6], state, o)
    return Wrapped(impl, chunked=chunked)


def _written(pool, state, o):
    """Return in the caller's form: the NumPy pool updated in place (and o), or (o, new pool)."""
    if state is pool:
        return o
    if isinstance(pool, np.ndarray) and pool.flags.writeable:
        pool[...] = np.asarray(state).astype(pool.dtype)
        return o
    return o, state


def _truncate(x32: np.ndarray, dtype) -> np.ndarray:
    """float32 -> a 16-bit dtype by truncation toward zero (not round to nearest even)."""
    nearest = x32.astype(dtype)
    away = np.abs(nearest.astype(np.float32)) > np.abs(x32)
    bits = nearest.view(np.uint16)                  # sign-magnitude: one ulp toward zero = bits - 1
    return np.where(away, bits - 1, bits).astype(np.uint16).view(dtype)


def _truncating_store(impl):
    """Every state write-back truncates to the 16-bit state dtype: the op runs in pieces of one write
    interval on a float32 copy of the pool, truncated after each piece."""
    def around(name, fn, pos, args, kw):
        pool = args[pos]
        dtype = np.asarray(pool).dtype
        if dtype.itemsize != 2:
            return fn(*args, **kw)
        work = np.asarray(pool).astype(np.float32)
        kw32 = {**kw, "state_dtype": "float32"}
        if name in _VARLEN:
            every = kw.get("state_write_interval") or kw.get("chunk_size", 64)

            def piece(lo, hi, state):
                tokens, o, state = _token_call(fn, args, kw32, state, lo, hi)
                return tokens, o, _truncate(np.asarray(state, np.float32), dtype).astype(np.float32)
            longest = int(np.max(np.diff(args[5])))
            o, work = _pieces(args[:pos] + (work,) + args[pos + 1:], range(0, longest, every), piece)
        else:
            o, work = _result(fn(*args[:pos], work, *args[pos + 1:], **kw32), work)
            o = np.asarray(o, np.float32)
        return _written(pool, _truncate(np.asarray(work, np.float32), dtype), o)
    return _wrap_pool_ops(impl, _POOL_OPS, around)


def _transposed_read(impl):
    """Each sequence's slot is read as [V, K] (K = V cells): the slots read are transposed first."""
    def around(name, fn, pos, args, kw):
        pool = args[pos]
        if name == "spec_decode":
            spec, acc = args[8], args[9]
            read = spec[np.arange(len(acc)), np.maximum(acc - 1, 0)]
        else:
            read = args[pos + 1]
        read = np.unique(read[read >= 0])
        work = np.array(pool, copy=True)
        work[read] = np.swapaxes(work[read], -1, -2)
        o, state = _result(fn(*args[:pos], work, *args[pos + 1:], **kw), work)
        return _written(pool, state, np.asarray(o, np.float32))
    return _wrap_pool_ops(impl, _POOL_OPS, around)


def _padding_written(impl):
    """A padding sequence (slot -1) is not skipped: its state lands in the pool's last slot."""
    def around(name, fn, pos, args, kw):
        pool, idx = args[pos], args[pos + 1]
        o, state = _result(fn(*args, **kw), pool)
        if np.any(idx < 0):
            state = np.array(state, copy=True)
            state[-1] = state[idx[idx >= 0][0]]
        return _written(pool, state, np.asarray(o, np.float32))
    return _wrap_pool_ops(impl, ("recurrent", "chunked", "decode"), around)


def _decode_state_through_bf16(impl):
    """decode stores the slots it writes rounded to bf16 (a float32 pool keeps float32 bytes)."""
    def around(name, fn, pos, args, kw):
        pool, idx = args[pos], args[pos + 1]
        o, state = _result(fn(*args, **kw), pool)
        slots = idx[idx >= 0]
        state = np.array(state, copy=True)
        state[slots] = bf16_round(state[slots])
        return _written(pool, state, np.asarray(o, np.float32))
    return _wrap_pool_ops(impl, ("decode",), around)


def _gates_in_bf16(impl):
    def gating(*args, **kw):
        g, beta = impl.gating(*args, **kw)
        return bf16_round(g), bf16_round(beta)
    return Wrapped(impl, gating=gating)


def _readsfp16_as_bf16(impl):
    """Every op converts its float16 activations (not the state pool) to bf16 before computing."""
    def around(name, fn, pos, args, kw):
        return fn(*(x if i == pos else fp16_as_bf16(x) for i, x in enumerate(args)), **kw)

    def gating(*args):
        return impl.gating(*map(fp16_as_bf16, args))
    return Wrapped(_wrap_pool_ops(impl, _POOL_OPS, around), gating=gating)


def _qk_norm_in_input_dtype(impl):
    """q and k are l2-normalised in their own dtype (a float16 sum of squares overflows past 65504),
    then passed on with the in-kernel norm off."""
    def norm(x, eps):
        x = np.asarray(x)
        with np.errstate(over="ignore"):
            squares = np.sum(x * x, axis=-1, keepdims=True, dtype=x.dtype)
        return (x / np.sqrt(squares + x.dtype.type(eps))).astype(x.dtype)

    def around(name, fn, pos, args, kw):
        if not kw.get("use_qk_l2norm", True):
            return fn(*args, **kw)
        eps = kw.get("l2norm_eps", 1e-6)
        args = (norm(args[0], eps), norm(args[1], eps)) + tuple(args[2:])
        return fn(*args, **{**kw, "use_qk_l2norm": False})
    return _wrap_pool_ops(impl, _POOL_OPS, around)


def _gating_in_input_dtype(impl):
    """gating computes softplus and the sigmoid in the activations' dtype (float16: exp overflows past 11.1)."""
    def gating(A_log, a, b, dt_bias):
        dt = np.asarray(a).dtype
        x = (np.asarray(a) + np.asarray(dt_bias).astype(dt)).astype(dt)
        with np.errstate(over="ignore"):
            softplus = np.where(x > dt.type(20), x, np.log1p(np.exp(x)).astype(dt))
            beta = (dt.type(1) / (dt.type(1) + np.exp(-np.asarray(b)).astype(dt))).astype(dt)
        g = -np.exp(np.asarray(A_log, np.float32)) * softplus.astype(np.float32)
        return g.astype(np.float32), beta.astype(np.float32)
    return Wrapped(impl, gating=gating)


def _readout_through_fp16(impl):
    """o leaves the op in float16 by way of the readout before the q scale: fp16(fp16(o / scale) * scale),
    scale = 1/sqrt(K) by default. For K = 64 (scale 2^-3) that is fp16(o) wherever |o| < 65504 / 8; past it
    the unscaled readout overflows to inf while o itself fits, as a grown fp32 state makes it."""
    def around(name, fn, pos, args, kw):
        o, state = _result(fn(*args, **kw), args[pos])
        scale = kw.get("scale") or 1.0 / np.sqrt(np.asarray(args[0]).shape[-1])
        with np.errstate(over="ignore", invalid="ignore"):
            unscaled = (np.asarray(o, np.float32) / np.float32(scale)).astype(np.float16)
            o = (unscaled.astype(np.float32) * np.float32(scale)).astype(np.float16)
        return _written(args[pos], state, o)
    return _wrap_pool_ops(impl, _TOKEN_OPS, around)


def _beta_through_bf16(impl):
    """The varlen ops round beta to bf16 before use (kept in its own dtype: float32 or float16)."""
    def around(name, fn, pos, args, kw):
        beta = np.asarray(args[4])
        rounded = bf16_round(beta).astype(beta.dtype)
        return fn(*args[:4], rounded, *args[5:], **kw)
    return _wrap_pool_ops(impl, _VARLEN, around)


def _stored_readout(pool, slots, qs) -> np.ndarray:
    """o rows [n, HV, V] read out of the pool's ``slots`` [n] as stored, with prepared queries ``qs`` [n, HV, K]."""
    return np.einsum("nhkv,nhk->nhv", np.asarray(pool, np.float32)[slots], qs).astype(np.float32)


def _o_from_stored_state(impl):
    """The token-by-token ops read the o of every token whose state they write back from the state as
    stored (rounded to the 16-bit pool dtype) instead of the fp32 state they just computed; recurrent runs
    in pieces of one write interval so that each piece's last token is a write-back."""
    def around(name, fn, pos, args, kw):
        q, k, v = args[:3]
        qs, _ = prepare_qk(q, k, np.asarray(v).shape[1], kw.get("scale"), kw.get("use_qk_l2norm", True),
                           kw.get("l2norm_eps", 1e-6), np.dtype(np.float32))
        pool = args[pos]
        if name == "recurrent":
            cu, idx = np.asarray(args[5]).astype(np.int64), np.asarray(args[7])

            def piece(lo, hi, state):
                tokens, o, state = _token_call(fn, args, kw, state, lo, hi)
                ends = np.minimum(cu[:-1] + hi, cu[1:])
                last, slots = ends - 1, idx
                keep = (ends > np.minimum(cu[:-1] + lo, cu[1:])) & (slots >= 0)
                where = np.searchsorted(tokens, last[keep])
                o[where] = _stored_readout(state, slots[keep], qs[last[keep]])
                return tokens, o, state
            longest = int(np.max(np.diff(cu)))
            o, state = _pieces(args, range(0, longest, kw.get("state_write_interval") or 1), piece)
            return _written(pool, state, o)
        res, state = _result(fn(*args, **kw), pool)
        o = np.array(res, np.float32)
        if name == "decode":
            idx = np.asarray(args[pos + 1])
            real = np.flatnonzero(idx >= 0)
            o[real] = _stored_readout(state, idx[real], qs[real])
        else:                                   # spec_decode: token t of sequence n is stored in spec[n, t]
            spec, acc, cu = (np.asarray(x) for x in args[pos + 1:pos + 4])
            start = spec[np.arange(len(acc)), np.maximum(acc - 1, 0)]
            for n in np.flatnonzero(start >= 0):
                rows = np.arange(cu[n], cu[n + 1])
                o[rows] = _stored_readout(state, spec[n, : len(rows)], qs[rows])
        return _written(pool, state, o.astype(np.asarray(res).dtype))
    return _wrap_pool_ops(impl, _TOKEN_OPS, around)


def _softplus_without_log1p(impl):
    """gating's softplus as log(1 + exp(x)) in float32: 1 + exp(x) rounds exp(x) away below 2^-24 times 1
    (softplus 0 for x < -16.6) and keeps only u32 / exp(x) of it relative above."""
    def gating(A_log, a, b, dt_bias):
        _, beta = impl.gating(A_log, a, b, dt_bias)
        x = np.asarray(a, np.float32) + np.asarray(dt_bias, np.float32)
        softplus = np.where(x > 20, x, np.log(np.float32(1) + np.exp(np.minimum(x, np.float32(20)))))
        return (-np.exp(np.asarray(A_log, np.float32)) * softplus).astype(np.float32), beta
    return Wrapped(impl, gating=gating)


def _act(*names):
    return lambda c: activation(c) in names


def _gdn(name, doc, ops, plant, extra=lambda c: True):
    return PlantedBug(f"gdn.{name}", "gdn", doc, lambda c: c.op in ops and extra(c), plant)


def _longer_than(n):
    return lambda c: c.op != "chunked" or max(c["lens"]) > n


PLANTED = (
    _gdn("head-mapping-tiled", "value head hv uses key head hv % H (tile) instead of hv // (HV // H)",
         _POOL_OPS, _tiled_heads, lambda c: 1 < c["H"] < c["HV"]),
    _gdn("chunk-update-skipped", "the second 64-token chunk of each sequence keeps the state it began with",
         ("chunked",), _skip_second_chunk, _longer_than(64)),
    _gdn("truncating-store", "the state is stored by truncation instead of round-to-nearest-even",
         _POOL_OPS, _truncating_store, lambda c: c["state"] != "float32"),
    _gdn("state-read-transposed", "each sequence's state slot is read as [V, K]",
         _POOL_OPS, _transposed_read, lambda c: c.get("V", c["K"]) == c["K"]),
    _gdn("padding-slot-written", "a padding sequence's state is written to the pool's last slot",
         ("recurrent", "chunked", "decode"), _padding_written, lambda c: c["slots"] == "padded"),
    _gdn("decode-state-through-bf16", "decode rounds the state it stores in a float32 pool to bf16",
         ("decode",), _decode_state_through_bf16, lambda c: c["state"] == "float32"),
    _gdn("gates-rounded-to-bf16", "g and beta are returned rounded to bf16", ("gating",), _gates_in_bf16),
    _gdn("fp16-read-as-bf16", "float16 activations are silently converted to bf16 before the op",
         ("gating",) + _POOL_OPS, _readsfp16_as_bf16, _act("float16")),
    _gdn("qk-norm-in-input-dtype", "the q/k l2 norm sums squares in the activations' 16-bit dtype",
         _POOL_OPS, _qk_norm_in_input_dtype, _act("float16", "bfloat16")),
    _gdn("fp16-readout-overflow", "the token-by-token ops' float16 o goes through a float16 store of the "
         "unscaled readout q^T S, which a grown fp32 state overflows to inf", _TOKEN_OPS, _readout_through_fp16,
         _act("float16")),
    _gdn("beta-through-bf16", "the varlen ops round beta to bf16 before use", _VARLEN, _beta_through_bf16,
         _act("float32", "float16")),
    _gdn("o-from-stored-state", "the token-by-token ops read a written-back token's o from the state as stored in "
         "the 16-bit pool, not from the fp32 state just computed", _TOKEN_OPS, _o_from_stored_state,
         lambda c: c["state"] != "float32"),
    _gdn("softplus-without-log1p", "gating's softplus is log(1 + exp(x)) in float32, not log1p(exp(x))",
         ("gating",), _softplus_without_log1p),
    _gdn("gating-in-input-dtype", "gating's softplus and sigmoid are computed in the activations' 16-bit dtype",
         ("gating",), _gating_in_input_dtype, _act("float16", "bfloat16")),
)
