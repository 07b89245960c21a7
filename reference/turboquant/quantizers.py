"""TurboQuant's quantizers in NumPy (the rounding model of ``numpy_ref``'s store, float32 throughout):
MSE keys to Lloyd-Max codes and the scalar stored in fp16, FP8 keys, uniform values with fp16 scale and zero."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from reference.turboquant.lloyd_max import centroids, midpoints
from reference.turboquant.presets import Preset

F32 = np.float32
NC_EPS = F32(1e-16)
NORM_EPS = F32(1e-8)
FP8_MAX = F32(448.0)
FP16_MAX = F32(65504.0)


def mse_key_codes(key: np.ndarray, p: Preset, layout: str, rotation) -> tuple[np.ndarray, np.ndarray]:
    """MSE keys ``[..., D]`` -> (codes uint8 ``[..., D]``, the float32 scalar ``[...]`` the store rounds to fp16)."""
    k = np.asarray(key, dtype=F32)
    c = centroids(p.key_bits, k.shape[-1])
    norm = np.sqrt(np.sum(k * k, axis=-1, dtype=F32), dtype=F32)
    y = (k / (norm[..., None] + NORM_EPS)) @ np.asarray(rotation, dtype=F32)
    idx = np.clip(np.searchsorted(midpoints(c), y, side="right"), 0, len(c) - 1).astype(np.uint8)
    scalar = norm
    if p.norm_correction and layout == "soa":
        scalar = norm / np.sqrt(np.sum(c[idx] ** 2, axis=-1, dtype=F32) + NC_EPS, dtype=F32)
    return idx, scalar


def quantize_keys(key: np.ndarray, p: Preset, layout: str, rotation) -> tuple[np.ndarray, np.ndarray | None]:
    """Keys ``[..., D]`` -> (codes uint8 ``[..., D]``, stored fp16 scalar ``[...]`` or None for FP8)."""
    if p.key_fp8:
        k = np.asarray(key, dtype=F32)
        return np.clip(k, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8), None
    idx, scalar = mse_key_codes(key, p, layout, rotation)
    return idx, scalar.astype(np.float16)


def quantize_values(value: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values ``[..., D]`` -> (codes uint8 ``[..., D]``, fp16 scale ``[...]``, fp16 zero ``[...]``)."""
    v = np.asarray(value, dtype=F32)
    top = F32(2**bits - 1)
    vmin = np.clip(v.min(axis=-1), -FP16_MAX, FP16_MAX)
    vmax = np.clip(v.max(axis=-1), -FP16_MAX, FP16_MAX)
    scale = (vmax - vmin) / top
    scale = np.where(scale > F32(1e-8), scale, F32(1e-8)).astype(F32)
    codes = np.clip(np.floor((v - vmin[..., None]) / scale[..., None] + F32(0.5)), 0, top)
    return codes.astype(np.uint8), scale.astype(np.float16), vmin.astype(np.float16)


def dequantize_fields(fields: dict, p: Preset, layout: str, key_table=None) -> tuple[np.ndarray, np.ndarray]:
    """Fields from ``read_fields`` -> (keys in ROTATED space, values), float32 ``[..., D]``.
    ``key_table``: the float32 centroid table the key codes index (None: the preset's)."""
    if p.key_fp8:
        keys = fields["key_codes"].view(ml_dtypes.float8_e4m3fn).astype(F32)
    else:
        table = centroids(p.key_bits, fields["key_codes"].shape[-1]) if key_table is None else key_table
        c = np.asarray(table, F32)[fields["key_codes"]]
        if p.norm_correction and layout == "aos":
            c = c / np.sqrt(np.sum(c * c, axis=-1, keepdims=True, dtype=F32) + NC_EPS, dtype=F32)
        keys = fields["k_norm"].astype(F32)[..., None] * c
    values = (fields["value_codes"].astype(F32) * fields["v_scale"].astype(F32)[..., None]
              + fields["v_zero"].astype(F32)[..., None])
    return keys.astype(F32), values.astype(F32)
