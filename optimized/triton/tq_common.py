"""Triton device helpers shared by the TurboQuant kernels: cache addressing for the AoS and SoA
layouts, unpacking of 3/4-bit codes and FP8 E4M3 keys, value dequantization, MMA operand rounding.

Byte format (``reference.turboquant.layout``): 4-bit codes hold element 2k in the low nibble of
byte k; 3-bit codes are a little-endian bit stream (element j at bit 3j); fp16 metadata is
little-endian (read through an fp16 pointer: every metadata offset is even). Everything is
computed in fp32; only pointer arithmetic on the block index is 64-bit.
No CUDA-only intrinsics: the same source compiles for ROCm and runs in the interpreter.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def split_range(seq_lens_ptr, b, s, S: tl.constexpr, ALIGN: tl.constexpr):
    """Tokens ``[start, end)`` of split ``s`` (a scalar or a tensor of splits) of ``S`` of sequence
    ``b``: ``W = cdiv(L, S)`` rounded up to a multiple of ``ALIGN`` tokens each, so every split starts
    on an ``ALIGN`` boundary (the stage-2 reduce calls this with the same ``ALIGN``); empty when
    ``start >= end``."""
    L = tl.load(seq_lens_ptr + b)
    W = tl.cdiv(tl.cdiv(L, S), ALIGN) * ALIGN
    start = s * W
    return start, tl.minimum(start + W, L)


@triton.jit
def kv_pointers(cache_ptr, blk, pos, head, stride_blk, stride_pos, stride_head,
                SOA: tl.constexpr, KEY_FP8: tl.constexpr, HK: tl.constexpr, BS: tl.constexpr,
                KEY_BYTES: tl.constexpr, VAL_BYTES: tl.constexpr):
    """Pointers of one (block, position, kv head) record, or a tensor of them (``blk``, ``pos``,
    ``head`` broadcast): key codes (uint8), value codes (uint8), then fp16 pointers to the key
    scalar (k_norm; unused for FP8 keys), v_scale and v_zero."""
    block = cache_ptr + blk.to(tl.int64) * stride_blk
    if SOA:
        NF: tl.constexpr = 2 if KEY_FP8 else 3
        key = block + (pos * HK + head) * (KEY_BYTES + VAL_BYTES)
        val = key + KEY_BYTES
        meta = (block + BS * HK * (KEY_BYTES + VAL_BYTES)).to(tl.pointer_type(tl.float16))
        meta = meta + head * (NF * BS) + pos
        if KEY_FP8:
            knorm = meta
            vscale = meta
        else:
            knorm = meta
            vscale = meta + BS
        vzero = vscale + BS
    else:
        key = block + pos * stride_pos + head * stride_head
        knorm = (key + KEY_BYTES).to(tl.pointer_type(tl.float16))
        if KEY_FP8:
            val = key + KEY_BYTES
        else:
            val = key + KEY_BYTES + 2
        vscale = (val + VAL_BYTES).to(tl.pointer_type(tl.float16))
        vzero = vscale + 1
    return key, val, knorm, vscale, vzero


@triton.jit
def load_codes(rows, d, mask, BITS: tl.constexpr, NBYTES: tl.constexpr):
    """int32 codes ``[N, len(d)]`` of elements ``d`` of the records at byte pointers ``rows [N]``
    (BITS 3, 4 or 8); rows outside ``mask`` read as 0."""
    if BITS == 8:
        codes = tl.load(rows[:, None] + d[None, :], mask=mask[:, None], other=0).to(tl.int32)
    elif BITS == 4:
        b = tl.load(rows[:, None] + (d // 2)[None, :], mask=mask[:, None], other=0).to(tl.int32)
        codes = (b >> ((d % 2) * 4)[None, :]) & 15
    else:
        bit = d * BITS
        byte = bit // 8
        lo = tl.load(rows[:, None] + byte[None, :], mask=mask[:, None], other=0).to(tl.int32)
        hi = tl.load(rows[:, None] + (byte + 1)[None, :], mask=mask[:, None] & (byte + 1 < NBYTES)[None, :],
                     other=0).to(tl.int32)
        codes = ((lo | (hi << 8)) >> (bit % 8)[None, :]) & ((1 << BITS) - 1)
    return codes


@triton.jit
def e4m3_to_f32(b):
    """FP8 E4M3 (OCP ``e4m3fn``: bias 7, no inf, S.1111.111 = NaN) bytes as int32 -> fp32, by
    integer arithmetic (portable: no fp8 type is needed on the device)."""
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)  # subnormal: m * 2^-9
    mag = tl.where((e == 15) & (m == 7), float("nan"), mag)
    return tl.where((b & 128) != 0, -mag, mag)


@triton.jit
def load_key_tile(key_rows, knorm_ptrs, centroids_ptr, d, mask,
                  KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, KEY_BYTES: tl.constexpr,
                  NORM_AT_DECODE: tl.constexpr):
    """Dequantized keys ``[N, D]`` fp32 in the space the query must be in (rotated for MSE keys):
    FP8: the decoded bytes; MSE: ``c[idx] * k_scalar`` with k_scalar the stored fp16 (SoA: norm
    correction pre-folded by the store); with NORM_AT_DECODE (AoS norm correction)
    ``(c[idx] / sqrt(sum c[idx]^2 + 1e-16)) * norm``."""
    codes = load_codes(key_rows, d, mask, KEY_BITS, KEY_BYTES)
    if KEY_FP8:
        k = e4m3_to_f32(codes)
    else:
        c = tl.load(centroids_ptr + codes)
        ks = tl.load(knorm_ptrs, mask=mask, other=0.0).to(tl.float32)
        if NORM_AT_DECODE:
            c = tl.math.div_rn(c, tl.sqrt_rn(tl.sum(c * c, axis=1) + 1e-16)[:, None])
        k = c * ks[:, None]
    return k


@triton.jit
def load_value_tile(val_rows, vscale_ptrs, vzero_ptrs, d, mask,
                    VAL_BITS: tl.constexpr, VAL_BYTES: tl.constexpr):
    """Dequantized values ``[N, D]`` fp32: ``code * f32(scale16) + f32(zero16)``; masked rows 0."""
    codes = load_codes(val_rows, d, mask, VAL_BITS, VAL_BYTES)
    vs = tl.load(vscale_ptrs, mask=mask, other=0.0).to(tl.float32)
    vz = tl.load(vzero_ptrs, mask=mask, other=0.0).to(tl.float32)
    return codes.to(tl.float32) * vs[:, None] + vz[:, None]


@triton.jit
def to_mma(x, MMA: tl.constexpr):
    """``x`` rounded to the MMA operand dtype (``"bf16"``, ``"fp16"``; ``"ieee"``: unchanged fp32)."""
    if MMA == "bf16":
        y = x.to(tl.bfloat16)
    elif MMA == "fp16":
        y = x.to(tl.float16)
    else:
        y = x
    return y
