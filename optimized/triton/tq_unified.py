"""Unified TurboQuant attention on the SoA layout: prefill chunks and
decode tokens of many sequences in one launch, causal, paged, GQA, optional sinks, every preset.

Queries are packed tokens ``query [T, Hq, D]``; sequence b owns rows
``query_start_loc[b] : query_start_loc[b + 1]`` (its last ``q_len_b`` tokens) and attends to
``seq_lens[b]`` cached tokens (the new ones included, stored before attention). Key position j is
visible to query row i of the sequence iff ``j <= seq_len - q_len + i``. One program per
(sequence, block of BLOCK_Q query tokens, kv head); its ``BLOCK_M`` rows are the BLOCK_Q tokens x
G query heads of the kv head, so QK^T and PV run on the matrix units. No split over the keys.

MMA operands as ``tq_decode_grouped`` (``tq_decode_launch.mma_operands``): ``"ieee"`` (fp32 operands, IEEE
dot; precision "exact" or a float32 query) or the query's 16-bit dtype (q_rot, dequantized K and V and P
rounded to bf16 or fp16, fp32 accumulation); output in ``out``'s dtype.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.checks import (FLOAT_DTYPES, capturing, check_finite, check_output, check_positive,
                                     check_tensor, index_tensor)
from optimized.triton.tq_cache import head_size_problem
from optimized.triton.tq_common import kv_pointers, load_key_tile, load_value_tile, to_mma
from optimized.triton.tq_decode_launch import (centroid_table, check_decode_args, interpreting, mma_operands,
                                               rotate_queries, validate_values)


@triton.jit
def _mma(a, b, MMA: tl.constexpr):
    """``a @ b`` with fp32 accumulation: operands in ``MMA``'s 16-bit dtype, or fp32 in IEEE precision."""
    if MMA == "ieee":
        r = tl.dot(a, b, input_precision="ieee")
    else:
        r = tl.dot(to_mma(a, MMA), to_mma(b, MMA))
    return r


@triton.jit
def _unified_kernel(q_ptr, cache_ptr, bt_ptr, qsl_ptr, seq_lens_ptr, cent_ptr, sinks_ptr, out_ptr,
                    stride_blk, stride_bt, so_t, so_h, scale,
                    SOA: tl.constexpr, KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, VAL_BITS: tl.constexpr,
                    D: tl.constexpr, HK: tl.constexpr, BS: tl.constexpr,
                    KEY_BYTES: tl.constexpr, VAL_BYTES: tl.constexpr,
                    HQ: tl.constexpr, G: tl.constexpr, HAS_SINKS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, MMA: tl.constexpr):
    b = tl.program_id(0)
    qb = tl.program_id(1)
    h = tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if qb * BLOCK_Q < q_len:
        L = tl.load(seq_lens_ptr + b)
        ctx = L - q_len
        r = tl.arange(0, BLOCK_M)
        qi = qb * BLOCK_Q + r // G
        rm = (r < BLOCK_Q * G) & (qi < q_len)
        hq = h * G + r % G
        tok = (q_start + qi).to(tl.int64)
        d = tl.arange(0, D)
        q = tl.load(q_ptr + (tok * HQ + hq)[:, None] * D + d[None, :], mask=rm[:, None], other=0.0)
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l = tl.zeros((BLOCK_M,), tl.float32)
        if HAS_SINKS:
            m = tl.load(sinks_ptr + hq, mask=rm, other=float("-inf"))
            l = tl.where(rm, 1.0, 0.0)
        acc = tl.zeros((BLOCK_M, D), tl.float32)
        kv_end = tl.minimum(L, ctx + tl.minimum(qb * BLOCK_Q + BLOCK_Q, q_len))
        for t0 in range(0, kv_end, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            live = t < kv_end
            blk = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + t // BS, mask=live, other=0)
            key, val, knorm, vscale, vzero = kv_pointers(cache_ptr, blk, t % BS, h, stride_blk, 0, 0,
                                                         SOA, KEY_FP8, HK, BS, KEY_BYTES, VAL_BYTES)
            k = load_key_tile(key, knorm, cent_ptr, d, live, KEY_FP8, KEY_BITS, KEY_BYTES, False)
            x = _mma(q, tl.trans(k), MMA) * scale
            visible = live[None, :] & (t[None, :] <= (ctx + qi)[:, None])
            x = tl.where(visible, x, float("-inf"))
            m_new = tl.maximum(m, tl.max(x, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(x - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            v = load_value_tile(val, vscale, vzero, d, live, VAL_BITS, VAL_BYTES)
            acc = acc * alpha[:, None] + _mma(p, v, MMA)
            m = m_new
        o = acc / l[:, None]
        tl.store(out_ptr + tok[:, None] * so_t + hq[:, None] * so_h + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=rm[:, None])


def unified_attention(query, kv_cache, block_table, query_start_loc, seq_lens, max_query_len: int, *, preset,
                      layout="soa", rotation=None, scale=None, sinks=None, out=None, precision=None):
    """Causal paged attention of packed ``query [T, Hq, D]`` over an SoA cache; returns ``out``
    ``[T, Hq, D]`` (default: a new tensor of the query dtype). ``query_start_loc [B + 1]`` int32
    (0, nondecreasing, last = T), ``seq_lens [B]`` int32 with ``q_len_b <= seq_lens[b]``,
    ``max_query_len`` >= every q_len_b (sizes the grid without reading device memory). ``out`` is
    checked as strictly as the inputs (``checks.check_output``: rows contiguous, no self-overlap).
    ``precision`` as ``decode_grouped``'s ("exact", or "act": MMA operands in the query's dtype)."""
    import torch

    if layout != "soa":
        raise ValueError(f"layout must be 'soa' for unified attention, got {layout!r}")
    mma = mma_operands(precision, query)
    query_start_loc = index_tensor("query_start_loc", query_start_loc, getattr(kv_cache, "device", None))
    check_tensor("query_start_loc", query_start_loc, (None,), ("int32",))
    B = query_start_loc.shape[0] - 1
    check_positive("B (query_start_loc has B + 1 entries)", B)
    a = check_decode_args(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                          rotation=rotation, scale=scale, sinks=sinks, num_seqs=B)
    spec, T, Hq, block_table, seq_lens = a.spec, a.B, a.Hq, a.block_table, a.seq_lens
    D = spec.head_size
    check_tensor("query_start_loc", query_start_loc, (B + 1,), ("int32",), kv_cache.device, contiguous=True)
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int) or not 1 <= max_query_len <= T:
        raise ValueError(f"max_query_len must be an integer in [1, T={T}], got {max_query_len!r}")
    if not capturing(query_start_loc):
        qsl = query_start_loc.long()
        q_lens = qsl[1:] - qsl[:-1]
        if int(qsl[0]) != 0 or int(qsl[-1]) != T or bool((q_lens < 1).any()):
            raise ValueError(f"query_start_loc must start at 0, rise by >= 1 per sequence and end at T={T}")
        if bool((q_lens > seq_lens.long()).any()) or int(q_lens.max()) > max_query_len:
            raise ValueError("each q_len must be <= its seq_lens entry and <= max_query_len")
    check_finite("query", query)
    flags = torch.empty(B, 4, dtype=torch.int32, device=kv_cache.device)
    validate_values(query, block_table, seq_lens, sinks, kv_cache.shape[0], spec.block_size, flags, rows_per_seq=0)
    if out is None:
        out = torch.empty(T, Hq, D, dtype=query.dtype, device=kv_cache.device)
    check_output("out", out, (T, Hq, D), FLOAT_DTYPES, kv_cache.device)
    q_rot = torch.empty(T, Hq, D, dtype=torch.float32, device=kv_cache.device)
    rotate_queries(query, rotation, q_rot, rotate=not spec.preset.key_fp8)
    block_m = 16 if interpreting() else (16 if max_query_len == 1 else 64)
    block_m = max(block_m, triton.next_power_of_2(a.G))
    block_q = block_m // a.G
    _unified_kernel[(B, triton.cdiv(max_query_len, block_q), spec.num_kv_heads)](
        q_rot, kv_cache, block_table, query_start_loc, seq_lens, centroid_table(spec.preset, D, kv_cache.device),
        sinks if sinks is not None else q_rot, out, kv_cache.stride(0), block_table.stride(0),
        out.stride(0), out.stride(1), a.scale,
        HQ=Hq, G=a.G, HAS_SINKS=sinks is not None, BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_N=64 if interpreting() else 32, MMA=mma, num_warps=4, **spec.constexprs())
    return out


def problem(*, preset: str, layout: str, D: int, block_size: int | None = None, G: int | None = None,
            sinks: bool = False, act: str | None = None, device=None) -> str | None:
    """Why this kernel cannot serve a request (None if it can); the arguments as ``tq_decode_split.problem``."""
    why = head_size_problem(D)
    if why is None and layout != "soa":
        why = f"unified attention reads the SoA layout only, got {layout}"
    return why


ENTRY_POINTS = {"unified_attention": unified_attention}


def compile_specs():
    """Unified attention with bf16 and fp16 MMA operands (``compile_check``)."""
    from optimized.triton.compile_check import G, HQ, CompileSpec, cache_spec

    spec = cache_spec("turboquant_4bit_nc", "soa")
    return [CompileSpec(f"unified attention mma={mma}", _unified_kernel, dict(
        q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", qsl_ptr="*i32", seq_lens_ptr="*i32", cent_ptr="*fp32",
        sinks_ptr="*fp32", out_ptr=out_type, stride_blk="i32", stride_bt="i32", so_t="i32", so_h="i32",
        scale="fp32"),
        dict(HQ=HQ, G=G, HAS_SINKS=True, BLOCK_M=64, BLOCK_Q=64 // G, BLOCK_N=32, MMA=mma, **spec.constexprs()))
        for mma, out_type in (("bf16", "*bf16"), ("fp16", "*fp16"))]
