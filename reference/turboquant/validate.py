"""Argument checks shared by the NumPy and JAX references: bad input raises ValueError (or
TypeError) naming the argument and what was expected. Works on NumPy and JAX arrays alike
(shapes and dtypes are read, integer tables are pulled to NumPy)."""
from __future__ import annotations

import numbers

import numpy as np

from reference.arguments import array, indices
from reference.turboquant.layout import check_cache, check_layout
from reference.turboquant.presets import Preset, check_head_size, preset
from reference.turboquant.quantizers import mse_key_codes
from reference.turboquant.rotation import check_rotation

FP32_MAX = float(np.finfo(np.float32).max)
FP16_MAX = float(np.finfo(np.float16).max)


def floats(name: str, x, ndim: int, what: str) -> np.ndarray:
    """A finite float array of ``ndim`` dims (``what`` names the expected shape); a Python list or
    tuple is refused (TypeError), not converted."""
    array(name, x)
    a = np.asarray(x)
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {what}, got shape {list(a.shape)}")
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        raise TypeError(f"{name} must be a float array, got dtype {a.dtype}")
    if not np.all(np.isfinite(a.astype(np.float32))):
        raise ValueError(f"{name} holds NaN or Inf")
    return a


def ints(name: str, x, ndim: int) -> np.ndarray:
    """An integer array of ``ndim`` dims as int64; a Python list or tuple of integers is converted."""
    a = np.asarray(indices(name, x))
    if a.dtype.kind not in "iu" or a.ndim != ndim:
        raise ValueError(f"{name} must be a {ndim}-d integer array, got dtype {a.dtype} shape {list(a.shape)}")
    return a.astype(np.int64)


def cache_dims(kv_cache) -> tuple[int, int, int, int]:
    shape = tuple(int(s) for s in np.shape(kv_cache))
    if len(shape) != 4:
        raise ValueError(f"kv_cache must be [num_blocks, block_size, Hk, slot_size], got shape {list(shape)}")
    return shape


def head_size_of(p: Preset, slot_size: int) -> int:
    """The head size D whose slot size is ``slot_size`` under ``p`` (slot_size grows with D)."""
    D = 16
    while p.slot_size(D) < slot_size:
        D += 16
    if p.slot_size(D) != slot_size:
        raise ValueError(f"kv_cache last dim {slot_size} is not the slot size of {p.name} for any D")
    return D


def rotation_for(p: Preset, rotation, D: int) -> None:
    """MSE keys need R ``[D, D]``; FP8 keys ignore it (None allowed)."""
    if not p.key_fp8:
        check_rotation(rotation, D)


def store_args(kv_cache, key, value, slot_mapping, preset_name, layout, rotation):
    """-> (preset, layout, D, kept slots int64 [n], keep mask [N]) after checking every argument."""
    p, layout = preset(preset_name), check_layout(layout)
    key = floats("key", key, 3, "[N, Hk, D]")
    value = floats("value", value, 3, "[N, Hk, D]")
    if key.shape != value.shape:
        raise ValueError(f"value shape {list(value.shape)} must equal key shape {list(key.shape)}")
    N, Hk, D = key.shape
    check_head_size(D)
    num_blocks, block_size = check_cache(kv_cache, p, D, Hk)
    slots = slot_table(slot_mapping, N, num_blocks, block_size)
    rotation_for(p, rotation, D)
    keep = slots >= 0
    if not p.key_fp8:
        key_norm(float(np.max(np.linalg.norm(key.astype(np.float64), axis=-1), initial=0.0)))
        if p.norm_correction and layout == "soa":
            folded_norm(key[keep], p, rotation)
    if len(np.unique(slots[keep])) != int(keep.sum()):
        raise ValueError("slot_mapping has a repeated non-negative slot")
    return p, layout, D, slots[keep], keep


def slot_table(slot_mapping, N: int, num_blocks: int, block_size: int) -> np.ndarray:
    """-> slot_mapping int64 [N]: one flat slot per token, below num_blocks * block_size (negative: not stored)."""
    slots = ints("slot_mapping", slot_mapping, 1)
    if slots.shape[0] != N:
        raise ValueError(f"slot_mapping must have {N} entries (one per token), got {slots.shape[0]}")
    if np.any(slots >= num_blocks * block_size):
        raise ValueError(f"slot_mapping entries must be < num_blocks * block_size = {num_blocks * block_size}")
    return slots


def tables(block_table, seq_lens, num_blocks: int, block_size: int, B: int | None = None):
    """-> (block_table int64 [B, M], seq_lens int64 [B]); every used entry is a valid block."""
    bt = ints("block_table", block_table, 2)
    lens = ints("seq_lens", seq_lens, 1)
    if bt.shape[0] != lens.shape[0] or (B is not None and lens.shape[0] != B):
        raise ValueError(f"block_table rows ({bt.shape[0]}) and seq_lens ({lens.shape[0]}) must both be B"
                         + ("" if B is None else f" = {B}"))
    if np.any(lens < 1) or np.any(lens > bt.shape[1] * block_size):
        raise ValueError(f"seq_lens must be in [1, block_table columns * block_size = {bt.shape[1] * block_size}]")
    for b, L in enumerate(lens):
        used = bt[b, : -(-L // block_size)]
        if np.any((used < 0) | (used >= num_blocks)):
            raise ValueError(f"block_table row {b} uses a block outside [0, {num_blocks})")
    return bt, lens


def cache_args(kv_cache, preset_name, layout, D: int | None = None):
    """-> (preset, layout, D, (num_blocks, block_size, Hk)) for a cache read; D from the slot size
    when not given. The rotation is checked by the caller (``rotation_for``)."""
    p, layout = preset(preset_name), check_layout(layout)
    num_blocks, block_size, Hk, slot_size = cache_dims(kv_cache)
    D = head_size_of(p, slot_size) if D is None else check_head_size(D)
    check_cache(kv_cache, p, D, Hk)
    return p, layout, D, (num_blocks, block_size, Hk)


def decode_args(query, kv_cache, block_table, seq_lens, preset_name, layout, rotation, scale, sinks,
                num_kv_splits):
    """-> (preset, layout, dims (B, Hq, Hk, D, block_size), block_table, seq_lens, scale) after
    checking every decode argument."""
    q = floats("query", query, 3, "[B, Hq, D]")
    B, Hq, D = q.shape
    check_head_size(D)
    p, layout, D, (num_blocks, block_size, Hk) = cache_args(kv_cache, preset_name, layout, D)
    rotation_for(p, rotation, D)
    query_heads(Hq, Hk)
    split_count(num_kv_splits)
    bt, lens = tables(block_table, seq_lens, num_blocks, block_size, B)
    if sinks is not None:
        floats("sinks", sinks, 1, f"None or [Hq={Hq}]")
        if np.shape(sinks) != (Hq,):
            raise ValueError(f"sinks must be None or [Hq={Hq}], got shape {list(np.shape(sinks))}")
    return p, layout, (B, Hq, Hk, D, block_size), bt, lens, softmax_scale(scale, D)


def query_heads(Hq: int, Hk: int) -> None:
    """ValueError naming the query heads unless Hq is a multiple of the cache's kv heads Hk (G = Hq / Hk)."""
    if Hk < 1 or Hq % Hk:
        raise ValueError(f"query heads Hq={Hq} must be a multiple of the cache's kv heads Hk={Hk}")


def softmax_scale(scale, D: int) -> float:
    """``1 / sqrt(D)`` for None, else ``scale`` as a float; TypeError for a non-number, ValueError
    for NaN, Inf or a value beyond float32's range (the kernels scale in float32), naming ``scale``."""
    if scale is None:
        return float(1.0 / np.sqrt(D))
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not np.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if abs(scale) > FP32_MAX:
        raise ValueError(f"scale must be finite in float32 (|scale| <= {FP32_MAX:.8g}), got {scale}")
    return float(scale)


def key_norm(largest: float) -> None:
    """MSE presets store each key's L2 norm as float16: ValueError naming ``key`` when the largest
    norm is beyond float16's range (the stored norm would be Inf)."""
    if not largest <= FP16_MAX:
        raise ValueError(f"key holds a vector of L2 norm {largest:.6g}, beyond float16's range "
                         f"({FP16_MAX:.0f}) where MSE presets store the norm; scale the keys down")


def folded_norm(key, p: Preset, rotation) -> None:
    """An SoA norm-corrected store writes ``||k|| / sqrt(sum_j c[idx_j]^2 + 1e-16)``, larger than the norm,
    into the fp16 k_norm field: ValueError naming ``key`` when the largest (codes and float32 arithmetic as
    ``numpy_ref`` picks them) is beyond float16's range (the stored scalar would be Inf)."""
    _, scalar = mse_key_codes(key, p, "soa", rotation)
    largest = float(np.max(scalar, initial=0.0))
    if not largest <= FP16_MAX:
        raise ValueError(f"key holds a vector whose norm-corrected scalar ||k|| / sqrt(sum c^2) is {largest:.6g}, "
                         f"beyond float16's range ({FP16_MAX:.0f}) where the SoA layout stores it; scale the keys down")


def split_count(num_kv_splits, most: int | None = None) -> int:
    """``num_kv_splits`` as an int in ``[1, most]`` (no upper bound for None); ValueError naming it."""
    if (isinstance(num_kv_splits, bool) or not isinstance(num_kv_splits, numbers.Integral) or num_kv_splits < 1
            or (most is not None and num_kv_splits > most)):
        bound = "a positive integer" if most is None else f"an integer in [1, {most}]"
        raise ValueError(f"num_kv_splits must be {bound}, got {num_kv_splits!r}")
    return int(num_kv_splits)


def token_slots(block_table: np.ndarray, b: int, L: int, block_size: int) -> np.ndarray:
    """Flat slots of tokens ``0..L-1`` of sequence ``b``."""
    t = np.arange(L)
    return block_table[b, t // block_size] * block_size + t % block_size
