"""Grouped-query TurboQuant decode for the SoA layout and 4-bit MSE keys and values
(``turboquant_4bit_nc``): every query head of a kv head in one program, MMA on the dequantized tiles.

One program per (sequence, kv head, split) walks its tokens in tiles of ``BLOCK_N`` and holds all
G query heads of the kv head as the columns of the matrix-unit products, in the transposed
orientation, so the dequantized tiles are the tall operand (on Hopper the register A operand of
wgmma, the small query/probability tile the shared-memory B operand):

- codes are loaded as 32-bit words (``D/8`` per token for keys and for values) and taken apart
  with word-wide shifts and masks, not one byte per tensor element.
- scores ``S^T [BLOCK_N, 2*GP] = K [BLOCK_N, D] @ Q^T [D, 2*GP]``, ``GP = max(8, next_pow2(G))``;
  the query columns appear twice (column ``c`` holds query ``c % GP``). ``K = c[code] * k_scalar``
  with ``k_scalar`` applied to the scores. Key lookup (``KEYS``): ``"pair"`` is the FLUTE idea,
  one ``tl.gather`` per key byte from a 256-entry table whose entry packs both dequantized codes
  of the byte (``tq_decode_launch.pair_table``); ``"gather"`` looks up each nibble in the
  16-entry centroid table (warp shuffles on sm_90, see ``_lookup``). Either way the two values of
  a byte are the adjacent dimensions ``2j, 2j+1`` of the operand (one 32-bit register of two
  16-bit values), so no query permutation is needed.
- values are uniform codes: ``P @ (code * s + z) = (P * s) @ code + (P @ z)``: the value operand
  is the raw codes (bf16 ``128 + code``, two per ``(word & 0x000F000F) | 0x43004300``, in a
  dimension order undone once after the loop; the ``128 * sum(P * s)`` this adds is subtracted at
  the end; fp16: the codes converted, no offset) and
  ``P @ z`` and ``sum(P * s)`` are running sums. ``P * s`` enters the MMA as 16-bit ``hi`` in columns ``< GP``
  and its remainder ``lo`` in columns ``>= GP`` (the duplicated query columns), so the split costs no extra
  MMA; the two halves of the output columns are added at the end.
- splits start on a tile boundary (``split_range`` with ``ALIGN = BLOCK_N``) and a tile never
  straddles a cache block unless it covers whole blocks (``BLOCK_N % BS == 0`` or
  ``BS % BLOCK_N == 0``), so a tile's fp16 metadata (k_scalar, v_scale, v_zero) is read as one
  ``[blocks, 4 * rows]`` tile per cache block, which the compiler pipelines like the codes.
Softmax in base 2 (``log2 e`` folded into the per-token factor); the statistics ``l``,
``sum p z`` and ``sum p s`` are kept per (token row, column) and reduced once after the loop. Sinks: split 0
starts at ``m = sink``. Partials: ``[D + 1]`` fp32 as in ``tq_decode_launch``.

MMA operands (``MMA``, from the launcher's ``precision`` and the query dtype, ``tq_decode_launch.mma_operands``):
``"ieee"`` (fp32 operands, ``input_precision="ieee"``, ``P * s`` whole in the first GP columns; the
interpreter's path, precision "exact" or a float32 query) or the query's 16-bit dtype, ``"bf16"`` or
``"fp16"`` (centroids and rotated queries in that dtype, ``P * s`` as hi + lo, exact codes; fp32
accumulation; bf16: the ``128 * sum(P * s)`` removed is the fp32 sum, which differs from the MMA's
``hi + lo`` by ~2^-17 relative) -- the family's ``act-mma`` model.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.tq_cache import head_size_problem
from optimized.triton.tq_common import kv_pointers, split_range, to_mma
from optimized.triton.tq_decode_launch import (begin_split_decode, centroid_table, mma_operands, pair_table,
                                               reduce_partials)
from reference.turboquant.presets import preset as lookup

PRESETS = ("turboquant_4bit_nc",)
KEY_METHODS = ("gather", "pair")
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _halves(x, MMA: tl.constexpr):
    """Packed pairs ``x [...]`` as ``[..., 2]`` (low half first): int32 of two bf16 (or fp16) bit
    patterns -> bf16 (fp16), or (``"ieee"``) int64 of two fp32 bit patterns -> fp32."""
    if MMA == "bf16":
        h = tl.join(x.to(tl.int16), (x >> 16).to(tl.int16)).to(tl.bfloat16, bitcast=True)
    elif MMA == "fp16":
        h = tl.join(x.to(tl.int16), (x >> 16).to(tl.int16)).to(tl.float16, bitcast=True)
    else:
        h = tl.join(x.to(tl.int32), (x >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
    return h


@triton.jit
def _f32_bits(x):
    """fp32 ``x`` as its bit pattern, zero-extended to int64."""
    return x.to(tl.int32, bitcast=True).to(tl.uint32, bitcast=True).to(tl.int64)


@triton.jit
def _lookup(table, index, BLOCK_N: tl.constexpr, KW: tl.constexpr):
    """``table[index]`` for ``index [BLOCK_N, KW]``. A table of at most 32 entries (the centroids) is
    gathered along axis 1 of its broadcast, which sm_90 does with warp shuffles (H200, L=8192: decode
    step 0.291 ms instead of 0.306; the flat gather stores the table to shared memory and adds two
    barriers per lookup). The 256-entry pair table is one flat gather (a shared-memory load per
    element; as shuffles it would take ~8 per element)."""
    if table.shape[0] <= 32:
        out = tl.gather(tl.broadcast_to(table[None, :], (BLOCK_N, table.shape[0])), index, 1)
    else:
        out = tl.reshape(tl.gather(table, tl.reshape(index, (BLOCK_N * KW,)), 0), (BLOCK_N, KW))
    return out


@triton.jit
def _byte_pair(kw, b: tl.constexpr, table, KEYS: tl.constexpr, MMA: tl.constexpr, BLOCK_N: tl.constexpr,
               KW: tl.constexpr):
    """The dequantized codes of byte ``b`` of each key word ``kw [BLOCK_N, KW]`` (int32), packed
    (low nibble's value in the low half): int32 of two 16-bit values or, ``"ieee"``, int64 of two fp32.
    ``table``: the pair table (``KEYS="pair"``, already packed) or the 16 centroids (16-bit bits in
    int32, or fp32)."""
    byte = (kw >> (8 * b)) & 255
    if KEYS == "pair":
        e = _lookup(table, byte, BLOCK_N, KW)
    else:
        lo = _lookup(table, byte & 15, BLOCK_N, KW)
        hi = _lookup(table, byte >> 4, BLOCK_N, KW)
        if MMA == "ieee":
            e = _f32_bits(lo) | (_f32_bits(hi) << 32)
        else:
            e = lo | (hi << 16)
    return e


@triton.jit
def _key_operand(kw, table, KEYS: tl.constexpr, MMA: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Dequantized keys ``[BLOCK_N, D]`` in dimension order from key words ``kw [BLOCK_N, D/8]``:
    byte ``b`` of word ``w`` holds dimensions ``8w + 2b`` (low nibble) and ``8w + 2b + 1``. In the
    MMA operand dtype (bf16, fp16, or fp32 for ``"ieee"``)."""
    KW: tl.constexpr = D // 8
    e0 = _byte_pair(kw, 0, table, KEYS, MMA, BLOCK_N, KW)
    e1 = _byte_pair(kw, 1, table, KEYS, MMA, BLOCK_N, KW)
    e2 = _byte_pair(kw, 2, table, KEYS, MMA, BLOCK_N, KW)
    e3 = _byte_pair(kw, 3, table, KEYS, MMA, BLOCK_N, KW)
    e = tl.join(tl.join(e0, e2), tl.join(e1, e3))  # [BLOCK_N, KW, 2, 2]: (w, i, o) holds byte 2i + o
    return tl.reshape(_halves(e, MMA), (BLOCK_N, D))


@triton.jit
def _value_operand(vw, MMA: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """Value codes ``[BLOCK_N, D]`` from value words ``vw [BLOCK_N, D/8]`` (int32), four masks per
    word, each yielding two codes: ``(vw >> 4s) & 0x000F000F`` holds dimensions ``8w + s`` and
    ``8w + 4 + s``. Position ``8w + 4i + 2o + h`` holds dimension ``8w + 4h + 2o + i`` (undone by
    ``_dimension_rows``). bf16 ``128 + code`` built from bits (no int-to-float conversion); fp16 or
    (``"ieee"``) fp32 ``code`` converted."""
    r = tl.join(tl.join(vw & 0x000F000F, (vw >> 4) & 0x000F000F),
                tl.join((vw >> 8) & 0x000F000F, (vw >> 12) & 0x000F000F))  # (w, i, o) holds s = i + 2o
    if MMA == "bf16":
        v = _halves(r | 0x43004300, MMA)
    elif MMA == "fp16":
        v = tl.join((r & 0xFFFF).to(tl.float16), (r >> 16).to(tl.float16))
    else:
        v = tl.join((r & 0xFFFF).to(tl.float32), (r >> 16).to(tl.float32))
    return tl.reshape(v, (BLOCK_N, D))


@triton.jit
def _dimension_rows(acc, D: tl.constexpr, BM: tl.constexpr):
    """``acc [D, BM]`` with rows in ``_value_operand``'s position order, rows put in dimension order."""
    return tl.reshape(tl.permute(tl.reshape(acc, (D // 8, 2, 2, 2, BM)), (0, 3, 2, 1, 4)), (D, BM))


@triton.jit
def _first_half(x, GP: tl.constexpr):
    """``x[:GP]`` of a ``[2 * GP]`` vector."""
    a, _ = tl.split(tl.reshape(tl.permute(tl.reshape(x, (2, GP)), (1, 0)), (GP, 2)))
    return a


@triton.jit
def _grouped_kernel(q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, table_ptr, sinks_ptr, part_ptr,
                    stride_blk, stride_bt, scale,
                    D: tl.constexpr, HK: tl.constexpr, BS: tl.constexpr, KEY_BYTES: tl.constexpr,
                    VAL_BYTES: tl.constexpr, HQ: tl.constexpr, G: tl.constexpr, S: tl.constexpr,
                    MAXS: tl.constexpr, HAS_SINKS: tl.constexpr, GP: tl.constexpr, BLOCK_N: tl.constexpr,
                    KEYS: tl.constexpr, TABLE: tl.constexpr, MMA: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    start, end = split_range(seq_lens_ptr, b, s, S, BLOCK_N)
    if start < end:
        BM: tl.constexpr = 2 * GP
        OFFSET: tl.constexpr = 128.0 if MMA == "bf16" else 0.0  # the value operand holds offset + code
        NB: tl.constexpr = BLOCK_N // BS if BLOCK_N > BS else 1  # cache blocks per tile
        RB: tl.constexpr = BLOCK_N // NB  # tile rows per cache block
        c = tl.arange(0, BM)
        gm = (c % GP) < G
        hq = h * G + c % GP
        d = tl.arange(0, D)
        w = tl.arange(0, D // 8)
        qt = to_mma(tl.load(q_ptr + (b.to(tl.int64) * HQ + hq)[None, :] * D + d[:, None], mask=gm[None, :],
                             other=0.0), MMA)
        table = tl.load(table_ptr + tl.arange(0, TABLE))
        qk_scale = scale * LOG2E
        m = tl.full((BM,), float("-inf"), tl.float32)
        l0 = tl.zeros((BM,), tl.float32)
        if HAS_SINKS:
            if s == 0:
                m = tl.load(sinks_ptr + hq, mask=gm, other=float("-inf")) * LOG2E
                l0 = tl.where(gm, 1.0, 0.0)
        acc = tl.zeros((D, BM), tl.float32)  # rows in _value_operand's position order
        l_t = tl.zeros((BLOCK_N, BM), tl.float32)  # sum p, per token row
        z_t = tl.zeros((BLOCK_N, BM), tl.float32)  # sum p * v_zero
        s_t = tl.zeros((BLOCK_N, BM), tl.float32)  # sum p * v_scale (the offset of the value codes)
        row = bt_ptr + b.to(tl.int64) * stride_bt
        f = tl.arange(0, 4 * RB)  # metadata tile column: field f // RB (k_scalar, v_scale, v_zero, unused)
        for t0 in range(start, end, BLOCK_N):
            t = t0 + tl.arange(0, BLOCK_N)
            live = t < end
            blk = tl.load(row + t // BS, mask=live, other=0)
            key, val, _kn, _vs, _vz = kv_pointers(cache_ptr, blk, t % BS, h, stride_blk, 0, 0, True, False,
                                                  HK, BS, KEY_BYTES, VAL_BYTES)
            kw = tl.load(key.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=live[:, None], other=0)
            vw = tl.load(val.to(tl.pointer_type(tl.int32))[:, None] + w[None, :], mask=live[:, None], other=0)
            nb = t0 // BS + tl.arange(0, NB)
            mblk = tl.load(row + nb, mask=nb * BS < end, other=0)
            if NB > 1:  # whole blocks: a tile row is one block's [3, BS] metadata, contiguous
                mpos = 0
                moff = f
            else:  # RB rows from position t0 % BS of one block: k_scalar, then v_scale BS and v_zero 2 BS on
                mpos = t0 % BS
                moff = (f // RB) * BS + f % RB
            _k, _v, meta, _s, _z = kv_pointers(cache_ptr, mblk, mpos, h, stride_blk, 0, 0, True, False,
                                               HK, BS, KEY_BYTES, VAL_BYTES)
            mt = tl.load(meta[:, None] + moff[None, :], mask=(f < 3 * RB)[None, :] & (nb * BS < end)[:, None], other=0.0)
            mt = tl.reshape(tl.permute(tl.reshape(mt, (NB, 4, RB)), (0, 2, 1)), (BLOCK_N, 2, 2)).to(tl.float32)
            kz, vx = tl.split(mt)  # fields (0, 2) and (1, 3)
            kn, vz = tl.split(kz)
            vs, _ = tl.split(vx)
            vs = tl.where(live, vs, 0.0)  # rows past the end read the block's other tokens: never NaN
            vz = tl.where(live, vz, 0.0)
            k = _key_operand(kw, table, KEYS, MMA, BLOCK_N, D)
            if MMA == "ieee":
                x = tl.dot(k, qt, input_precision="ieee")
            else:
                x = tl.dot(k, qt)
            x = tl.where(live[:, None], x * (kn * qk_scale)[:, None], float("-inf"))
            m_new = tl.maximum(m, tl.max(x, axis=0))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(x - m_new[None, :])
            ps = p * vs[:, None]
            l0 *= alpha
            l_t = l_t * alpha[None, :] + p
            z_t = z_t * alpha[None, :] + p * vz[:, None]
            s_t = s_t * alpha[None, :] + ps
            vt = tl.trans(_value_operand(vw, MMA, BLOCK_N, D))
            if MMA == "ieee":
                p2 = tl.where((c < GP)[None, :], ps, 0.0)
                acc = tl.dot(vt, p2, acc * alpha[None, :], input_precision="ieee")
            else:
                ps_hi = to_mma(ps, MMA)
                p2 = tl.where((c < GP)[None, :], ps_hi, to_mma(ps - ps_hi.to(tl.float32), MMA))
                acc = tl.dot(vt, p2, acc * alpha[None, :])
            m = m_new
        # columns c and c + GP hold the same query: fold the lo half of P * s onto the hi half
        out = tl.sum(tl.reshape(_dimension_rows(acc, D, BM), (D, 2, GP)), axis=1)
        l = _first_half(l0 + tl.sum(l_t, axis=0), GP)
        shift = _first_half(tl.sum(z_t, axis=0) - OFFSET * tl.sum(s_t, axis=0), GP)
        mq = _first_half(m, GP)
        g = tl.arange(0, GP)
        gq = g < G
        base = part_ptr + ((b.to(tl.int64) * HQ + h * G + g) * MAXS + s) * (D + 1)
        tl.store(base[None, :] + d[:, None], (out + shift[None, :]) / l[None, :], mask=gq[None, :])
        tl.store(base + D, (mq + tl.log2(l)) * LN2, mask=gq)


def _power_of_two(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 1 and n & (n - 1) == 0


def tile_for(block_size: int, block_n: int) -> int:
    """The tile actually used: ``block_n`` if it and the cache block size nest (one divides the
    other), else the largest power of two >= 16 dividing ``block_size``; ValueError naming
    ``kv_cache`` when there is none (a block size that is not a multiple of 16)."""
    if block_n % block_size == 0 or block_size % block_n == 0:
        return block_n
    tile = block_size & -block_size  # largest power of two dividing block_size
    if tile < 16:
        raise ValueError(f"kv_cache block size must be a power of two or a multiple of 16 for decode_grouped, "
                         f"got {block_size}")
    return min(tile, block_n)


def grouped_stage1(a, S: int, ws, kv_cache, block_table, seq_lens, *, mma: str, keys: str, block_n: int,
                   num_warps: int = 4, num_stages: int = 3) -> None:
    """The grouped kernel alone (split-KV stage 1): partials of ``S`` splits into ``ws.partials`` from
    the rotated queries in ``ws.q_rot``, for arguments already checked (``a`` from
    ``check_decode_args``, ``block_n`` a tile ``tile_for`` accepts, ``mma`` one of ``MMA_OPERANDS``).
    ``decode_grouped`` is the checked
    entry point; this is the launch it shares with measurement scripts that time the kernel alone."""
    spec = a.spec
    D = spec.head_size
    table = (pair_table(spec.preset, D, kv_cache.device, mma) if keys == "pair"
             else centroid_table(spec.preset, D, kv_cache.device, mma))
    _grouped_kernel[(a.B, spec.num_kv_heads, S)](
        ws.q_rot, kv_cache, block_table, seq_lens, table, a.sinks if a.sinks is not None else ws.q_rot,
        ws.partials, kv_cache.stride(0), block_table.stride(0), a.scale,
        D=D, HK=spec.num_kv_heads, BS=spec.block_size, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes,
        HQ=a.Hq, G=a.G, S=S, MAXS=ws.max_splits, HAS_SINKS=a.sinks is not None,
        GP=max(8, triton.next_power_of_2(a.G)), BLOCK_N=block_n, KEYS=keys, TABLE=table.numel(), MMA=mma,
        num_warps=num_warps, num_stages=num_stages)


def decode_grouped(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation=None, scale=None,
                   sinks=None, num_kv_splits=None, workspace=None, out=None, precision=None, keys="gather",
                   block_n=None, num_warps=4, num_stages=3):
    """Like ``tq_decode_split.decode_split`` (same arguments and result) for SoA
    ``turboquant_4bit_nc`` caches; ``precision`` one of ``PRECISIONS``, "exact" (fp32 operands) or "act"
    (MMA operands in the query's dtype: bf16, fp16, or fp32 for a float32 query; default: "act" on a GPU,
    "exact" in the interpreter, whose 16-bit arithmetic is broken); ``keys`` one of ``KEY_METHODS`` (the
    tables are built on the first call per head size and format, then reused); ``block_n`` a power
    of two >= 16 (default 128)."""
    if lookup(preset).name not in PRESETS or layout != "soa":
        raise ValueError(f"preset/layout must be one of {PRESETS} with layout 'soa', got {preset!r}/{layout!r}")
    mma = mma_operands(precision, query)
    if keys not in KEY_METHODS:
        raise ValueError(f"keys must be one of {KEY_METHODS}, got {keys!r}")
    block_n = 128 if block_n is None else block_n
    if not _power_of_two(block_n) or block_n < 16:
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n!r}")
    if not _power_of_two(num_warps) or num_warps > 32:
        raise ValueError(f"num_warps must be a power of two in [1, 32], got {num_warps!r}")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or not 1 <= num_stages <= 8:
        raise ValueError(f"num_stages must be an integer in [1, 8], got {num_stages!r}")
    if getattr(kv_cache, "dim", lambda: 0)() == 4:
        block_n = tile_for(kv_cache.shape[1], block_n)
        if kv_cache.data_ptr() % 4 or kv_cache.stride(0) % 4:
            raise ValueError("kv_cache: decode_grouped loads the codes as 32-bit words, so the cache start and "
                             f"block stride must be multiples of 4 bytes, got start % 4 = {kv_cache.data_ptr() % 4} "
                             f"and stride(0) = {kv_cache.stride(0)}")
    a, S, ws, out = begin_split_decode(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                                       rotation=rotation, scale=scale, sinks=sinks, num_kv_splits=num_kv_splits,
                                       workspace=workspace, out=out, block_n=block_n)
    grouped_stage1(a, S, ws, kv_cache, a.block_table, a.seq_lens, mma=mma, keys=keys,
                   block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    reduce_partials(ws, a.seq_lens, out, S, align=block_n)
    return out


def problem(*, preset: str, layout: str, D: int, block_size: int | None = None, G: int | None = None,
            sinks: bool = False, act: str | None = None, device=None) -> str | None:
    """Why this kernel cannot serve a request (None if it can): the cache's preset, layout, head size
    ``D`` and block size, query heads per kv head ``G``, whether there are sinks, the activation
    dtype ``act`` (a name) and, when given, the torch ``device`` it would run on."""
    why = head_size_problem(D)
    if why is None and (lookup(preset).name not in PRESETS or layout != "soa"):
        why = f"the grouped decode reads {'/'.join(PRESETS)} caches in the SoA layout, got {preset}/{layout}"
    return why


ENTRY_POINTS = {"decode": decode_grouped}


def compile_specs():
    """The grouped decode with gathered and paired keys, bf16 and fp16 MMA operands (``compile_check``)."""
    from optimized.triton.compile_check import BS, D, G, HK, HQ, CompileSpec, cache_spec

    spec = cache_spec("turboquant_4bit_nc", "soa")
    return [CompileSpec(f"grouped decode keys={keys} mma={mma}", _grouped_kernel, dict(
        q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", seq_lens_ptr="*i32", table_ptr="*i32",
        sinks_ptr="*fp32", part_ptr="*fp32", stride_blk="i32", stride_bt="i32", scale="fp32"),
        dict(D=D, HK=HK, BS=BS, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes, HQ=HQ, G=G, S=4, MAXS=32,
             HAS_SINKS=True, GP=G, BLOCK_N=128, KEYS=keys, TABLE=256 if keys == "pair" else 16, MMA=mma))
        for keys, mma in (("gather", "bf16"), ("pair", "bf16"), ("gather", "fp16"))]
