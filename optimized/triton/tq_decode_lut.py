"""Grouped-query TurboQuant decode for the SoA layout and 4-bit MSE keys and values
(``turboquant_4bit_nc``): the fast decode of research/turboquant.md 3.4.

One program per (sequence, kv head, split) holds all G query heads of the kv head as the rows of
``BLOCK_M = max(16, next_pow2(G))``, so QK^T and PV run on the matrix units (``tl.dot``), and walks
its tokens in tiles of ``BLOCK_N``. Nothing is interleaved: byte j of a record holds elements 2j
(low nibble) and 2j+1 (high nibble), so the launcher splits the rotated query into its even and
odd dimensions and the kernel keeps two ``[BLOCK_N, D/2]`` halves of every tile:

- keys: ``score = k_scalar[t] * (q_even . c[lo_t] + q_odd . c[hi_t])``; the 16 centroids are a
  register table read by ``tl.gather`` (``KEYS="gather"``; ``"select"``: a select tree over the
  8 positive centroids and a sign, using ``c[15 - i] = -c[i]``; ``"load"``: a gather from global
  memory, for comparison; ``"pair"``: the FLUTE idea, one ``tl.gather`` per key byte from a
  256-entry register table whose entry packs both centroids of the byte, ``c[b & 15]`` and
  ``c[b >> 4]``: two fp32 in an int64 on the exact path, two bf16 in an int32 on the bf16 path
  (``tq_decode_launch.pair_table``)), never dequantized further;
- values are uniform codes: ``P @ (code * s + z) = (P * s) @ code + (P @ z)``, so the value tile
  is the raw codes (bf16 ``128 + code``, built from bits; the ``128 * rowsum(P * s)`` it adds is
  subtracted at the end) and ``P @ z`` is a row sum. ``P * s`` enters the MMA as a bf16 pair
  ``hi + lo`` (``PV_SPLIT``), so its rounding costs nothing beyond fp32.
Softmax in base 2 (``log2 e`` folded into the per-token factor). Sinks as in the split kernel
(split 0 starts at ``m = sink``). Partials: ``[D + 1]`` fp32 as in ``tq_decode_launch``.

Rounding models: ``exact`` (fp32 operands, ``input_precision="ieee"``; the interpreter's path),
``bf16`` (matrix-unit operands in bf16: ``q_rot``, the centroids ``c`` (K = bf16(c) * f32(k_scalar)),
``P * s`` as hi + lo and the exact codes; fp32 accumulation) -- the family's ``bf16-mma`` model.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.tq_common import kv_pointers, split_range
from optimized.triton.tq_decode_launch import (begin_split_decode, centroid_table, interpreting, pair_table,
                                               reduce_partials)

PRESETS = ("turboquant_4bit_nc",)
PRECISIONS = ("exact", "bf16")
KEY_METHODS = ("gather", "select", "load", "pair")
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _mma(a, b, BF16: tl.constexpr):
    """``a @ b`` with fp32 accumulation: bf16 operands, or fp32 operands in IEEE precision."""
    if BF16:
        r = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        r = tl.dot(a, b, input_precision="ieee")
    return r


@triton.jit
def _centroids(idx, table, cent_ptr, KEYS: tl.constexpr, BLOCK_N: tl.constexpr):
    """fp32 ``c[idx]`` for int32 codes ``idx [BLOCK_N, D/2]`` in [0, 16); ``table [16]`` fp32."""
    if KEYS == "gather":
        c = tl.gather(tl.broadcast_to(table[None, :], (BLOCK_N, 16)), idx, 1)
    elif KEYS == "select":
        neg = idx < 8
        m = tl.where(neg, 7 - idx, idx - 8)  # c[i] = -c[15 - i]: magnitude c[8 + m]
        b0 = (m & 1) != 0
        lo = tl.where((m & 2) != 0, tl.where(b0, tl.load(cent_ptr + 11), tl.load(cent_ptr + 10)),
                      tl.where(b0, tl.load(cent_ptr + 9), tl.load(cent_ptr + 8)))
        hi = tl.where((m & 2) != 0, tl.where(b0, tl.load(cent_ptr + 15), tl.load(cent_ptr + 14)),
                      tl.where(b0, tl.load(cent_ptr + 13), tl.load(cent_ptr + 12)))
        c = tl.where((m & 4) != 0, hi, lo)
        c = tl.where(neg, -c, c)
    else:
        c = tl.load(cent_ptr + idx)
    return c


@triton.jit
def _centroid_pairs(kb, pairs, BLOCK_N: tl.constexpr, HALF: tl.constexpr, BF16: tl.constexpr):
    """``(c[kb & 15], c[kb >> 4])`` for key bytes ``kb [BLOCK_N, HALF]`` int32 in [0, 256): one
    gather per byte from the packed pair table ``pairs [256]`` (int64 of two fp32, or with
    ``BF16`` int32 of two bf16; low half = low nibble); fp32, or bf16 with ``BF16``. The gather
    runs on the flattened bytes, so the table is not broadcast per row."""
    e = tl.gather(pairs, tl.reshape(kb, (BLOCK_N * HALF,)), 0)
    e = tl.reshape(e, (BLOCK_N, HALF))
    if BF16:
        c_lo = e.to(tl.int16).to(tl.bfloat16, bitcast=True)
        c_hi = (e >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        c_lo = e.to(tl.int32).to(tl.float32, bitcast=True)
        c_hi = (e >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return c_lo, c_hi


@triton.jit
def _codes_operand(code, BF16: tl.constexpr):
    """Value codes [.., D/2] int32 in [0, 16) as an MMA operand: bf16 ``128 + code`` built from its
    bits (no int-to-float conversion), or fp32 ``code`` on the exact path."""
    if BF16:
        v = (code | 0x4300).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        v = code.to(tl.float32)
    return v


@triton.jit
def _grouped_kernel(q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, cent_ptr, sinks_ptr, part_ptr,
                    stride_blk, stride_bt, scale,
                    D: tl.constexpr, HK: tl.constexpr, BS: tl.constexpr, KEY_BYTES: tl.constexpr,
                    VAL_BYTES: tl.constexpr, HQ: tl.constexpr, G: tl.constexpr, S: tl.constexpr,
                    MAXS: tl.constexpr, HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    KEYS: tl.constexpr, TABLE: tl.constexpr, PV_SPLIT: tl.constexpr, BF16: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    start, end = split_range(seq_lens_ptr, b, s, S)
    if start < end:
        r = tl.arange(0, BLOCK_M)
        rm = r < G
        hq = h * G + r
        j = tl.arange(0, D // 2)
        qrow = q_ptr + (b.to(tl.int64) * HQ + hq)[:, None] * D + 2 * j[None, :]
        q_even = tl.load(qrow, mask=rm[:, None], other=0.0)
        q_odd = tl.load(qrow + 1, mask=rm[:, None], other=0.0)
        if BF16:
            q_even = q_even.to(tl.bfloat16)
            q_odd = q_odd.to(tl.bfloat16)
        table = tl.load(cent_ptr + tl.arange(0, TABLE))
        qk_scale = scale * LOG2E
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        if HAS_SINKS:
            if s == 0:
                m = tl.load(sinks_ptr + hq, mask=rm, other=float("-inf")) * LOG2E
                l = tl.where(rm, 1.0, 0.0)
        acc_even = tl.zeros((BLOCK_M, D // 2), tl.float32)
        acc_odd = tl.zeros((BLOCK_M, D // 2), tl.float32)
        zsum = tl.zeros((BLOCK_M,), tl.float32)  # sum_t p_t z_t
        psum = tl.zeros((BLOCK_M,), tl.float32)  # sum_t of the MMA's P * s operand (the 128 offset)
        row = bt_ptr + b.to(tl.int64) * stride_bt
        for t0 in range(start, end, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            live = t < end
            blk = tl.load(row + t // BS, mask=live, other=0)
            key, val, knorm, vscale, vzero = kv_pointers(cache_ptr, blk, t % BS, h, stride_blk, 0, 0, True, False,
                                                         HK, BS, KEY_BYTES, VAL_BYTES)
            kb = tl.load(key[:, None] + j[None, :], mask=live[:, None], other=0).to(tl.int32)
            vb = tl.load(val[:, None] + j[None, :], mask=live[:, None], other=0).to(tl.int32)
            kn = tl.load(knorm, mask=live, other=0.0).to(tl.float32)
            vs = tl.load(vscale, mask=live, other=0.0).to(tl.float32)
            vz = tl.load(vzero, mask=live, other=0.0).to(tl.float32)
            if KEYS == "pair":
                c_lo, c_hi = _centroid_pairs(kb, table, BLOCK_N, D // 2, BF16)
            else:
                c_lo = _centroids(kb & 15, table, cent_ptr, KEYS, BLOCK_N)
                c_hi = _centroids(kb >> 4, table, cent_ptr, KEYS, BLOCK_N)
            x = _mma(q_even, tl.trans(c_lo), BF16) + _mma(q_odd, tl.trans(c_hi), BF16)
            x = tl.where(live[None, :], x * (kn * qk_scale)[None, :], float("-inf"))
            m_new = tl.maximum(m, tl.max(x, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(x - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            zsum = zsum * alpha + tl.sum(p * vz[None, :], axis=1)
            ps = p * vs[None, :]
            v_even = _codes_operand(vb & 15, BF16)
            v_odd = _codes_operand(vb >> 4, BF16)
            acc_even *= alpha[:, None]
            acc_odd *= alpha[:, None]
            if BF16:
                ps_hi = ps.to(tl.bfloat16)
                acc_even = tl.dot(ps_hi, v_even, acc_even)
                acc_odd = tl.dot(ps_hi, v_odd, acc_odd)
                ps_used = ps_hi.to(tl.float32)
                if PV_SPLIT:
                    ps_lo = (ps - ps_used).to(tl.bfloat16)
                    acc_even = tl.dot(ps_lo, v_even, acc_even)
                    acc_odd = tl.dot(ps_lo, v_odd, acc_odd)
                    ps_used += ps_lo.to(tl.float32)
                psum = psum * alpha + tl.sum(ps_used, axis=1)
            else:
                acc_even = tl.dot(ps, v_even, acc_even, input_precision="ieee")
                acc_odd = tl.dot(ps, v_odd, acc_odd, input_precision="ieee")
            m = m_new
        shift = zsum
        if BF16:
            shift -= 128.0 * psum
        base = part_ptr + ((b.to(tl.int64) * HQ + hq) * MAXS + s) * (D + 1)
        tl.store(base[:, None] + 2 * j[None, :], (acc_even + shift[:, None]) / l[:, None], mask=rm[:, None])
        tl.store(base[:, None] + 2 * j[None, :] + 1, (acc_odd + shift[:, None]) / l[:, None], mask=rm[:, None])
        tl.store(base + D, (m + tl.log2(l)) * LN2, mask=rm)


def decode_grouped(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation=None, scale=None,
                   sinks=None, num_kv_splits=None, workspace=None, out=None, precision=None, keys="gather",
                   pv_split=True, block_n=None, num_warps=4, num_stages=2):
    """Like ``tq_decode_split.decode_split`` (same arguments and result) for SoA
    ``turboquant_4bit_nc`` caches; ``precision`` "exact" or "bf16" (default: bf16 on a GPU, exact
    in the interpreter, whose bf16 arithmetic is broken); ``keys`` one of ``KEY_METHODS`` (the
    pair table of ``"pair"`` is built on the first call per head size and format, then reused)."""
    from reference.turboquant.presets import preset as lookup

    if lookup(preset).name not in PRESETS or layout != "soa":
        raise ValueError(f"preset/layout must be one of {PRESETS} with layout 'soa', got {preset!r}/{layout!r}")
    precision = precision or ("exact" if interpreting() else "bf16")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16" and interpreting():
        raise ValueError("precision 'bf16' is not available under TRITON_INTERPRET=1 (broken bf16 arithmetic)")
    if keys not in KEY_METHODS:
        raise ValueError(f"keys must be one of {KEY_METHODS}, got {keys!r}")
    block_n = block_n or 128
    a, S, ws, out = begin_split_decode(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                                       rotation=rotation, scale=scale, sinks=sinks, num_kv_splits=num_kv_splits,
                                       workspace=workspace, out=out, block_n=block_n)
    spec, B, Hq = a.spec, a.B, a.Hq
    D = spec.head_size
    if keys == "pair":
        cent = pair_table(spec.preset, D, kv_cache.device, bf16=precision == "bf16")
    else:
        cent = centroid_table(spec.preset, D, kv_cache.device)
    _grouped_kernel[(B, spec.num_kv_heads, S)](
        ws.q_rot, kv_cache, block_table, seq_lens, cent, sinks if sinks is not None else ws.q_rot,
        ws.partials, kv_cache.stride(0), block_table.stride(0), a.scale,
        D=D, HK=spec.num_kv_heads, BS=spec.block_size, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes,
        HQ=Hq, G=a.G, S=S, MAXS=ws.max_splits, HAS_SINKS=sinks is not None,
        BLOCK_M=max(16, triton.next_power_of_2(a.G)), BLOCK_N=block_n, KEYS=keys, TABLE=cent.numel(), PV_SPLIT=pv_split,
        BF16=precision == "bf16", num_warps=num_warps, num_stages=num_stages)
    reduce_partials(ws, seq_lens, out, S)
    return out
