"""Grouped-query TurboQuant decode with a pair lookup table (the FLUTE idea; research/turboquant.md
3.4) for the SoA layout and 4-bit MSE keys and values (``turboquant_4bit_nc``).

One program per (sequence, kv head, split) holds all G query heads of the kv head as the rows of
``BLOCK_M = max(16, next_pow2(G))`` so QK^T and PV run on the matrix units (``tl.dot``). A key
byte is loaded once and one lookup in the 256-entry pair table yields both dequantized centroids
of its nibbles (``PAIR_LUT=False``: two lookups in the 16-entry table, for comparison); values are
unpacked by nibble interleave. Sinks as in the split kernel (split 0 starts at ``m = sink``).

Rounding models: ``exact`` (fp32 operands, ``input_precision="ieee"``; used by the interpreter),
``bf16`` (the matrix-unit operands are rounded to bf16: ``q_rot``, ``K = c[idx] * f32(k_scalar)``,
``P = exp(x - m)``, ``V = code * f32(scale16) + f32(zero16)``; products accumulate in fp32).
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.tq_common import kv_pointers
from optimized.triton.tq_decode_launch import (centroid_table, check_decode_args, default_num_splits, interpreting,
                                               prepare_out, reduce_partials, rotate_queries, validate_values,
                                               workspace_for)

PRESETS = ("turboquant_4bit_nc",)
PRECISIONS = ("exact", "bf16")


@triton.jit
def _mma(a, b, BF16: tl.constexpr):
    """``a @ b`` with fp32 accumulation: bf16 operands, or fp32 operands in IEEE precision."""
    if BF16:
        r = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        r = tl.dot(a, b, input_precision="ieee")
    return r


@triton.jit
def _load_tile(cache_ptr, blk, t, live, h, stride_blk, HK: tl.constexpr, BS: tl.constexpr,
               KEY_BYTES: tl.constexpr, VAL_BYTES: tl.constexpr, D: tl.constexpr):
    """Raw bytes of a tile of tokens ``t`` (block ids ``blk``) of kv head h: key and value bytes
    ``[N, D/2]`` int32, k_scalar, v_scale, v_zero ``[N]`` fp32 (rows outside ``live``: 0)."""
    key, val, knorm, vscale, vzero = kv_pointers(cache_ptr, blk, t % BS, h, stride_blk, 0, 0,
                                                 True, False, HK, BS, KEY_BYTES, VAL_BYTES)
    j = tl.arange(0, D // 2)
    kb = tl.load(key[:, None] + j[None, :], mask=live[:, None], other=0).to(tl.int32)
    vb = tl.load(val[:, None] + j[None, :], mask=live[:, None], other=0).to(tl.int32)
    kn = tl.load(knorm, mask=live, other=0.0).to(tl.float32)
    vs = tl.load(vscale, mask=live, other=0.0).to(tl.float32)
    vz = tl.load(vzero, mask=live, other=0.0).to(tl.float32)
    return kb, vb, kn, vs, vz


@triton.jit
def _lut_kernel(q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, lut_ptr, cent_ptr, sinks_ptr, part_ptr,
                stride_blk, stride_bt, scale,
                D: tl.constexpr, HK: tl.constexpr, BS: tl.constexpr, KEY_BYTES: tl.constexpr,
                VAL_BYTES: tl.constexpr, HQ: tl.constexpr, G: tl.constexpr, S: tl.constexpr,
                MAXS: tl.constexpr, HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                PAIR_LUT: tl.constexpr, BF16: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    L = tl.load(seq_lens_ptr + b)
    W = tl.cdiv(L, S)
    start = s * W
    end = tl.minimum(start + W, L)
    if start < end:
        r = tl.arange(0, BLOCK_M)
        rm = r < G
        hq = h * G + r
        d = tl.arange(0, D)
        q = tl.load(q_ptr + (b.to(tl.int64) * HQ + hq)[:, None] * D + d[None, :], mask=rm[:, None], other=0.0)
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        if HAS_SINKS:
            if s == 0:
                m = tl.load(sinks_ptr + hq, mask=rm, other=float("-inf"))
                l = tl.where(rm, 1.0, 0.0)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        # Software prefetch: a tile's bytes are loaded one iteration before use and its block ids
        # two, so their memory latency overlaps the previous tile's arithmetic.
        row = bt_ptr + b.to(tl.int64) * stride_bt
        t = start + tl.arange(0, BLOCK_N)
        kb, vb, kn, vs, vz = _load_tile(cache_ptr, tl.load(row + t // BS, mask=t < end, other=0), t, t < end, h,
                                        stride_blk, HK, BS, KEY_BYTES, VAL_BYTES, D)
        blk_next = tl.load(row + (t + BLOCK_N) // BS, mask=t + BLOCK_N < end, other=0)
        for t0 in range(start, end, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            live = t < end
            blk_after = tl.load(row + (t + 2 * BLOCK_N) // BS, mask=t + 2 * BLOCK_N < end, other=0)
            kb_n, vb_n, kn_n, vs_n, vz_n = _load_tile(cache_ptr, blk_next, t + BLOCK_N, t + BLOCK_N < end, h,
                                                      stride_blk, HK, BS, KEY_BYTES, VAL_BYTES, D)
            if PAIR_LUT:
                pair = tl.load(lut_ptr + kb[:, :, None] * 2 + tl.arange(0, 2)[None, None, :])
                c = tl.reshape(pair, (BLOCK_N, D))
            else:
                c = tl.interleave(tl.load(cent_ptr + (kb & 15)), tl.load(cent_ptr + (kb >> 4)))
            x = _mma(q, tl.trans(c * kn[:, None]), BF16) * scale
            x = tl.where(live[None, :], x, float("-inf"))
            m_new = tl.maximum(m, tl.max(x, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(x - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            vc = tl.interleave(vb & 15, vb >> 4).to(tl.float32)
            acc = acc * alpha[:, None] + _mma(p, vc * vs[:, None] + vz[:, None], BF16)
            m = m_new
            kb, vb, kn, vs, vz = kb_n, vb_n, kn_n, vs_n, vz_n
            blk_next = blk_after
        base = part_ptr + ((b.to(tl.int64) * HQ + hq) * MAXS + s) * (D + 1)
        tl.store(base[:, None] + d[None, :], acc / l[:, None], mask=rm[:, None])
        tl.store(base + D, m + tl.log(l), mask=rm)


def decode_pair_lut(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation=None, scale=None,
                    sinks=None, num_kv_splits=None, workspace=None, out=None, precision=None, pair_lut=True,
                    block_n=None, num_warps=4):
    """Like ``tq_decode_split.decode_split`` (same arguments and result) for SoA
    ``turboquant_4bit_nc`` caches; ``precision`` "exact" or "bf16" (default: bf16 on a GPU, exact
    in the interpreter, whose bf16 arithmetic is broken)."""
    from reference.turboquant.presets import preset as lookup

    if lookup(preset).name not in PRESETS or layout != "soa":
        raise ValueError(f"preset/layout must be one of {PRESETS} with layout 'soa', got {preset!r}/{layout!r}")
    precision = precision or ("exact" if interpreting() else "bf16")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and interpreting():
        raise ValueError("precision 'bf16' is not available under TRITON_INTERPRET=1 (broken bf16 arithmetic)")
    a = check_decode_args(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                          rotation=rotation, scale=scale, sinks=sinks)
    spec, B, Hq = a.spec, a.B, a.Hq
    D = spec.head_size
    block_n = block_n or 64
    max_splits = workspace.max_splits if workspace is not None else 32
    S = num_kv_splits or default_num_splits(B, spec.num_kv_heads, block_table.shape[1] * spec.block_size,
                                            block_n, kv_cache.device, max_splits)
    ws = workspace_for(workspace, B, Hq, D, S, kv_cache.device)
    out = prepare_out(out, B, Hq, D, query.dtype, kv_cache.device)
    validate_values(query.contiguous(), block_table, seq_lens, sinks, kv_cache.shape[0], spec.block_size, ws.flags)
    rotate_queries(query, rotation, ws.q_rot, rotate=True)
    lut = centroid_table(spec.preset, D, kv_cache.device, pairs=True)
    cent = centroid_table(spec.preset, D, kv_cache.device)
    _lut_kernel[(B, spec.num_kv_heads, S)](
        ws.q_rot, kv_cache, block_table, seq_lens, lut, cent, sinks if sinks is not None else ws.q_rot,
        ws.partials, kv_cache.stride(0), block_table.stride(0), a.scale,
        D=D, HK=spec.num_kv_heads, BS=spec.block_size, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes,
        HQ=Hq, G=a.G, S=S, MAXS=ws.max_splits, HAS_SINKS=sinks is not None,
        BLOCK_M=max(16, triton.next_power_of_2(a.G)), BLOCK_N=block_n, PAIR_LUT=pair_lut,
        BF16=precision == "bf16", num_warps=num_warps)
    reduce_partials(ws, seq_lens, out, S)
    return out
