"""TurboQuant KV-cache reference in NumPy: store, dequantize, decode, layout conversion.

Rounding model, every step float32 unless said:
- MSE keys: ``norm = sqrt(sum k^2)``; ``x_hat = k / (norm + 1e-8)``; ``y = x_hat @ R``;
  ``idx = searchsorted(midpoints, y, side="right")`` (ties go up); stored scalar ``fp16(norm)``,
  except SoA with norm correction, which pre-folds it: ``fp16(norm / sqrt(sum c[idx]^2 + 1e-16))``.
  Dequantized (rotated space): SoA ``f32(scalar) * c[idx]``; AoS ``f32(scalar) * c_hat`` with
  ``c_hat = c[idx] / sqrt(sum c[idx]^2 + 1e-16)`` under norm correction, else ``c[idx]``.
- FP8 keys (k8v4): ``fp8_e4m3fn(clip(k, -448, 448))`` (round to nearest even, saturating), no norm,
  no rotation.
- Values: ``vmin, vmax`` clamped to the fp16 range, ``scale = max((vmax - vmin) / (2^b - 1), 1e-8)``
  (else 1e-8), ``code = clip(floor((v - vmin) / scale + 0.5), 0, 2^b - 1)``; stored ``fp16(scale)``,
  ``fp16(vmin)``; dequantized ``code * f32(scale16) + f32(zero16)``.
- Decode: ``q_rot = f32(q) @ R`` (MSE keys; FP8: ``q``); kv head of query head ``hq`` is ``hq // G``;
  ``x_t = scale * <q_rot, k_t>``; softmax over the sequence with an optional per-query-head sink
  logit (raw, not scaled) added once to the denominator; fp32 output ``[B, Hq, D]``.

Rotation convention: see ``reference.turboquant.rotation`` (R is applied to row vectors, R = PiT); a
head size that is not a power of two takes the seeded random rotation there (``default_rotation``), and
every size is D-wide in the cache (no padding).
Packing: 4-bit, element 2k in the low nibble of byte k; 3-bit, groups of 8 codes as 24-bit
little-endian integers (code i at bits 3i); fp16 little-endian. Byte offsets: ``layout``.
NumPy mutates the cache in place (``store`` also returns it).
"""
from __future__ import annotations

import numpy as np

from reference.arguments import in_place
from reference.turboquant import layout as _layout, presets as _presets, validate
from reference.turboquant.lloyd_max import centroids, midpoints
from reference.turboquant.presets import PRESETS, Preset, preset
from reference.turboquant.quantizers import dequantize_fields, quantize_keys, quantize_values
from reference.turboquant.rotation import default_rotation, hadamard, random_rotation

__all__ = ["preset", "PRESETS", "hadamard", "random_rotation", "default_rotation", "centroids", "midpoints", "store",
           "dequantize", "decode", "decode_partials", "reduce_partials", "convert_layout", "read_fields",
           "pack_codes", "unpack_codes", "rotate_query"]

F32 = np.float32


# ---- packing -------------------------------------------------------------------------------

def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes ``[..., D]`` -> packed bytes ``[..., D * bits / 8]`` (bits 3, 4 or 8)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if bits == 8:
        return codes.copy()
    if bits == 4:
        return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    if bits == 3:
        groups = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8).astype(np.uint32)
        word = np.sum(groups << (3 * np.arange(8, dtype=np.uint32)), axis=-1, dtype=np.uint32)
        out = np.stack([(word >> (8 * i)) & 0xFF for i in range(3)], axis=-1).astype(np.uint8)
        return out.reshape(*codes.shape[:-1], codes.shape[-1] * 3 // 8)
    raise ValueError(f"bits must be 3, 4 or 8, got {bits}")


def unpack_codes(data: np.ndarray, bits: int, D: int) -> np.ndarray:
    """Packed bytes ``[..., D * bits / 8]`` -> uint8 codes ``[..., D]``."""
    data = np.asarray(data, dtype=np.uint8)
    if bits == 8:
        return data.copy()
    if bits == 4:
        out = np.empty((*data.shape[:-1], D), dtype=np.uint8)
        out[..., 0::2] = data & 0x0F
        out[..., 1::2] = data >> 4
        return out
    if bits == 3:
        b = data.reshape(*data.shape[:-1], data.shape[-1] // 3, 3).astype(np.uint32)
        word = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16)
        codes = (word[..., None] >> (3 * np.arange(8, dtype=np.uint32))) & 7
        return codes.reshape(*data.shape[:-1], D).astype(np.uint8)
    raise ValueError(f"bits must be 3, 4 or 8, got {bits}")


def _fp16_bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(x, dtype="<f2")).view(np.uint8).reshape(*np.shape(x), 2)


def _fp16_from_bytes(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.uint8).view("<f2")[..., 0]


# ---- cache read / write --------------------------------------------------------------------

def read_fields(kv_cache: np.ndarray, slots, p: Preset, layout: str, D: int) -> dict[str, np.ndarray]:
    """Every field of every kv head at flat ``slots [n]``: key_codes/value_codes uint8 ``[n, Hk, D]``
    and the fp16 scalars ``[n, Hk]`` (k_norm absent for FP8 keys)."""
    _, block_size, Hk, _ = kv_cache.shape
    flat = np.asarray(kv_cache).reshape(-1)
    offs = _layout.field_offsets(p, D, Hk, block_size, layout, np.asarray(slots)[:, None], np.arange(Hk))
    sizes = _layout.field_sizes(p, D)
    raw = {name: flat[_layout.byte_indices(offs[name], sizes[name])] for name in sizes}
    out = {"key_codes": unpack_codes(raw["key_data"], p.key_bits, D),
           "value_codes": unpack_codes(raw["value_data"], p.value_bits, D)}
    out.update({name: _fp16_from_bytes(raw[name]) for name in ("k_norm", "v_scale", "v_zero") if name in raw})
    return out


def store(kv_cache, key, value, slot_mapping, preset, layout, rotation):
    """Quantize ``key``/``value`` ``[N, Hk, D]`` and write them at ``slot_mapping [N]`` (flat slot
    ``block * block_size + offset``; negative = skip) into ``kv_cache`` uint8
    ``[num_blocks, block_size, Hk, slot_size]``, in place. ``rotation``: R ``[D, D]`` (ignored for
    FP8 keys). Returns ``kv_cache``."""
    if not isinstance(kv_cache, np.ndarray) or not kv_cache.flags.c_contiguous:
        raise TypeError("kv_cache must be a C-contiguous NumPy array (the NumPy reference writes in place)")
    in_place("kv_cache", kv_cache, "the NumPy reference writes the cache in place")
    p, layout, D, slots, keep = validate.store_args(kv_cache, key, value, slot_mapping, preset, layout, rotation)
    _, block_size, Hk, _ = kv_cache.shape
    key, value = np.asarray(key)[keep], np.asarray(value)[keep]
    kcodes, kscalar = quantize_keys(key, p, layout, rotation)
    vcodes, vscale, vzero = quantize_values(value, p.value_bits)
    raw = {"key_data": pack_codes(kcodes, p.key_bits), "value_data": pack_codes(vcodes, p.value_bits),
           "v_scale": _fp16_bytes(vscale), "v_zero": _fp16_bytes(vzero)}
    if kscalar is not None:
        raw["k_norm"] = _fp16_bytes(kscalar)
    offs = _layout.field_offsets(p, D, Hk, block_size, layout, slots[:, None], np.arange(Hk))
    flat = kv_cache.reshape(-1)
    for name, data in raw.items():
        flat[_layout.byte_indices(offs[name], data.shape[-1])] = data
    return kv_cache


def dequantize(kv_cache, block_table, seq_lens, preset, layout, rotation, *, rotated=False, key_table=None):
    """Dequantized ``(keys, values)``: one float32 ``[L_b, Hk, D]`` array each per sequence.
    Keys are in the original space (``k_rot @ R.T``), or in the stored rotated space when
    ``rotated=True`` (exactly ``scalar * centroid``); FP8 keys are never rotated. ``key_table``: the
    float32 ``[2^key_bits]`` centroid table the codes index (None: the preset's ``centroids``)."""
    kv_cache = np.asarray(kv_cache)
    p, layout, D, (num_blocks, block_size, _) = validate.cache_args(kv_cache, preset, layout)
    validate.rotation_for(p, rotation, D)
    bt, lens = validate.tables(block_table, seq_lens, num_blocks, block_size)
    keys, values = [], []
    for b, L in enumerate(lens):
        fields = read_fields(kv_cache, validate.token_slots(bt, b, L, block_size), p, layout, D)
        k, v = dequantize_fields(fields, p, layout, key_table)
        if not rotated and not p.key_fp8:
            k = k @ np.asarray(rotation, dtype=F32).T
        keys.append(k)
        values.append(v)
    return keys, values


def rotate_query(query, preset, rotation, dtype=F32) -> np.ndarray:
    """The query in the space of the stored keys, computed in ``dtype``: ``q_rot = q @ R`` (FP8-key
    presets: ``q`` itself, unrotated). query ``[..., D]``, rotation ``[D, D]``."""
    q = np.asarray(query, dtype)
    return q if _presets.preset(preset).key_fp8 else q @ np.asarray(rotation, dtype)


def decode_partials(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None,
                    num_kv_splits: int = 1):
    """Split-KV stage 1: split s of sequence b covers tokens ``[s*S_b, min((s+1)*S_b, L_b))`` with
    ``S_b = ceil(L_b / num_kv_splits)``. Returns ``(out [B, Hq, S, D], lse [B, Hq, S])`` float32:
    each split's softmax-normalised output and its log-sum-exp (empty split: out 0, lse -inf)."""
    kv_cache = np.asarray(kv_cache)
    p, layout, (B, Hq, Hk, D, block_size), bt, lens, scale = validate.decode_args(
        query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, None, num_kv_splits)
    scale = F32(scale)
    G = Hq // Hk
    q = rotate_query(query, p, rotation)
    out = np.zeros((B, Hq, num_kv_splits, D), dtype=F32)
    lse = np.full((B, Hq, num_kv_splits), -np.inf, dtype=F32)
    for b, L in enumerate(lens):
        fields = read_fields(kv_cache, validate.token_slots(bt, b, L, block_size), p, layout, D)
        k, v = dequantize_fields(fields, p, layout)
        k_q = np.repeat(k, G, axis=1)  # [L, Hq, D]: query head hq reads kv head hq // G
        v_q = np.repeat(v, G, axis=1)
        x = scale * np.einsum("hd,thd->ht", q[b], k_q, dtype=F32)  # [Hq, L]
        width = -(-L // num_kv_splits)
        for s in range(num_kv_splits):
            lo, hi = s * width, min((s + 1) * width, L)
            if lo >= hi:
                continue
            m = x[:, lo:hi].max(axis=1)
            e = np.exp(x[:, lo:hi] - m[:, None])
            l = e.sum(axis=1, dtype=F32)
            out[b, :, s] = np.einsum("ht,thd->hd", e, v_q[lo:hi], dtype=F32) / l[:, None]
            lse[b, :, s] = m + np.log(l)
    return out, lse


def reduce_partials(out, lse, sinks=None):
    """Split-KV stage 2: merge ``out [B, Hq, S, D]`` and ``lse [B, Hq, S]`` by the log-sum-exp
    rule; an optional sink logit ``[Hq]`` joins the denominator once. float32 ``[B, Hq, D]``."""
    out, lse = np.asarray(out, dtype=F32), np.asarray(lse, dtype=F32)
    m = lse.max(axis=2)
    if sinks is not None:
        m = np.maximum(m, np.asarray(sinks, dtype=F32)[None, :])
    w = np.exp(lse - m[..., None])  # empty splits: exp(-inf) = 0
    denom = w.sum(axis=2, dtype=F32)
    if sinks is not None:
        denom = denom + np.exp(np.asarray(sinks, dtype=F32)[None, :] - m)
    return (np.einsum("bhs,bhsd->bhd", w, out, dtype=F32) / denom[..., None]).astype(F32)


def decode(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale=None, sinks=None,
           num_kv_splits: int = 1):
    """Decode attention of ``query [B, Hq, D]`` over the dequantized cache; float32 ``[B, Hq, D]``.
    ``block_table [B, M]`` (int, extra columns ignored), ``seq_lens [B]`` (>= 1), ``scale``
    (default 1/sqrt(D)), ``sinks`` None or float ``[Hq]`` raw logits; ``num_kv_splits`` > 1 runs
    the split-KV form (``decode_partials`` + ``reduce_partials``), equal to the unsplit one."""
    validate.decode_args(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, sinks,
                         num_kv_splits)
    out, lse = decode_partials(query, kv_cache, block_table, seq_lens, preset, layout, rotation, scale, num_kv_splits)
    return reduce_partials(out, lse, sinks)


def convert_layout(kv_cache, src, dst, preset):
    """A new cache with every field of ``kv_cache`` moved from layout ``src`` to ``dst``: a byte
    permutation, so AoS -> SoA -> AoS is byte-identical. ``preset`` is needed because the slot
    size alone does not determine D (e.g. 118 bytes is k3v4_nc at D=128 and 4bit_nc at D=112)."""
    src, dst = _layout.check_layout(src), _layout.check_layout(dst)
    kv_cache = np.asarray(kv_cache)
    p, _, D, (num_blocks, block_size, Hk) = validate.cache_args(kv_cache, preset, src)
    slots = np.arange(num_blocks * block_size)[:, None]
    heads = np.arange(Hk)
    a = _layout.field_offsets(p, D, Hk, block_size, src, slots, heads)
    b = _layout.field_offsets(p, D, Hk, block_size, dst, slots, heads)
    flat_in, out = kv_cache.reshape(-1), np.empty_like(kv_cache)
    flat_out = out.reshape(-1)
    for name, n in _layout.field_sizes(p, D).items():
        flat_out[_layout.byte_indices(b[name], n)] = flat_in[_layout.byte_indices(a[name], n)]
    return out
