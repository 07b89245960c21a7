"""TurboQuant KV-cache reference in JAX: the same functions and arguments as ``numpy_ref``,
written independently in ``jax.numpy`` (quantizers, packing, fp16/fp8 byte casts, gathers,
attention, split-KV); shared with ``numpy_ref`` are only the data that define the format: the
preset table, the byte offsets (``layout``), the Lloyd-Max centroids and the rotation matrices
(the rotation is an input of the op, so both references must see the same R).

Rounding model and rotation convention: as ``numpy_ref`` (float32 throughout, R applied to row
vectors, ``q_rot = q @ R``). Functional: ``store`` returns the new cache (a ``jax.Array``), the
argument is not modified. Host-side (NumPy) are only the checks and the integer byte offsets.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from reference.turboquant import layout as _layout
from reference.turboquant import validate
from reference.turboquant.lloyd_max import centroids as _centroids_np
from reference.turboquant.presets import PRESETS, Preset, check_head_size, preset
from reference.turboquant.rotation import DEFAULT_SEED, is_power_of_two
from reference.turboquant.rotation import hadamard as _hadamard_np
from reference.turboquant.rotation import random_rotation as _random_rotation_np

__all__ = ["preset", "PRESETS", "hadamard", "random_rotation", "default_rotation", "centroids", "store", "dequantize",
           "decode", "decode_partials", "reduce_partials", "convert_layout"]

F32 = jnp.float32


def hadamard(D: int) -> jax.Array:
    """Normalised Sylvester Hadamard, built here by Kronecker products (checked against NumPy's)."""
    _hadamard_np(D)  # the argument checks
    h = jnp.ones((1, 1), F32)
    base = jnp.array([[1.0, 1.0], [1.0, -1.0]], F32)
    while h.shape[0] < D:
        h = jnp.kron(base, h)
    return h / jnp.sqrt(F32(D))


def random_rotation(D: int, seed: int) -> jax.Array:
    """The same R as ``numpy_ref.random_rotation`` (R is data: both references must share it)."""
    return jnp.asarray(_random_rotation_np(D, seed))


def default_rotation(D: int, seed: int = DEFAULT_SEED) -> jax.Array:
    """As ``numpy_ref.default_rotation``: the Hadamard built here for a power-of-two D, else the shared
    seeded random rotation (the choice for other head sizes: ``reference.turboquant.rotation``)."""
    return hadamard(D) if is_power_of_two(check_head_size(D)) else random_rotation(D, seed)


def centroids(bits: int, D: int) -> jax.Array:
    """The shared Lloyd-Max solution (``reference.turboquant.lloyd_max``) as a jax array."""
    return jnp.asarray(_centroids_np(bits, D))


# ---- packing and byte casts ----------------------------------------------------------------

def pack_codes(codes: jax.Array, bits: int) -> jax.Array:
    """codes uint8 [..., D] -> packed bytes [..., D * bits / 8] (4-bit: even element in the low nibble)."""
    codes = codes.astype(jnp.uint32)
    if bits == 8:
        return codes.astype(jnp.uint8)
    if bits == 4:
        return (codes[..., 0::2] + codes[..., 1::2] * 16).astype(jnp.uint8)
    g = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8)
    word = jnp.sum(g * (jnp.uint32(8) ** jnp.arange(8, dtype=jnp.uint32)), axis=-1, dtype=jnp.uint32)
    b = jnp.stack([word % 256, (word // 256) % 256, word // 65536], axis=-1)
    return b.reshape(*codes.shape[:-1], codes.shape[-1] * 3 // 8).astype(jnp.uint8)


def _unpack(data: jax.Array, bits: int, D: int) -> jax.Array:
    data = data.astype(jnp.uint32)
    if bits == 8:
        return data
    if bits == 4:
        return jnp.stack([data % 16, data // 16], axis=-1).reshape(*data.shape[:-1], D)
    b = data.reshape(*data.shape[:-1], D // 8, 3)
    word = b[..., 0] + b[..., 1] * 256 + b[..., 2] * 65536
    codes = (word[..., None] // (jnp.uint32(8) ** jnp.arange(8, dtype=jnp.uint32))) % 8
    return codes.reshape(*data.shape[:-1], D)


def _f16_to_bytes(x: jax.Array) -> jax.Array:
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float16), jnp.uint16).astype(jnp.uint32)
    return jnp.stack([bits % 256, bits // 256], axis=-1).astype(jnp.uint8)


def _bytes_to_f16(b: jax.Array) -> jax.Array:
    word = (b[..., 0].astype(jnp.uint32) + b[..., 1].astype(jnp.uint32) * 256).astype(jnp.uint16)
    return jax.lax.bitcast_convert_type(word, jnp.float16)


# ---- quantizers ----------------------------------------------------------------------------

def _quantize_keys(k: jax.Array, p: Preset, layout: str, R) -> tuple[jax.Array, jax.Array | None]:
    if p.key_fp8:
        f8 = jnp.clip(k, -448.0, 448.0).astype(jnp.float8_e4m3fn)
        return jax.lax.bitcast_convert_type(f8, jnp.uint8), None
    c = centroids(p.key_bits, k.shape[-1])
    bounds = (c[:-1] + c[1:]) / F32(2)
    norm = jnp.sqrt(jnp.sum(k * k, axis=-1))
    y = jnp.matmul(k / (norm[..., None] + F32(1e-8)), jnp.asarray(R, F32), precision="highest")
    idx = jnp.sum(y[..., None] >= bounds, axis=-1)  # count of boundaries at or below y: ties go up
    scalar = norm
    if p.norm_correction and layout == "soa":
        scalar = norm / jnp.sqrt(jnp.sum(c[idx] ** 2, axis=-1) + F32(1e-16))
    return idx.astype(jnp.uint8), scalar.astype(jnp.float16)


def _quantize_values(v: jax.Array, bits: int):
    top = F32(2**bits - 1)
    lo = jnp.clip(jnp.min(v, axis=-1), -65504.0, 65504.0)
    hi = jnp.clip(jnp.max(v, axis=-1), -65504.0, 65504.0)
    scale = (hi - lo) / top
    scale = jnp.where(scale > F32(1e-8), scale, F32(1e-8))
    codes = jnp.clip(jnp.floor((v - lo[..., None]) / scale[..., None] + F32(0.5)), 0, top)
    return codes.astype(jnp.uint8), scale.astype(jnp.float16), lo.astype(jnp.float16)


def _field_index(p: Preset, layout: str, D: int, Hk: int, block_size: int, slots: np.ndarray) -> dict:
    """Host side: int32 flat byte indices ``[*slots.shape, Hk, nbytes]`` of every field."""
    offs = _layout.field_offsets(p, D, Hk, block_size, layout, slots[..., None], np.arange(Hk))
    sizes = _layout.field_sizes(p, D)
    return {name: jnp.asarray(_layout.byte_indices(offs[name], sizes[name]), jnp.int32) for name in sizes}


def _read(flat: jax.Array, index: dict, p: Preset, layout: str, D: int):
    """Dequantized (rotated-space keys, values) float32 ``[..., Hk, D]`` at the gathered bytes."""
    raw = {name: flat[i] for name, i in index.items()}
    kcodes = _unpack(raw["key_data"], p.key_bits, D)
    if p.key_fp8:
        keys = jax.lax.bitcast_convert_type(kcodes.astype(jnp.uint8), jnp.float8_e4m3fn).astype(F32)
    else:
        c = centroids(p.key_bits, D)[kcodes]
        if p.norm_correction and layout == "aos":
            c = c / jnp.sqrt(jnp.sum(c * c, axis=-1, keepdims=True) + F32(1e-16))
        keys = _bytes_to_f16(raw["k_norm"]).astype(F32)[..., None] * c
    values = (_unpack(raw["value_data"], p.value_bits, D).astype(F32)
              * _bytes_to_f16(raw["v_scale"]).astype(F32)[..., None]
              + _bytes_to_f16(raw["v_zero"]).astype(F32)[..., None])
    return keys, values


@functools.partial(jax.jit, static_argnames=("p", "layout", "D", "G", "num_kv_splits"))
def _partials(flat, index, q, lens, R, scale, *, p, layout, D, G, num_kv_splits):
    """Padded split-KV attention: tokens ``t < lens[b]`` of split ``t // ceil(lens[b] / S)``."""
    k, v = _read(flat, index, p, layout, D)  # [B, Lp, Hk, D]
    B, Lp, Hk, _ = k.shape
    if not p.key_fp8:
        q = jnp.matmul(q, R, precision="highest")
    qg = q.reshape(B, Hk, G, D)  # query head h*G + g reads kv head h
    x = scale * jnp.einsum("bhgd,bthd->bhgt", qg, k, precision="highest")
    t = jnp.arange(Lp)
    width = (lens + num_kv_splits - 1) // num_kv_splits
    split = t[None, :] // width[:, None]  # [B, Lp]
    valid = (t[None, :] < lens[:, None])[:, None, :] & (split[:, None, :] == jnp.arange(num_kv_splits)[None, :, None])
    valid = valid[:, None, None]  # [B, 1, 1, S, Lp]
    xs = jnp.where(valid, x[:, :, :, None, :], -jnp.inf)
    m = jnp.max(xs, axis=-1)
    m_safe = jnp.where(jnp.isfinite(m), m, F32(0))
    e = jnp.where(valid, jnp.exp(xs - m_safe[..., None]), F32(0))
    l = jnp.sum(e, axis=-1)
    acc = jnp.einsum("bhgst,bthd->bhgsd", e, v, precision="highest")
    out = acc / jnp.where(l > 0, l, F32(1))[..., None]
    lse = jnp.where(l > 0, m_safe + jnp.log(jnp.where(l > 0, l, F32(1))), -jnp.inf)
    return out.reshape(B, Hk * G, num_kv_splits, D), lse.reshape(B, Hk * G, num_kv_splits)


@functools.partial(jax.jit, static_argnames=("p", "layout"))
def _store_core(flat, key, value, R, index, *, p, layout):
    kcodes, kscalar = _quantize_keys(key, p, layout, R)
    vcodes, vscale, vzero = _quantize_values(value, p.value_bits)
    raw = {"key_data": pack_codes(kcodes, p.key_bits), "value_data": pack_codes(vcodes, p.value_bits),
           "v_scale": _f16_to_bytes(vscale), "v_zero": _f16_to_bytes(vzero)}
    if kscalar is not None:
        raw["k_norm"] = _f16_to_bytes(kscalar)
    for name, data in raw.items():
        flat = flat.at[index[name]].set(data)
    return flat


def _padded_len(n: int) -> int:
    """Token counts are padded to a power of two (at least 16) so cells share compiled programs."""
    return max(16, 1 << (int(n) - 1).bit_length())


# ---- the ops -------------------------------------------------------------------------------

def store(kv_cache, key, value, slot_mapping, preset, layout, rotation):
    """Functional store: the cache with ``key``/``value`` ``[N, Hk, D]`` quantized into
    ``slot_mapping [N]`` (negative = skip). Returns a new uint8 jax array; see ``numpy_ref.store``."""
    p, layout, D, slots, keep = validate.store_args(kv_cache, key, value, slot_mapping, preset, layout, rotation)
    _, block_size, Hk, _ = np.shape(kv_cache)
    index = _field_index(p, layout, D, Hk, block_size, slots)
    R = jnp.asarray(np.eye(D) if p.key_fp8 else rotation, F32)
    flat = _store_core(jnp.asarray(kv_cache).reshape(-1), jnp.asarray(np.asarray(key)[keep], F32),
                       jnp.asarray(np.asarray(value)[keep], F32), R, index, p=p, layout=layout)
    return flat.reshape(np.shape(kv_cache))


def dequantize(kv_cache, block_table, seq_lens, preset, layout, rotation, *, rotated=False):
    """Per sequence float32 ``[L_b, Hk, D]`` keys (original space, or rotated when ``rotated``)
    and values; see ``numpy_ref.dequantize``."""
    p, layout, D, (num_blocks, block_size, Hk) = validate.cache_args(kv_cache, preset, layout)
    validate.rotation_for(p, rotation, D)
    bt, lens = validate.tables(block_table, seq_lens, num_blocks, block_size)
    flat = jnp.asarray(kv_cache).reshape(-1)
    keys, values = [], []
    for b, L in enumerate(lens):
        k, v = _read(flat, _field_index(p, layout, D, Hk, block_size, validate.token_slots(bt, b, L, block_size)),
                     p, layout, D)
        if not rotated and not p.key_fp8:
            k = jnp.matmul(k, jnp.asarray(rotation, F32).T, precision="highest")
        keys.append(k)
        values.append(v)
    return keys, values


def decode_partials(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None,
                    num_kv_splits: int = 1):
    """Split-KV stage 1, as ``numpy_ref.decode_partials``: ``(out [B, Hq, S, D], lse [B, Hq, S])``."""
    p, layout, (B, Hq, Hk, D, block_size), bt, lens, scale = validate.decode_args(
        query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, None, num_kv_splits)
    Lp = _padded_len(lens.max())
    t = np.minimum(np.arange(Lp)[None, :], lens[:, None] - 1)  # padding re-reads the last token
    slots = np.take_along_axis(bt, t // block_size, axis=1) * block_size + t % block_size
    R = jnp.asarray(np.eye(D) if p.key_fp8 else rotation, F32)
    return _partials(jnp.asarray(kv_cache).reshape(-1), _field_index(p, layout, D, Hk, block_size, slots),
                     jnp.asarray(query, F32), jnp.asarray(lens, jnp.int32), R, F32(scale),
                     p=p, layout=layout, D=D, G=Hq // Hk, num_kv_splits=int(num_kv_splits))


def reduce_partials(out, lse, sinks=None):
    """Split-KV stage 2 (log-sum-exp merge, sink once in the denominator): float32 ``[B, Hq, D]``."""
    out, lse = jnp.asarray(out, F32), jnp.asarray(lse, F32)
    m = jnp.max(lse, axis=2)
    if sinks is not None:
        m = jnp.maximum(m, jnp.asarray(sinks, F32)[None, :])
    w = jnp.exp(lse - m[..., None])
    denom = jnp.sum(w, axis=2)
    if sinks is not None:
        denom = denom + jnp.exp(jnp.asarray(sinks, F32)[None, :] - m)
    return jnp.einsum("bhs,bhsd->bhd", w, out, precision="highest") / denom[..., None]


def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None,
           num_kv_splits: int = 1):
    """Decode attention over the dequantized cache, float32 ``[B, Hq, D]``; see ``numpy_ref.decode``."""
    validate.decode_args(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks,
                         num_kv_splits)
    out, lse = decode_partials(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, num_kv_splits)
    return reduce_partials(out, lse, sinks)


def convert_layout(kv_cache, src, dst, preset):
    """The cache re-laid from ``src`` to ``dst`` (a byte permutation); see ``numpy_ref.convert_layout``."""
    src, dst = _layout.check_layout(src), _layout.check_layout(dst)
    p, _, D, (num_blocks, block_size, Hk) = validate.cache_args(kv_cache, preset, src)
    slots, heads = np.arange(num_blocks * block_size)[:, None], np.arange(Hk)
    a = _layout.field_offsets(p, D, Hk, block_size, src, slots, heads)
    b = _layout.field_offsets(p, D, Hk, block_size, dst, slots, heads)
    flat = jnp.asarray(kv_cache).reshape(-1)
    out = jnp.zeros_like(flat)
    for name, n in _layout.field_sizes(p, D).items():
        out = out.at[_layout.byte_indices(b[name], n).reshape(-1)].set(flat[_layout.byte_indices(a[name], n).reshape(-1)])
    return out.reshape(np.shape(kv_cache))
