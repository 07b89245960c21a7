"""Split-KV TurboQuant decode, one program per (sequence, query head, split), then a reduce over
the splits: AoS and SoA, every preset, sinks, any integer G = Hq / Hk.

Rounding model "exact": fp32 throughout (keys dequantized as in ``tq_common.load_key_tile``,
scores ``scale * <q_rot, k>``, online softmax with ``exp``), products summed elementwise (no MMA),
so the result equals the NumPy reference up to fp32 summation order.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.tq_common import kv_pointers, load_key_tile, load_value_tile, split_range
from optimized.triton.tq_cache import head_size_problem
from optimized.triton.tq_decode_launch import begin_split_decode, centroid_table, interpreting, reduce_partials


@triton.jit
def _split_kernel(q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, cent_ptr, sinks_ptr, part_ptr,
                  stride_blk, stride_pos, stride_head, stride_bt, scale,
                  SOA: tl.constexpr, KEY_FP8: tl.constexpr, KEY_BITS: tl.constexpr, VAL_BITS: tl.constexpr,
                  D: tl.constexpr, HK: tl.constexpr, BS: tl.constexpr,
                  KEY_BYTES: tl.constexpr, VAL_BYTES: tl.constexpr,
                  HQ: tl.constexpr, G: tl.constexpr, S: tl.constexpr, MAXS: tl.constexpr,
                  NORM_AT_DECODE: tl.constexpr, HAS_SINKS: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0)
    hq = tl.program_id(1)
    s = tl.program_id(2)
    h = hq // G
    start, end = split_range(seq_lens_ptr, b, s, S, 1)
    if start < end:
        d = tl.arange(0, D)
        q = tl.load(q_ptr + (b.to(tl.int64) * HQ + hq) * D + d)
        m = tl.full((), float("-inf"), tl.float32)
        l = tl.zeros((), tl.float32)
        if HAS_SINKS:
            if s == 0:
                m = tl.load(sinks_ptr + hq)
                l = tl.full((), 1.0, tl.float32)
        acc = tl.zeros((D,), tl.float32)
        for t0 in range(start, end, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            live = t < end
            blk = tl.load(bt_ptr + b.to(tl.int64) * stride_bt + t // BS, mask=live, other=0)
            key, val, knorm, vscale, vzero = kv_pointers(cache_ptr, blk, t % BS, h, stride_blk, stride_pos,
                                                         stride_head, SOA, KEY_FP8, HK, BS, KEY_BYTES, VAL_BYTES)
            k = load_key_tile(key, knorm, cent_ptr, d, live, KEY_FP8, KEY_BITS, KEY_BYTES, NORM_AT_DECODE)
            x = tl.sum(q[None, :] * k, axis=1) * scale
            x = tl.where(live, x, float("-inf"))
            m_new = tl.maximum(m, tl.max(x, axis=0))
            alpha = tl.exp(m - m_new)
            p = tl.exp(x - m_new)
            v = load_value_tile(val, vscale, vzero, d, live, VAL_BITS, VAL_BYTES)
            l = l * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
            m = m_new
        base = part_ptr + ((b.to(tl.int64) * HQ + hq) * MAXS + s) * (D + 1)
        tl.store(base + d, acc / l)
        tl.store(base + D, m + tl.log(l))


def decode_split(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation=None, scale=None,
                 sinks=None, num_kv_splits=None, workspace=None, out=None):
    """Decode attention ``[B, Hq, D]`` (written into ``out``, default a new tensor of the query
    dtype) of ``query [B, Hq, D]`` over ``kv_cache`` through ``block_table [B, M]`` int32 and
    ``seq_lens [B]`` int32; ``rotation`` fp32 ``[D, D]`` for MSE presets; ``sinks`` fp32 ``[Hq]``;
    ``workspace`` a ``DecodeWorkspace`` (reused: no allocation per call) or None."""
    block_n = 64 if interpreting() else 32
    a, S, ws, out = begin_split_decode(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                                       rotation=rotation, scale=scale, sinks=sinks, num_kv_splits=num_kv_splits,
                                       workspace=workspace, out=out, block_n=block_n)
    spec, B, Hq = a.spec, a.B, a.Hq
    D = spec.head_size
    p = spec.preset
    cent = centroid_table(p, D, kv_cache.device)
    _split_kernel[(B, Hq, S)](
        ws.q_rot, kv_cache, a.block_table, a.seq_lens, cent, sinks if sinks is not None else ws.q_rot, ws.partials,
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), a.block_table.stride(0), a.scale,
        HQ=Hq, G=a.G, S=S, MAXS=ws.max_splits, NORM_AT_DECODE=(not spec.soa) and p.norm_correction,
        HAS_SINKS=sinks is not None, BLOCK_N=block_n, num_warps=4, **spec.constexprs())
    reduce_partials(ws, a.seq_lens, out, S)
    return out


def problem(*, preset: str, layout: str, D: int, block_size: int | None = None, G: int | None = None,
            sinks: bool = False, act: str | None = None, device=None) -> str | None:
    """Why this kernel cannot serve a request (None if it can): the cache's preset, layout, head size
    ``D`` and block size, query heads per kv head ``G``, whether there are sinks, the activation
    dtype ``act`` (a name) and, when given, the torch ``device`` it would run on."""
    return head_size_problem(D)


ENTRY_POINTS = {"decode": decode_split}


def compile_specs():
    """The split decode for each preset (``compile_check``), and the kernels of ``tq_decode_launch`` every
    split-KV decode launches (value checks, query rotation, the reduce)."""
    from optimized.triton import tq_decode_launch as launch
    from optimized.triton.compile_check import BS, D, G, HQ, CompileSpec, cache_spec

    out = []
    for preset, layout in (("turboquant_4bit_nc", "soa"), ("turboquant_k3v4_nc", "aos"),
                           ("turboquant_3bit_nc", "soa"), ("turboquant_k8v4", "aos")):
        spec = cache_spec(preset, layout)
        out.append(CompileSpec(f"split decode {preset}/{layout}", _split_kernel, dict(
            q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", seq_lens_ptr="*i32", cent_ptr="*fp32",
            sinks_ptr="*fp32", part_ptr="*fp32", stride_blk="i32", stride_pos="i32", stride_head="i32",
            stride_bt="i32", scale="fp32"),
            dict(HQ=HQ, G=G, S=4, MAXS=32, NORM_AT_DECODE=(not spec.soa) and spec.preset.norm_correction,
                 HAS_SINKS=True, BLOCK_N=32, **spec.constexprs())))
    out.append(CompileSpec("validate", launch._validate_kernel, dict(
        q_ptr="*bf16", bt_ptr="*i32", seq_lens_ptr="*i32", sinks_ptr="*fp32", flags_ptr="*i32", stride_bt="i32",
        num_blocks="i32"), dict(ROWS_PER_SEQ=1, M=512, BS=BS, HQD=HQ * D, HQ=HQ, HAS_SINKS=True, CHUNK=256)))
    out.append(CompileSpec("rotate", launch._rotate_kernel, dict(
        q_ptr="*bf16", r_ptr="*fp32", out_ptr="*fp32", sq_b="i32", sq_h="i32", ROWS="i32"),
        dict(HQ=HQ, D=D, ROTATE=True, BLOCK_R=launch.ROTATE_ROWS, CHUNK=launch.ROTATE_CHUNK)))
    out.append(CompileSpec("reduce", launch._reduce_kernel, dict(
        part_ptr="*fp32", seq_lens_ptr="*i32", out_ptr="*bf16", so_b="i32", so_h="i32"),
        dict(HQ=HQ, D=D, S=4, MAXS=32, S_P2=4, ALIGN=128)))
    return out
