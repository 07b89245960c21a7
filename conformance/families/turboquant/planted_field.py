"""TurboQuant planted bugs of kinds shipped in serving kernels, one for each class of cell that exposes
it (``PLANTED``, joined to ``planted.PLANTED`` in the family's ``__init__``): a softmax without its max
subtracted, slot arithmetic held in 16 bits."""
from __future__ import annotations

import numpy as np

from conformance.planting import PlantedBug, Wrapped

EXP_MAX = float(np.log(np.finfo(np.float32).max))     # 88.72: exp overflows float32 past it


def _logits(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale):
    """[B, Hq] float32: each query head's largest logit scale * q . k over its sequence (the dequantized
    cache, or an unquantized float cache [num_blocks, block_size, Hk, 2 D] holding K then V)."""
    from reference.turboquant import numpy_ref

    q = np.asarray(query, np.float32)
    B, Hq, D = q.shape
    scale = np.float32(1.0 / np.sqrt(D) if scale is None else scale)
    cache = np.asarray(kv_cache)
    if cache.dtype.kind == "f":
        bs = cache.shape[1]
        keys = [cache[block_table[b, np.arange(L) // bs], np.arange(L) % bs, :, :D] for b, L in enumerate(seq_lens)]
    else:
        keys, _ = numpy_ref.dequantize(cache, block_table, seq_lens, preset, layout, rotation)
    G = Hq // keys[0].shape[1]
    return np.stack([np.max(scale * np.einsum("hd,thd->ht", q[b], np.repeat(k, G, axis=1).astype(np.float32)),
                            axis=1) for b, k in enumerate(keys)])


def _softmax_unshifted(impl):
    """decode's softmax takes exp(x) without subtracting the largest logit: equal to the shifted softmax
    while every exp(x) fits float32, inf / inf = NaN for a head whose largest logit (or sink) passes 88.72."""
    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        out = np.array(impl.decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=scale,
                                   sinks=sinks), np.float32)
        top = _logits(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale)
        if sinks is not None:
            top = np.maximum(top, np.asarray(sinks, np.float32)[None, :])
        out[top > EXP_MAX] = np.nan
        return out
    return Wrapped(impl, decode=decode)


def _slot_16bit(impl):
    """Cache slots computed in 16 bits: store writes slot s at s mod 65536; decode reads token t of a
    sequence at (block * block_size + t % block_size) mod 65536."""
    def store(kv_cache, key, value, slot_mapping, preset, layout, rotation):
        slots = np.asarray(slot_mapping)
        wrapped = np.where(slots >= 0, slots & 0xFFFF, slots).astype(slots.dtype)
        return impl.store(kv_cache, key, value, wrapped, preset, layout, rotation)

    def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None):
        table = np.asarray(block_table)
        bs = np.asarray(kv_cache).shape[1]
        wrapped = ((table.astype(np.int64) * bs) & 0xFFFF) // bs       # block sizes divide 2^16
        return impl.decode(query, kv_cache, wrapped.astype(table.dtype), seq_lens, preset, layout, rotation,
                           scale=scale, sinks=sinks)
    return Wrapped(impl, store=store, decode=decode)


def _tq(name, doc, applies, plant):
    return PlantedBug(f"turboquant.{name}", "turboquant", doc, applies, plant)


PLANTED = (
    _tq("softmax-unshifted", "decode's softmax takes exp of the logits without subtracting their maximum",
        lambda c: c.op != "store", _softmax_unshifted),
    _tq("slot-16bit", "cache slots (block * block_size + offset) computed in 16 bits: slot s used as s mod 65536",
        lambda c: True, _slot_16bit),
)
