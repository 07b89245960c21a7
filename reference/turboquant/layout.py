"""Byte offsets of the two TurboQuant cache layouts, AoS (per-slot records) and SoA (per block: data, then metadata).

The cache is one uint8 array, logical shape ``[num_blocks, block_size, Hk, slot_size]``; offsets
here are into its flat bytes. A (token, kv head) is addressed by its flat slot
``slot = physical_block * block_size + position`` and its head ``h``.

- ``aos``: one record per (slot, h) at ``(slot * Hk + h) * slot_size``:
  ``[key codes | fp16 k_norm (MSE keys only) | value codes | fp16 v_scale | fp16 v_zero]``.
- ``soa``: per block (``block_bytes = BS * Hk * slot_size``) a data region of
  ``BS * Hk * (key_data + value_data)`` bytes, record (s, h) at ``(s * Hk + h) * data_bytes``
  holding ``[key codes | value codes]``, then a metadata region of fp16 strips
  ``[Hk][num_fields][BS]``: fields k_norm, v_scale, v_zero (FP8 keys: v_scale, v_zero).

Every fp16 is little-endian; every offset is even. Numpy only (shared by both references and the
kernels' tests); the functions accept NumPy integer arrays and broadcast them.
"""
from __future__ import annotations

import numpy as np

from reference.turboquant.presets import Preset, check_head_size

LAYOUTS = ("aos", "soa")


def check_layout(layout) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def field_sizes(p: Preset, D: int) -> dict[str, int]:
    """Bytes of each field of one (token, kv head): codes of keys and values, then fp16 scalars."""
    sizes = {"key_data": p.key_data_bytes(D), "value_data": p.value_data_bytes(D)}
    if not p.key_fp8:
        sizes["k_norm"] = 2
    sizes.update(v_scale=2, v_zero=2)
    return sizes


def block_bytes(p: Preset, D: int, Hk: int, block_size: int) -> int:
    """Bytes per cache block, the same in both layouts."""
    return block_size * Hk * p.slot_size(D)


def field_offsets(p: Preset, D: int, Hk: int, block_size: int, layout: str, slot, head) -> dict[str, np.ndarray]:
    """Start byte (into the flat cache) of every field of (slot, head); int64 arrays, broadcast."""
    D = check_head_size(D)
    check_layout(layout)
    slot = np.asarray(slot, dtype=np.int64)
    head = np.asarray(head, dtype=np.int64)
    kd, vd = p.key_data_bytes(D), p.value_data_bytes(D)
    if layout == "aos":
        base = (slot * Hk + head) * p.slot_size(D)
        out = {"key_data": base}
        if not p.key_fp8:
            out["k_norm"] = base + kd
        v = base + p.key_packed_size(D)
        out.update(value_data=v, v_scale=v + vd, v_zero=v + vd + 2)
    else:
        block, s = slot // block_size, slot % block_size
        block_base = block * block_bytes(p, D, Hk, block_size)
        data = block_base + (s * Hk + head) * (kd + vd)
        meta = block_base + block_size * Hk * (kd + vd) + 2 * (head * p.num_soa_fields * block_size + s)
        names = ("v_scale", "v_zero") if p.key_fp8 else ("k_norm", "v_scale", "v_zero")
        out = {"key_data": data, "value_data": data + kd}
        out.update({name: meta + 2 * f * block_size for f, name in enumerate(names)})
    return {k: np.broadcast_to(o, np.broadcast(slot, head).shape) for k, o in out.items()}


def byte_indices(start: np.ndarray, nbytes: int) -> np.ndarray:
    """``start[..., None] + arange(nbytes)``: the flat byte indices of a field."""
    return np.asarray(start)[..., None] + np.arange(nbytes, dtype=np.int64)


def check_cache(kv_cache, p: Preset, D: int, Hk: int) -> tuple[int, int]:
    """Validate a cache array (NumPy or JAX) and return ``(num_blocks, block_size)``."""
    shape = tuple(getattr(kv_cache, "shape", ()))
    if np.dtype(getattr(kv_cache, "dtype", None)) != np.uint8:
        raise ValueError(f"kv_cache must be uint8, got dtype {getattr(kv_cache, 'dtype', None)}")
    want = ("num_blocks", "block_size", Hk, p.slot_size(D))
    if len(shape) != 4 or shape[2] != Hk or shape[3] != p.slot_size(D) or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"kv_cache must have shape {list(want)} for {p.name}, D={D}, Hk={Hk}; got {list(shape)}")
    return shape[0], shape[1]
