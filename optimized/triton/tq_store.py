"""TurboQuant cache store (quantization as ``reference.turboquant.numpy_ref.store``) for the AoS and SoA layouts.

``store(kv_cache, key, value, slot_mapping, preset=, layout=, rotation=)`` writes N tokens:
key/value ``[N, Hk, D]`` (fp16/bf16/fp32), ``slot_mapping [N]`` int32/int64 (negative = skip).
Rounding model:
- MSE keys: torch computes in fp32 ``norm = ||k||``, ``y = (k / (norm + 1e-8)) @ rotation``; the
  kernel bucketizes ``idx = #{i: y >= midpoint_i}`` against the fp32 midpoints, packs the codes and
  stores fp16(norm) (AoS) or fp16(norm / sqrt(sum c[idx]^2 + 1e-16)) (SoA with norm correction,
  computed in fp32).
- FP8 keys: torch casts to float8_e4m3fn after clamping to +-448 (saturation); the kernel copies bytes.
- Values: fp32 ``vmin, vmax`` clamped to the fp16 range, ``scale = max((vmax - vmin) / (2^b - 1), 1e-8)``,
  ``q = clamp(floor((v - vmin) / scale + 0.5), 0, 2^b - 1)`` (IEEE division), fp16 scale and zero.
One program per token, all kv heads at once.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.checks import (FLOAT_DTYPES, capturing, check_finite, check_positive, check_range, check_tensor,
                                     index_tensor)
from optimized.triton.tq_cache import cache_spec, head_size_problem
from optimized.triton.tq_common import kv_pointers
from reference.turboquant.validate import key_norm

FP8_MAX = 448.0
FP16_MAX = tl.constexpr(65504.0)


@triton.jit
def _bucketize(y, mid_ptr, LEVELS: tl.constexpr):
    idx = tl.zeros(y.shape, tl.int32)
    for m in tl.static_range(LEVELS - 1):
        idx += (y >= tl.load(mid_ptr + m)).to(tl.int32)
    return idx


@triton.jit
def _store_kernel(cache_ptr, y_ptr, norm_ptr, k8_ptr, v_ptr, slot_ptr, mid_ptr, cent_ptr,
                  stride_blk, stride_pos, stride_head, sv_n, sv_h, sv_d,
                  SOA: tl.constexpr, KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, VAL_BITS: tl.constexpr,
                  D: tl.constexpr, HK: tl.constexpr, BS: tl.constexpr,
                  KEY_BYTES: tl.constexpr, VAL_BYTES: tl.constexpr,
                  FOLD_NORM: tl.constexpr, BLOCK_H: tl.constexpr):
    n = tl.program_id(0)
    slot = tl.load(slot_ptr + n).to(tl.int64)
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)
    hm = h < HK
    blk = slot // BS
    pos = slot % BS
    key, val, knorm, vscale, vzero = kv_pointers(cache_ptr, blk, pos, h, stride_blk, stride_pos, stride_head,
                                                 SOA, KEY_FP8, HK, BS, KEY_BYTES, VAL_BYTES)
    g = tl.arange(0, D // 8)  # groups of 8 codes: KEY_BITS (or VAL_BITS) bytes each
    m2 = hm[:, None]
    tok = n.to(tl.int64)
    # ---- keys
    if KEY_FP8:
        dd = tl.arange(0, D)
        kb = tl.load(k8_ptr + tok * (HK * D) + h[:, None] * D + dd[None, :], mask=m2)
        tl.store(key[:, None] + dd[None, :], kb, mask=m2)
    else:
        LEVELS: tl.constexpr = 1 << KEY_BITS
        packed = tl.zeros((BLOCK_H, D // 8), tl.int32)
        csq = tl.zeros((BLOCK_H, D // 8), tl.float32)
        for i in tl.static_range(8):
            y = tl.load(y_ptr + tok * (HK * D) + h[:, None] * D + (g * 8 + i)[None, :], mask=m2, other=0.0)
            idx = _bucketize(y, mid_ptr, LEVELS)
            c = tl.load(cent_ptr + idx)
            csq += c * c
            packed |= idx << (KEY_BITS * i)
        for k in tl.static_range(KEY_BITS):
            tl.store(key[:, None] + (g * KEY_BITS + k)[None, :], ((packed >> (8 * k)) & 255).to(tl.uint8), mask=m2)
        norm = tl.load(norm_ptr + tok * HK + h, mask=hm, other=0.0)
        if FOLD_NORM:
            norm = tl.math.div_rn(norm, tl.sqrt_rn(tl.sum(csq, axis=1) + 1e-16))
        tl.store(knorm, norm.to(tl.float16), mask=hm)
    # ---- values
    vrow = v_ptr + tok * sv_n + h[:, None] * sv_h
    dd = tl.arange(0, D)
    v = tl.load(vrow + dd[None, :] * sv_d, mask=m2, other=0.0).to(tl.float32)
    vmin = tl.minimum(tl.maximum(tl.min(v, axis=1), -FP16_MAX), FP16_MAX)
    vmax = tl.minimum(tl.maximum(tl.max(v, axis=1), -FP16_MAX), FP16_MAX)
    QMAX: tl.constexpr = (1 << VAL_BITS) - 1
    scale = tl.math.div_rn(vmax - vmin, QMAX * 1.0)
    scale = tl.where(scale > 1e-8, scale, 1e-8)
    vpacked = tl.zeros((BLOCK_H, D // 8), tl.int32)
    for i in tl.static_range(8):
        vi = tl.load(vrow + ((g * 8 + i) * sv_d)[None, :], mask=m2, other=0.0).to(tl.float32)
        q = tl.floor(tl.math.div_rn(vi - vmin[:, None], scale[:, None]) + 0.5)
        q = tl.minimum(tl.maximum(q, 0.0), QMAX * 1.0).to(tl.int32)
        vpacked |= q << (VAL_BITS * i)
    for k in tl.static_range(VAL_BITS):
        tl.store(val[:, None] + (g * VAL_BITS + k)[None, :], ((vpacked >> (8 * k)) & 255).to(tl.uint8), mask=m2)
    tl.store(vscale, scale.to(tl.float16), mask=hm)
    tl.store(vzero, vmin.to(tl.float16), mask=hm)


def store(kv_cache, key, value, slot_mapping, *, preset, layout, rotation=None):
    """Quantize ``key``/``value`` ``[N, Hk, D]`` into ``kv_cache`` at ``slot_mapping`` (in place).
    ``rotation``: fp32 ``[D, D]`` (``y = x_hat @ rotation``), required for MSE presets.
    ``kv_cache`` is the output: checked like the inputs (``tq_cache.cache_spec``: dtype, shape, byte
    strides, no self-overlap); ``slot_mapping`` may be a Python list (converted to int32)."""
    import torch

    from reference.turboquant.lloyd_max import centroids, midpoints

    check_tensor("key", key, (None, None, None), FLOAT_DTYPES)
    N, Hk, D = key.shape
    spec = cache_spec(kv_cache, preset, D, Hk, layout)
    dev = kv_cache.device
    check_tensor("key", key, (N, Hk, D), FLOAT_DTYPES, dev)
    check_tensor("value", value, (N, Hk, D), FLOAT_DTYPES, dev)
    slot_mapping = index_tensor("slot_mapping", slot_mapping, dev)
    check_tensor("slot_mapping", slot_mapping, (N,), ("int32", "int64"), dev, contiguous=True)
    check_positive("N (tokens in key)", N)
    nslots = kv_cache.shape[0] * kv_cache.shape[1]
    check_range("slot_mapping", slot_mapping, -(2**62), nslots)
    if not capturing(slot_mapping):
        kept = slot_mapping[slot_mapping >= 0]
        if torch.unique(kept).numel() != kept.numel():
            raise ValueError("slot_mapping has a repeated non-negative slot")
    check_finite("key", key)
    check_finite("value", value)
    p = spec.preset
    dummy = torch.empty(1, dtype=torch.float32, device=dev)
    y = norm = k8 = mid = cent = dummy
    if p.key_fp8:
        k8 = key.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8).contiguous()
    else:
        if rotation is None:
            raise ValueError(f"rotation [D, D] is required for the MSE-key preset {p.name}")
        check_tensor("rotation", rotation, (D, D), ("float32",), dev)
        check_finite("rotation", rotation)
        kf = key.float()
        norm = torch.linalg.vector_norm(kf, dim=-1)
        if not capturing(norm):
            key_norm(float(torch.linalg.vector_norm(key.double(), dim=-1).max()))
        y = ((kf / (norm[..., None] + 1e-8)) @ rotation).contiguous()
        norm = norm.contiguous()
        c = centroids(p.key_bits, D)
        cent = torch.from_numpy(c).to(dev)
        mid = torch.from_numpy(midpoints(c)).to(dev)
    _store_kernel[(N,)](
        kv_cache, y, norm, k8, value, slot_mapping, mid, cent,
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2),
        value.stride(0), value.stride(1), value.stride(2),
        FOLD_NORM=spec.soa and p.norm_correction, BLOCK_H=triton.next_power_of_2(Hk),
        num_warps=4, **spec.constexprs())
    return kv_cache


def problem(*, preset: str, layout: str, D: int, block_size: int | None = None, G: int | None = None,
            sinks: bool = False, act: str | None = None, device=None) -> str | None:
    """Why the store cannot serve a request (None if it can): it takes every preset and layout, and
    the Triton kernels' head sizes."""
    return head_size_problem(D)


ENTRY_POINTS = {"store": store}


def compile_specs():
    """The store kernel for each preset, in the layout the spec names (``compile_check``)."""
    from optimized.triton.compile_check import HK, CompileSpec, cache_spec

    out = []
    for preset, layout in (("turboquant_4bit_nc", "soa"), ("turboquant_k3v4_nc", "aos"),
                           ("turboquant_3bit_nc", "soa"), ("turboquant_k8v4", "aos")):
        spec = cache_spec(preset, layout)
        out.append(CompileSpec(f"store {preset}/{layout}", _store_kernel, dict(
            cache_ptr="*u8", y_ptr="*fp32", norm_ptr="*fp32", k8_ptr="*u8" if spec.preset.key_fp8 else "*fp32",
            v_ptr="*bf16", slot_ptr="*i64", mid_ptr="*fp32", cent_ptr="*fp32", stride_blk="i32", stride_pos="i32",
            stride_head="i32", sv_n="i32", sv_h="i32", sv_d="i32"),
            dict(FOLD_NORM=spec.soa and spec.preset.norm_correction, BLOCK_H=HK, **spec.constexprs())))
    return out
