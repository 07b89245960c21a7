"""The TurboQuant family's planted bugs (``PLANTED``): each turns an implementation with the
reference's function names (``reference.turboquant.numpy_ref``, a kernel wrapper) into the same one
with one classic kernel bug; ``tolerances.SPECS`` names the bugs each tolerance is shown to catch."""
from __future__ import annotations

import numpy as np

from conformance.cells import Cell, activation
from conformance.numerics import ACTIVATIONS, bf16_round
from conformance.planting import PlantedBug, Wrapped, fp16_as_bf16


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
    return Wrapped(impl, store=store)


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
    return Wrapped(impl, decode=decode)


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
        return impl.store(kv_cache, fp16_as_bf16(key), fp16_as_bf16(value), slot_mapping, preset, layout, rotation)

    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        if np.asarray(query).dtype == np.float16 and np.asarray(kv_cache).dtype.kind == "f":
            kv_cache = bf16_round(kv_cache)
        return impl.decode(fp16_as_bf16(query), kv_cache, block_table, seq_lens, preset, layout, rotation,
                           scale=scale, sinks=sinks)
    return Wrapped(impl, store=store, decode=decode)


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


PLANTED = (
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
)
