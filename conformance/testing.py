"""Planted bugs, defined once, and the helpers that show a family's tolerances catch them.

A planted bug turns an implementation (an object with the family reference's function names, as
``run_with`` takes it: ``reference.<family>.numpy_ref``, a backend's kernel wrapper) into the same
implementation with one classic kernel bug, so the same bug runs against the references, the C++
kernels, the Triton kernels and the emulations. ``PLANTED`` holds them by name; each family's
``tolerances.SPECS`` names the bugs each tolerance is shown to catch.

    bug = PLANTED["gdn.head-mapping-tiled"]
    cell = first_failing_cell(bug.plant(numpy_ref), "gdn", "exact", [c for c in cells if bug.applies(c)])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import ml_dtypes
import numpy as np

from conformance import families
from conformance.cells import Cell, activation
from conformance.compare import Comparison, Tolerance, Verdict, compare
from conformance.inprocess import inputs_copy
from conformance.memo import Memo
from conformance.numerics import ACTIVATIONS, bf16_round


@dataclass(frozen=True)
class PlantedBug:
    """name: ``<family>.<what>``; doc: the bug in words; applies: the cells where it can show;
    plant: ``plant(impl) -> impl`` with the bug."""

    name: str
    family: str
    doc: str
    applies: Callable[[Cell], bool]
    plant: Callable[[Any], Any]


def assert_close(name: str, actual, expected, tol: Tolerance) -> Comparison:
    """``compare`` under a named tolerance; AssertionError with the comparator's reason when it fails."""
    result = compare(name, actual, expected, tol)
    if not result.passed:
        raise AssertionError(f"{result.reason} [{tol.source}]")
    return result


def verdict_of(impl, cell: Cell, rounding_model: str, memo: Memo | None = None,
               inputs: dict | None = None) -> Verdict:
    """Run ``cell`` through ``impl`` (on a copy of its inputs) and check it under ``rounding_model``."""
    family = families.get(cell.family)
    inputs = family.make_inputs(cell) if inputs is None else inputs
    return family.check(cell, rounding_model, inputs, family.run_with(impl, cell, inputs_copy(inputs)), memo)


def first_failing_cell(impl, family: str, rounding_model: str, cells: Iterable[Cell],
                       memo: Memo | None = None) -> Cell | None:
    """The first of ``cells`` (of ``family``) that ``impl`` fails under ``rounding_model``, or None."""
    memo = Memo() if memo is None else memo
    for cell in cells:
        if cell.family != family:
            raise ValueError(f"cells: {cell.id} is not a {family} cell")
        if verdict_of(impl, cell, rounding_model, memo).status == "fail":
            return cell
    return None


class _Wrapped:
    """``impl`` with some of its functions replaced (the rest pass through)."""

    def __init__(self, impl, **replaced):
        self._impl = impl
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(self._impl, name)


def _result(res, state):
    """(o, pool) of a GDN call in NumPy form (returns o, mutates the pool) or JAX form."""
    return res if isinstance(res, tuple) else (res, state)


def _fp16_as_bf16(x):
    """A float16 array silently converted to bf16; anything else unchanged."""
    if getattr(x, "dtype", None) == np.float16:
        return np.asarray(x).astype(ml_dtypes.bfloat16)
    return x


# ---------------------------------------------------------------------------------------- gdn

_VARLEN = ("recurrent", "chunked")
_POOL_OPS = ("recurrent", "chunked", "decode", "spec_decode")


def _wrap_pool_ops(impl, ops, around):
    """``impl`` with each of ``ops`` it has replaced by ``around(name, fn, pos, args, kw)``, where
    ``pos`` is the state pool's position in ``args`` (6 for recurrent and chunked, else 7)."""
    def wrap(name):
        fn = getattr(impl, name)
        pos = 6 if name in _VARLEN else 7
        return lambda *args, **kw: around(name, fn, pos, args, kw)
    return _Wrapped(impl, **{name: wrap(name) for name in ops if hasattr(impl, name)})


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
    return _Wrapped(impl, chunked=chunked)


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
    return _Wrapped(impl, gating=gating)


def _reads_fp16_as_bf16(impl):
    """Every op converts its float16 activations (not the state pool) to bf16 before computing."""
    def around(name, fn, pos, args, kw):
        return fn(*(x if i == pos else _fp16_as_bf16(x) for i, x in enumerate(args)), **kw)

    def gating(*args):
        return impl.gating(*map(_fp16_as_bf16, args))
    return _Wrapped(_wrap_pool_ops(impl, _POOL_OPS, around), gating=gating)


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
    return _Wrapped(impl, gating=gating)


def _act(*names):
    return lambda c: activation(c) in names


def _gdn(name, doc, ops, plant, extra=lambda c: True):
    return PlantedBug(f"gdn.{name}", "gdn", doc, lambda c: c.op in ops and extra(c), plant)


def _longer_than(n):
    return lambda c: c.op != "chunked" or max(c["lens"]) > n


_GDN = [
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
         ("gating",) + _POOL_OPS, _reads_fp16_as_bf16, _act("float16")),
    _gdn("qk-norm-in-input-dtype", "the q/k l2 norm sums squares in the activations' 16-bit dtype",
         _POOL_OPS, _qk_norm_in_input_dtype, _act("float16", "bfloat16")),
    _gdn("gating-in-input-dtype", "gating's softplus and sigmoid are computed in the activations' 16-bit dtype",
         ("gating",), _gating_in_input_dtype, _act("float16", "bfloat16")),
]


class Bf16OperandReference:
    """``reference.gdn.numpy_ref`` whose chunked op rounds its GEMM operands to bf16, as the C++
    chunk kernel does: the base implementation of the "bf16-operands" and "bf16-gemm" models."""

    def __getattr__(self, name):
        from reference.gdn import numpy_ref
        return getattr(numpy_ref, name)

    @staticmethod
    def chunked(*args, **kw):
        from reference.gdn import numpy_ref
        return numpy_ref.chunked(*args, **kw, operand_dtype="bfloat16")


class FlaChunkReference:
    """``reference.gdn.numpy_ref`` whose chunked op rounds to q's dtype (bf16 or fp16) where FLA's
    chunk kernels do (``rounding_points="fla"``): the base implementation of the "fla-chunk" model."""

    def __getattr__(self, name):
        from reference.gdn import numpy_ref
        return getattr(numpy_ref, name)

    @staticmethod
    def chunked(q, *args, **kw):
        from reference.gdn import numpy_ref
        return numpy_ref.chunked(q, *args, **kw, operand_dtype=np.asarray(q).dtype.name, rounding_points="fla")


class VllmCpuReference:
    """The "vllm-cpu" model's conventions in float64 (l2 norm epsilon 1e-5, the decode op's bf16
    beta, bf16 chunk operands): the base implementation of that model."""

    def __init__(self):
        from conformance.families.gdn.oracle import VLLM_L2NORM_EPS, Float64Oracle, vllm_decode_beta
        self._ops = Float64Oracle("float32", VLLM_L2NORM_EPS, vllm_decode_beta)
        self.chunked = Float64Oracle("bfloat16", VLLM_L2NORM_EPS).chunked

    def __getattr__(self, name):
        return getattr(self._ops, name)


# --------------------------------------------------------------------------------- turboquant

def _fields(cache, preset, layout, D, slot_mapping, field):
    """(flat byte indices [n, Hk, nbytes], preset) of ``field`` of every stored (slot, head)."""
    from reference.turboquant import layout as tq_layout
    from reference.turboquant.presets import preset as lookup

    p = lookup(preset)
    _, bs, Hk, _ = cache.shape
    slots = np.asarray(slot_mapping)[np.asarray(slot_mapping) >= 0]
    offs = tq_layout.field_offsets(p, D, Hk, bs, layout, slots[:, None], np.arange(Hk))
    return offs[field], p


def _after_store(impl, edit):
    def store(kv_cache, key, value, slot_mapping, preset, layout, rotation):
        res = impl.store(kv_cache, key, value, slot_mapping, preset, layout, rotation)
        cache = kv_cache if res is None else np.array(res, copy=True)
        edit(cache, key, slot_mapping, preset, layout)
        return None if res is None else cache
    return _Wrapped(impl, store=store)


def _swap_nibbles(cache, key, slot_mapping, preset, layout):
    from reference.turboquant import layout as tq_layout

    start, p = _fields(cache, preset, layout, key.shape[-1], slot_mapping, "key_data")
    idx = tq_layout.byte_indices(start, p.key_data_bytes(key.shape[-1]))
    flat = cache.reshape(-1)
    flat[idx] = ((flat[idx] & 0x0F) << 4) | (flat[idx] >> 4)


def _plain_norm(cache, key, slot_mapping, preset, layout):
    from reference.turboquant import layout as tq_layout

    start, _ = _fields(cache, preset, layout, key.shape[-1], slot_mapping, "k_norm")
    norms = np.linalg.norm(key[np.asarray(slot_mapping) >= 0].astype(np.float64), axis=-1).astype(np.float16)
    cache.reshape(-1)[tq_layout.byte_indices(start, 2)] = norms[..., None].view(np.uint8).reshape(start.shape + (2,))


def _decode_with(impl, change):
    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        return change(impl.decode, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks)
    return _Wrapped(impl, decode=decode)


def _wrong_head(decode, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks):
    Hq, Hk = query.shape[1], kv_cache.shape[2]
    G = Hq // Hk
    hq = np.arange(Hq)
    j = (hq % Hk) * G + hq // Hk         # the head that, correctly mapped, reads kv head hq % Hk
    q2 = np.empty_like(query)
    q2[:, j] = query[:, hq]
    s2 = None
    if sinks is not None:
        s2 = np.empty_like(sinks)
        s2[j] = sinks[hq]
    out = np.asarray(decode(q2, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=scale, sinks=s2))
    return out[:, j]


def _correction_twice(decode, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks):
    from reference.turboquant import numpy_ref

    cache = numpy_ref.convert_layout(kv_cache, layout, "aos", preset) if layout == "soa" else kv_cache
    return decode(query, cache, block_table, seq_lens, preset, "aos", rotation, scale=scale, sinks=sinks)


def _transposed_rotation(decode, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks):
    R = None if rotation is None else np.ascontiguousarray(np.asarray(rotation).T)
    return decode(query, kv_cache, block_table, seq_lens, preset, layout, R, scale=scale, sinks=sinks)


def _soa_as_aos(decode, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks):
    return decode(query, kv_cache, block_table, seq_lens, preset, "aos", rotation, scale=scale, sinks=sinks)


def _last_token_skipped(decode, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks):
    lens = np.maximum(np.asarray(seq_lens) - 1, 1).astype(np.int32)
    return decode(query, kv_cache, block_table, lens, preset, layout, rotation, scale=scale, sinks=sinks)


def _fp16_read_as_bf16(impl):
    """float16 query, key and value are converted to bfloat16 before the kernel sees them; an unquantized
    float32 cache (``reads_unquantized``) of a float16 decode is rounded to bfloat16 values."""
    def store(kv_cache, key, value, slot_mapping, preset, layout, rotation):
        return impl.store(kv_cache, _fp16_as_bf16(key), _fp16_as_bf16(value), slot_mapping, preset, layout, rotation)

    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        if np.asarray(query).dtype == np.float16 and np.asarray(kv_cache).dtype.kind == "f":
            kv_cache = bf16_round(kv_cache)
        return impl.decode(_fp16_as_bf16(query), kv_cache, block_table, seq_lens, preset, layout, rotation,
                           scale=scale, sinks=sinks)
    return _Wrapped(impl, store=store, decode=decode)


def _output_in_bf16(decode, query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks):
    out = decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=scale, sinks=sinks)
    return np.asarray(out, np.float32).astype(ACTIVATIONS["bfloat16"])


def _preset(c: Cell):
    from reference.turboquant.presets import preset as lookup
    return lookup(c["preset"])


def _tq(name, doc, applies, plant):
    return PlantedBug(f"turboquant.{name}", "turboquant", doc, applies, plant)


def _reads(c: Cell) -> bool:
    return c.op != "store"


_TURBOQUANT = [
    _tq("nibbles-swapped", "the two 4-bit key codes of each byte are stored in swapped nibbles",
        lambda c: c.op != "decode" and _preset(c).key_bits == 4,
        lambda impl: _after_store(impl, _swap_nibbles)),
    _tq("norm-not-corrected", "an SoA norm-corrected store writes the plain key norm, not the folded one",
        lambda c: c.op != "decode" and c["layout"] == "soa" and _preset(c).norm_correction,
        lambda impl: _after_store(impl, _plain_norm)),
    _tq("norm-correction-twice", "an SoA cache (correction folded into the norm) decoded by the AoS rule",
        lambda c: _reads(c) and c["layout"] == "soa" and _preset(c).norm_correction,
        lambda impl: _decode_with(impl, _correction_twice)),
    _tq("query-rotated-by-transpose", "the query is rotated by R^T instead of R",
        lambda c: _reads(c) and c["rotation"] == "random",
        lambda impl: _decode_with(impl, _transposed_rotation)),
    _tq("wrong-kv-head", "query head hq reads kv head hq % Hk instead of hq // G",
        lambda c: _reads(c) and c["G"] > 1 and c["Hk"] > 1,
        lambda impl: _decode_with(impl, _wrong_head)),
    _tq("soa-read-as-aos", "an SoA cache read with AoS byte offsets",
        lambda c: _reads(c) and c["layout"] == "soa",
        lambda impl: _decode_with(impl, _soa_as_aos)),
    _tq("last-token-skipped", "each sequence's last token is left out of the attention",
        _reads, lambda impl: _decode_with(impl, _last_token_skipped)),
    _tq("fp16-read-as-bf16", "float16 query, key and value are silently converted to bfloat16",
        lambda c: activation(c) == "float16", _fp16_read_as_bf16),
    _tq("output-in-bf16", "the decode output is returned in bfloat16 whatever the activation dtype",
        lambda c: _reads(c) and activation(c) != "bfloat16", lambda impl: _decode_with(impl, _output_in_bf16)),
]


class ActMmaReference:
    """``reference.turboquant.numpy_ref`` whose decode rounds q_rot, the dequantized K and V to the query's
    dtype (float64 attention over them; a float32 query rounds nothing): the base implementation of the
    "act-mma" model."""

    def __getattr__(self, name):
        from reference.turboquant import numpy_ref
        return getattr(numpy_ref, name)

    @staticmethod
    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        from conformance.families.turboquant.oracle import attention64
        from reference.turboquant import numpy_ref
        from reference.turboquant.presets import preset as lookup

        act = np.asarray(query).dtype

        def rounded(x):
            return np.asarray(x, np.float32).astype(act).astype(np.float64)

        keys, values = numpy_ref.dequantize(kv_cache, block_table, seq_lens, preset, layout, rotation, rotated=True)
        q = np.asarray(query, np.float32)
        q_rot = q if lookup(preset).key_fp8 else q @ np.asarray(rotation, np.float32)
        scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
        G = q.shape[1] // kv_cache.shape[2]
        out = attention64(rounded(q_rot), [rounded(k) for k in keys], [rounded(v) for v in values], G, scale,
                          None if sinks is None else np.asarray(sinks, np.float64))
        return out.astype(np.float32)


class ActSdpaReference:
    """``reference.turboquant.numpy_ref`` whose decode is float64 attention over the UNQUANTIZED
    cache (``reads_unquantized``: ``run_with`` passes it as ``kv_cache``, float32 ``[num_blocks,
    block_size, Hk, 2 D]``, K then V; preset, layout and rotation unused), as torch-sdpa computes:
    the base implementation of the "act-sdpa" model."""

    reads_unquantized = True

    def __getattr__(self, name):
        from reference.turboquant import numpy_ref
        return getattr(numpy_ref, name)

    @staticmethod
    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        from conformance.families.turboquant.oracle import attention64, unquantized

        q = np.asarray(query, np.float64)
        D = q.shape[-1]
        keys, values = unquantized({"key_cache": kv_cache[..., :D], "value_cache": kv_cache[..., D:],
                                    "block_table": np.asarray(block_table), "seq_lens": np.asarray(seq_lens)})
        scale = 1.0 / np.sqrt(D) if scale is None else scale
        out = attention64(q, keys, values, q.shape[1] // kv_cache.shape[2], scale,
                          None if sinks is None else np.asarray(sinks, np.float64))
        return out.astype(np.float32)


PLANTED: dict[str, PlantedBug] = {bug.name: bug for bug in _GDN + _TURBOQUANT}


def planted(family: str) -> list[PlantedBug]:
    """The planted bugs of ``family``, in definition order."""
    return [bug for bug in PLANTED.values() if bug.family == family]


def reference_impl(family: str, rounding_model: str):
    """The NumPy reference implementation a backend of ``rounding_model`` computes like (the base
    the planted bugs are planted into in the family tests)."""
    if family == "gdn":
        from reference.gdn import numpy_ref
        if rounding_model == "vllm-cpu":
            return VllmCpuReference()
        if rounding_model == "fla-chunk":
            return FlaChunkReference()
        return numpy_ref if rounding_model == "exact" else Bf16OperandReference()
    if family == "turboquant":
        from reference.turboquant import numpy_ref
        if rounding_model == "act-mma":
            return ActMmaReference()
        if rounding_model == "act-sdpa":
            return ActSdpaReference()
        if rounding_model == "exact":
            return numpy_ref
    raise ValueError(f"no reference implementation of {family} for the {rounding_model!r} model")
