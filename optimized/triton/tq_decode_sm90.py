"""TurboQuant decode for NVIDIA sm_90 whose dequantized key and value operands are built in registers,
in the register layouts of the ``mma.sync.m16n8k16`` operands: no shared-memory round trip for them.
SoA ``turboquant_4bit_nc`` caches, head size ``D`` in (64, 128, 256), any ``G`` (programs of up to 8
query heads each), cache block size 8 or a multiple of 16.

Written in Gluon (``triton.experimental.gluon``: explicit layouts), NVIDIA-only by design (inline PTX).
One warp per program; a program is one (sequence, kv head, group of <= 8 query heads, split) and walks
its tokens in tiles of ``BLOCK_N``, loading the next tile's code words while it computes the current one.

- scores ``S [16, BLOCK_N] = Q [16, D] @ K^T [D, BLOCK_N]`` (rows >= 8 of ``Q`` are 0). The key operand's
  contraction index is a permutation of the head dimensions (the queries are loaded in the same order):
  lane ``4g + t`` owns token ``g`` (mod 8) and key words ``[D/32 t, D/32 (t + 1))``, one vector load; a
  byte's two nibbles are the operand's adjacent pair. The 16-entry centroid lookup is PTX ``prmt`` on the
  bf16 low and high bytes of the table (``KEY_ASM``, 21 instructions per word of 8 codes), the table
  held in registers.
- values: ``P @ (code * s + z) = (P * s) @ code + (P @ z)``, computed transposed, ``O^T [D, 8] = V^T [D, N]
  @ (P s)^T [N, 8]``: the 8 queries fill the MMA's n = 8. ``V^T`` is the raw codes as bf16 ``128 + code``
  (``VALUE_ASM``: a register holds one dimension of two adjacent tokens, the operand's k pair); its rows
  are a permutation of the dimensions (undone by the store): lane ``4g + t`` owns tokens ``2t, 2t + 1``
  (mod 8) and value words ``[D/64 g, D/64 (g + 1))``. ``(P s)^T`` is the score accumulator's first 8 rows
  as they lie in registers (its ownership equals the B operand's). ``P * s`` is rounded once to bf16;
  the ``128 * sum(bf16(P s))`` the code offset adds is removed with the sum of the same bf16 values, so
  it cancels exactly; ``sum(P z)`` and ``sum(P)`` are fp32 sums.
Softmax in base 2; the running max moves only when a score exceeds it by more than 2^8 (then the
accumulators are rescaled), statistics per (query, token) in registers, reduced once. Sinks: split 0
starts at ``m = sink, l = 1``. Partials ``[D + 1]`` fp32 as in ``tq_decode_launch``; the split-KV
reduce merges them.

Rounding model ``act-mma`` for bfloat16 activations only: bf16 rotated queries and centroids, exact codes,
``P * s`` rounded to bf16 (the model's bf16 P), fp32 accumulation. The operand tricks are bf16 bit patterns
(``0x43`` high bytes for ``128 + code``, the bf16 centroid ``prmt`` tables), so a float16 or float32 query
is refused (``dtype_problem``) rather than rounded to bf16; ``decode_grouped`` serves those.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from optimized.triton.tq_cache import HEAD_SIZES
from optimized.triton.tq_decode_grouped import tile_for
from optimized.triton.tq_decode_launch import check_decode_args, reduce_partials, split_decode_prologue

PRESET = "turboquant_4bit_nc"
MAX_GROUP = 8
BLOCK_NS = (16, 32, 64)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


def key_table_words(bf16_bits) -> list[int]:
    """The 16 centroid bf16 bit patterns ``bf16_bits`` as 8 int32 ``prmt`` tables: low bytes of
    entries ``[4q, 4q + 4)`` (q = 0..3), then their high bytes."""
    bits = [int(v) & 0xFFFF for v in bf16_bits]
    if len(bits) != 16:
        raise ValueError(f"a 4-bit key table has 16 entries, got {len(bits)}")
    words = [sum(((bits[4 * q + k] >> shift) & 0xFF) << (8 * k) for k in range(4)) for shift in (0, 8) for q in range(4)]
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


# One 32-bit key word (code i in nibble i) -> 4 registers, register b the bf16 pair (c[nibble 2b],
# c[nibble 2b + 1]) (low half first). $5..$8: low bytes of the table, $9..$12: high bytes
# (key_table_words, kept in registers). prmt looks up each byte in the 8-entry half chosen by the
# nibble's bit 3 (a byte mask made by prmt's sign-replicate mode); 21 instructions per word.
KEY_ASM = gl.constexpr("\n".join([
    "{", ".reg .b32 x, xh, t, m0, m1, a, b, l, h;",
    "and.b32 x, $4, 0x77777777;", "shr.u32 xh, x, 16;", "shl.b32 t, $4, 4;",
    "prmt.b32 m0, t, $4, 0xD9C8;", "prmt.b32 m1, t, $4, 0xFBEA;"]
    + [line for x, m, o0, o1 in (("x", "m0", "$0", "$1"), ("xh", "m1", "$2", "$3")) for line in (
        f"prmt.b32 a, $5, $6, {x};", f"prmt.b32 b, $7, $8, {x};", f"lop3.b32 l, a, b, {m}, 0xD8;",
        f"prmt.b32 a, $9, $10, {x};", f"prmt.b32 b, $11, $12, {x};", f"lop3.b32 h, a, b, {m}, 0xD8;",
        f"prmt.b32 {o0}, l, h, 0x5140;", f"prmt.b32 {o1}, l, h, 0x7362;")]
    + ["}"]))


@gluon.jit
def _halves(x):
    """int32 pairs of bf16 bit patterns ``[...]`` -> bf16 ``[..., 2]`` (low half first)."""
    return gl.join(x.to(gl.int16), (x >> 16).to(gl.int16)).to(gl.bfloat16, bitcast=True)


@gluon.jit
def _top(v, like):
    """Rows ``[0, 8)`` of ``v [16]`` broadcast over ``like [16, X]``: ``[8, X]``, the layout of
    ``_halves_of(like, 0)``."""
    b, _ = gl.broadcast(gl.expand_dims(v, 1), like)
    t, _ = _halves_of(b, 0)
    return t


@gluon.jit
def _top_rows(v, like):
    """Rows ``[0, 8)`` of ``v [16]`` as ``[8]``, the row layout of ``_halves_of(like, 0)``."""
    return gl.max(_top(v, like), axis=1)


@gluon.jit
def _cols_top(v, like):
    """``v [X]`` (one value per token) broadcast over rows ``[0, 8)`` of ``like [16, X]``: ``[8, X]``."""
    b, _ = gl.broadcast(gl.expand_dims(v, 0), like)
    t, _ = _halves_of(b, 0)
    return t


@gluon.jit
def _halves_of(x, axis: gl.constexpr):
    """``x [A, B]`` split into its first and second half along ``axis`` (a register split for the layouts
    used here; the halves keep the derived layout, the caller converts)."""
    shape: gl.constexpr = x.shape
    if axis == 0:
        y = gl.permute(gl.reshape(x, [2, shape[0] // 2, shape[1]]), [1, 2, 0])
    else:
        y = gl.reshape(x, [shape[0], 2, shape[1] // 2])
        y = gl.permute(y, [0, 2, 1])
    return gl.split(y)


@gluon.jit
def _scores(q, kw, table_ptr, zero, OPA: gl.constexpr, OPB: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """``Q2 @ K^T`` in two halves of the contraction (dimension blocks ``[0, D/2)`` and ``[D/2, D)`` of the
    permuted order: each thread's first and second half of its key words), so only half of the key
    operand is live at a time."""
    q0, q1 = _halves_of(q, 1)
    k0, k1 = gl.split(gl.permute(gl.reshape(kw, [N, 4, 2, D // 64]), [0, 1, 3, 2]))
    HALF_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=OPA.parent, k_width=2)
    x = mma_v2(gl.convert_layout(q0, HALF_A, assert_trivial=True),
               _key_operand(gl.reshape(k0, [N, D // 16]), table_ptr, OPB, N, D // 2), zero)
    return mma_v2(gl.convert_layout(q1, HALF_A, assert_trivial=True),
                  _key_operand(gl.reshape(k1, [N, D // 16]), table_ptr, OPB, N, D // 2), x)


@gluon.jit
def _key_operand(kw, table_ptr, LAYOUT: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """``K^T [D, N]`` bf16 (rows in the permuted order) in ``LAYOUT`` from key words ``kw [N, D/8]`` and
    the 8 table words at ``table_ptr``, loaded as per-thread values (the same address for every element:
    one load each, kept in registers; uniform scalars would be copied from uniform registers per use)."""
    tp = table_ptr + gl.zeros_like(kw)
    tab = (gl.load(tp), gl.load(tp + 1), gl.load(tp + 2), gl.load(tp + 3), gl.load(tp + 4), gl.load(tp + 5),
           gl.load(tp + 6), gl.load(tp + 7))
    p0, p1, p2, p3 = gl.inline_asm_elementwise(KEY_ASM, "=r,=r,=r,=r" + ",r" * 9, [kw, tab[0], tab[1], tab[2], tab[3], tab[4], tab[5], tab[6], tab[7]],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    e = _halves(gl.join(gl.join(p0, p1), gl.join(p2, p3)))  # [N, D/8, i, j, e]: byte 2j + i, nibble e
    e = gl.permute(gl.reshape(e, [N, 4, D // 32, 2, 2, 2]), [0, 2, 4, 3, 1, 5])  # [N, r, j, i, t, e]
    return gl.convert_layout(gl.permute(gl.reshape(e, [N, D]), [1, 0]), LAYOUT, assert_trivial=True)


# Two value words (the same word of an even and an odd token; code i in nibble i) -> 8 registers, register i
# the bf16 pair (128 + code i of the even token, 128 + code i of the odd token): the tokens' 16-bit halves
# are paired by prmt, nibbles isolated by masks, and each pair of isolated bytes gets the bf16 high byte
# 0x43 from a constant register by prmt; 16 instructions per word pair.
VALUE_ASM = gl.constexpr("\n".join([
    "{", ".reg .b32 x, y, c, m0, m1, m2, m3;", "mov.b32 c, 0x43434343;",
    "prmt.b32 x, $8, $9, 0x5410;", "prmt.b32 y, $8, $9, 0x7632;",
    "and.b32 m0, x, 0x0F0F0F0F;", "shr.u32 m1, x, 4;", "and.b32 m1, m1, 0x0F0F0F0F;",
    "and.b32 m2, y, 0x0F0F0F0F;", "shr.u32 m3, y, 4;", "and.b32 m3, m3, 0x0F0F0F0F;",
    "prmt.b32 $0, m0, c, 0x4240;", "prmt.b32 $1, m1, c, 0x4240;", "prmt.b32 $2, m0, c, 0x4341;",
    "prmt.b32 $3, m1, c, 0x4341;", "prmt.b32 $4, m2, c, 0x4240;", "prmt.b32 $5, m3, c, 0x4240;",
    "prmt.b32 $6, m2, c, 0x4341;", "prmt.b32 $7, m3, c, 0x4341;", "}"]))


@gluon.jit
def _value_operand(vw, LAYOUT: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """``V^T [D, N]`` bf16 ``128 + code`` (rows a permutation of the dimensions, undone by the store) in
    ``LAYOUT`` from value words ``vw [N, D/8]``."""
    we, wo = gl.split(gl.permute(gl.reshape(vw, [N // 2, 2, D // 8]), [0, 2, 1]))  # even and odd tokens
    v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
        VALUE_ASM, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [we, wo], dtype=(gl.int32, ) * 8, is_pure=True, pack=1)
    v = _halves(gl.join(gl.join(gl.join(v0, v1), gl.join(v2, v3)), gl.join(gl.join(v4, v5), gl.join(v6, v7))))
    v = gl.permute(gl.reshape(v, [N // 2, 8, D // 64, 2, 2, 2, 2]), [0, 6, 2, 5, 4, 3, 1])  # [N/2, e, r, c, b, a, g]
    return gl.convert_layout(gl.permute(gl.reshape(v, [N, D]), [1, 0]), LAYOUT, assert_trivial=True)


@gluon.constexpr_function
def _bits(n):
    return n.bit_length() - 1


@gluon.constexpr_function
def _value_words_layout(NB, RB, D):
    """``[NB, RB, D/8]`` value words: lane ``4g + t`` holds tokens ``2t, 2t + 1`` (mod 8) of each block
    row and the ``D/64`` consecutive words from ``D/64 g`` (one vector load per token)."""
    R = D // 64
    reg = ([[0, 0, 1 << i] for i in range(_bits(R))] + [[0, 1, 0]]
           + [[0, 1 << i, 0] for i in range(3, _bits(RB))] + [[1 << i, 0, 0] for i in range(_bits(NB))])
    lane = [[0, 2, 0], [0, 4, 0]] + [[0, 0, R << k] for k in range(3)]
    return gl.DistributedLinearLayout(reg, lane, [], [], [NB, RB, D // 8])


@gluon.constexpr_function
def _token_pair_layout(NB, RB):
    """``[NB, RB/2]`` pairs of adjacent tokens (one 32-bit word of two fp16 each): unpacked and flattened,
    the layout of the score accumulator's columns (lane ``4g + t`` holds tokens ``2t, 2t + 1`` mod 8)."""
    reg = [[0, 1 << i] for i in range(2, _bits(RB // 2))] + [[1 << i, 0] for i in range(_bits(NB))]
    return gl.DistributedLinearLayout(reg, [[0, 1], [0, 2], [0, 0], [0, 0], [0, 0]], [], [], [NB, RB // 2])


@gluon.jit
def _fp16_pairs(w, N: gl.constexpr):
    """int32 words ``[NB, RB/2]`` of two fp16 (low half first) -> fp16 ``[N]``."""
    h = gl.join(w.to(gl.int16), (w >> 16).to(gl.int16)).to(gl.float16, bitcast=True)
    return gl.reshape(h, [N])


@gluon.jit
def _block_rows(cache_ptr, row, t0, end, stride_blk, BS: gl.constexpr, NB: gl.constexpr, RB: gl.constexpr,
                LAYOUT: gl.constexpr):
    """Byte pointers of the ``NB`` cache blocks of tokens ``[t0, t0 + NB * RB)`` (``[NB]`` in ``LAYOUT``),
    the positions ``[RB]`` of the first block's rows (a slice of the parent along dim 0), and
    ``live [NB, RB]``."""
    nb = gl.arange(0, NB, layout=gl.SliceLayout(1, LAYOUT))
    rb = gl.arange(0, RB, layout=gl.SliceLayout(0, LAYOUT))
    first = t0 + nb * RB  # token of each block row's first entry
    blk = gl.load(row + first // BS, mask=first < end, other=0)
    base = cache_ptr + blk.to(gl.int64) * stride_blk
    live = gl.expand_dims(first, 1) + gl.expand_dims(rb, 0) < end
    return base, gl.expand_dims(first % BS, 1) + gl.expand_dims(rb, 0), live


@gluon.jit
def _load_tile(cache_ptr, row, t0, end, h, stride_blk, HK: gl.constexpr, BS: gl.constexpr, REC: gl.constexpr,
               KEY_BYTES: gl.constexpr, D: gl.constexpr, N: gl.constexpr, NB: gl.constexpr, RB: gl.constexpr):
    """Key words ``[N, D/8]`` (lane ``4g + t``: token ``g`` mod 8, words ``[D/32 t, D/32 (t + 1))``),
    value words ``[N, D/8]`` (``_value_words_layout``) and the fp16 k_scalar, v_scale, v_zero ``[N]``
    (the score accumulator's column layout) of tokens ``[t0, t0 + N)``, a tile of ``NB`` cache blocks of ``RB`` rows;
    codes of tokens at or past ``end`` read as 0, their fp16 fields as 0 or (the second token of a
    pair) another token's: the caller masks them."""
    KWL: gl.constexpr = gl.BlockedLayout([1, 1, D // 32], [1, 8, 4], [1, 1, 1], [2, 1, 0])
    VWL: gl.constexpr = _value_words_layout(NB, RB, D)
    TP: gl.constexpr = _token_pair_layout(NB, RB)
    W: gl.constexpr = D // 8
    base, pos, live = _block_rows(cache_ptr, row, t0, end, stride_blk, BS, NB, RB, gl.SliceLayout(2, KWL))
    rec = gl.expand_dims(base, 1) + (pos * HK + h) * REC
    wk = gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(1, KWL)))
    kp = gl.expand_dims(rec.to(gl.pointer_type(gl.int32)), 2) + gl.expand_dims(gl.expand_dims(wk, 0), 1)
    kw = gl.reshape(gl.load(kp, mask=gl.expand_dims(live, 2), other=0), [N, W])
    base, pos, live = _block_rows(cache_ptr, row, t0, end, stride_blk, BS, NB, RB, gl.SliceLayout(2, VWL))
    rec = gl.expand_dims(base, 1) + (pos * HK + h) * REC + KEY_BYTES
    wv = gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(1, VWL)))
    vp = gl.expand_dims(rec.to(gl.pointer_type(gl.int32)), 2) + gl.expand_dims(gl.expand_dims(wv, 0), 1)
    vw = gl.reshape(gl.load(vp, mask=gl.expand_dims(live, 2), other=0), [N, W])
    # fp16 fields of token pairs (2i, 2i + 1): one word each; a pair's second token may be past the end
    nb = gl.arange(0, NB, layout=gl.SliceLayout(1, TP))
    pp = gl.arange(0, RB // 2, layout=gl.SliceLayout(0, TP))
    first = t0 + nb * RB
    blk = gl.load(row + first // BS, mask=first < end, other=0)
    meta = (cache_ptr + blk.to(gl.int64) * stride_blk + (BS * HK * REC + h * (6 * BS))).to(gl.pointer_type(gl.int32))
    meta = gl.expand_dims(meta + (first % BS) // 2, 1) + gl.expand_dims(pp, 0)
    live = gl.expand_dims(first, 1) + 2 * gl.expand_dims(pp, 0) < end
    kn = _fp16_pairs(gl.load(meta, mask=live, other=0), N)
    vs = _fp16_pairs(gl.load(meta + BS // 2, mask=live, other=0), N)
    vz = _fp16_pairs(gl.load(meta + BS, mask=live, other=0), N)
    return kw, vw, kn, vs, vz


@gluon.jit
def _sm90_kernel(q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, table_ptr, sinks_ptr, part_ptr, stride_blk, stride_bt, scale,
                 D: gl.constexpr, HK: gl.constexpr, BS: gl.constexpr, KEY_BYTES: gl.constexpr,
                 VAL_BYTES: gl.constexpr, HQ: gl.constexpr, G: gl.constexpr, S: gl.constexpr, MAXS: gl.constexpr,
                 HAS_SINKS: gl.constexpr, BLOCK_N: gl.constexpr):
    """Program ``(b, h * QG + qg, s)``: queries ``[8 qg, min(8 qg + 8, G))`` of kv head ``h``, split ``s``."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
    OPA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    OPB: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    TOK: gl.constexpr = gl.SliceLayout(0, MMA)
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    OUT: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [1, 1], [1, 0])
    REC: gl.constexpr = KEY_BYTES + VAL_BYTES
    NB: gl.constexpr = BLOCK_N // BS if BLOCK_N > BS else 1  # cache blocks per tile
    RB: gl.constexpr = BLOCK_N // NB
    QG: gl.constexpr = (G + 7) // 8
    TAU: gl.constexpr = 8.0  # the running max moves only when a score exceeds it by 2^8 (p <= 256)
    b = gl.program_id(0)
    h = gl.program_id(1) // QG
    q0 = h * G + (gl.program_id(1) % QG) * 8  # first query head of the program
    GQ = gl.minimum(G - (gl.program_id(1) % QG) * 8, 8)  # its query heads
    s = gl.program_id(2)
    L = gl.load(seq_lens_ptr + b)
    W = gl.cdiv(gl.cdiv(L, S), BLOCK_N) * BLOCK_N
    start = s * W
    end = gl.minimum(start + W, L)
    if start < end:
        qr = gl.arange(0, 16, layout=gl.SliceLayout(1, OPA))
        qc = gl.arange(0, D, layout=gl.SliceLayout(0, OPA))
        qd = 8 * ((D // 32) * ((qc // 2) % 4) + qc // 32) + 2 * (2 * ((qc // 16) % 2) + (qc // 8) % 2) + qc % 2
        qrow = q_ptr + (b.to(gl.int64) * HQ + q0 + qr) * D
        q = gl.load(gl.expand_dims(qrow, 1) + gl.expand_dims(qd, 0), mask=gl.expand_dims(qr < GQ, 1), other=0.0)
        q = q.to(gl.bfloat16)  # rows >= 8 are 0: the MMA's 16 rows, 8 queries
        qk_scale = scale * LOG2E
        zero_s = gl.zeros([16, BLOCK_N], gl.float32, MMA)
        rows = gl.arange(0, 16, layout=ROW)
        m16 = gl.full([16], float("-inf"), gl.float32, ROW)
        l16 = gl.zeros([16], gl.float32, ROW)
        if HAS_SINKS:
            if s == 0:
                m16 = gl.load(sinks_ptr + q0 + rows, mask=rows < GQ, other=float("-inf")) * LOG2E
                l16 = gl.where(rows < GQ, 1.0, 0.0)
        m = _top_rows(m16, zero_s)  # [8]: the running max per query (base 2)
        l0 = _top_rows(l16, zero_s)
        acc = gl.zeros([D, 8], gl.float32, MMA)  # O^T, rows in the value operand's dimension order
        zt, _ = _halves_of(zero_s, 0)
        l_t = zt  # sum p, per (query, token)
        z_t = zt  # sum p * v_zero
        s_t = zt  # sum bf16(p * v_scale) (the offset of the value codes)
        row = bt_ptr + b.to(gl.int64) * stride_bt
        kw, vw, kn, vs, vz = _load_tile(cache_ptr, row, start, end, h, stride_blk, HK, BS, REC, KEY_BYTES, D,
                                        BLOCK_N, NB, RB)
        for t0 in range(start, end, BLOCK_N):
            nkw, nvw, nkn, nvs, nvz = _load_tile(cache_ptr, row, t0 + BLOCK_N, end, h, stride_blk, HK, BS, REC,
                                                 KEY_BYTES, D, BLOCK_N, NB, RB)
            live = (t0 + gl.arange(0, BLOCK_N, layout=TOK)) < end
            kn = gl.convert_layout(kn, TOK, assert_trivial=True).to(gl.float32)
            x = _scores(q, kw, table_ptr, zero_s, OPA, OPB, BLOCK_N, D)
            x = gl.where(gl.expand_dims(live, 0), x * gl.expand_dims(kn * qk_scale, 0), float("-inf"))
            x, _ = _halves_of(x, 0)  # [8, N]: the queries
            m_new = gl.maximum(m, gl.max(x, axis=1))
            if gl.max(m_new - m, axis=0) > TAU:  # rescale (rarely after the first tiles)
                alpha = gl.exp2(m - m_new)
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, MMA)), 0)
                at = gl.expand_dims(alpha, 1)
                l_t = l_t * at
                z_t = z_t * at
                s_t = s_t * at
                l0 = l0 * alpha
                m = m_new
            vs_t = gl.where(live, gl.convert_layout(vs, TOK, assert_trivial=True).to(gl.float32), 0.0)
            vz_t = gl.where(live, gl.convert_layout(vz, TOK, assert_trivial=True).to(gl.float32), 0.0)
            p = gl.exp2(x - gl.expand_dims(m, 1))
            r = (p * _cols_top(vs_t, zero_s)).to(gl.bfloat16)  # P * s, the MMA operand
            l_t = l_t + p
            z_t = z_t + p * _cols_top(vz_t, zero_s)
            s_t = s_t + r.to(gl.float32)
            pt = gl.permute(r, [1, 0])  # P^T [N, 8]
            if BLOCK_N >= 32:  # two halves of the tile's tokens: half of the value operand live at a time
                pa, pb = _halves_of(pt, 0)
                va, vb = _halves_of(vw, 0)
                acc = mma_v2(_value_operand(va, OPA, BLOCK_N // 2, D), gl.convert_layout(pa, OPB), acc)
                acc = mma_v2(_value_operand(vb, OPA, BLOCK_N // 2, D), gl.convert_layout(pb, OPB), acc)
            else:
                acc = mma_v2(_value_operand(vw, OPA, BLOCK_N, D), gl.convert_layout(pt, OPB), acc)
            kw, vw, kn, vs, vz = nkw, nvw, nkn, nvs, nvz
        o = gl.convert_layout(gl.permute(acc, [1, 0]), OUT)
        l = gl.convert_layout(gl.sum(l_t, axis=1) + l0, gl.SliceLayout(1, OUT))
        shift = gl.convert_layout(gl.sum(z_t, axis=1) - 128.0 * gl.sum(s_t, axis=1), gl.SliceLayout(1, OUT))
        mq = gl.convert_layout(m, gl.SliceLayout(1, OUT))
        g = gl.arange(0, 8, layout=gl.SliceLayout(1, OUT))
        n = gl.arange(0, D, layout=gl.SliceLayout(0, OUT))
        dv = 8 * ((D // 64) * (n % 8) + n // 64) + (n // 8) % 8
        base = part_ptr + ((b.to(gl.int64) * HQ + q0 + g) * MAXS + s) * (D + 1)
        res = (o + gl.expand_dims(shift, 1)) / gl.expand_dims(l, 1)
        gl.store(gl.expand_dims(base, 1) + gl.expand_dims(dv, 0), res, mask=gl.expand_dims(g < GQ, 1))
        gl.store(base + D, (mq + gl.log2(l)) * LN2, mask=g < GQ)


_TABLES: dict = {}


def key_table(D: int, device):
    """The device int32 ``[8]`` of ``key_table_words`` for the 4-bit Lloyd-Max centroids of head size
    ``D``, built once per (D, device) so launches allocate nothing."""
    import torch

    from optimized.triton.tq_decode_launch import centroid_table
    from reference.turboquant.presets import preset as lookup

    key = (D, str(device))
    if key not in _TABLES:
        bits = centroid_table(lookup(PRESET), D, "cpu", "bf16").tolist()
        _TABLES[key] = torch.tensor(key_table_words(bits), dtype=torch.int32, device=device)
    return _TABLES[key]


def device_problem(device) -> str | None:
    """Why the kernel cannot run on ``device`` (a torch device), or None: it needs an NVIDIA GPU of
    compute capability 9.0 and a process without ``TRITON_INTERPRET=1`` (Gluon has no interpreter)."""
    import os

    import torch

    if os.environ.get("TRITON_INTERPRET") == "1":
        return "Gluon kernels do not run under TRITON_INTERPRET=1"
    if device.type != "cuda" or getattr(torch.version, "hip", None):
        return f"the sm_90 decode needs an NVIDIA GPU, got device {device}" + (" (ROCm)" if torch.version.hip else "")
    cc = torch.cuda.get_device_capability(device)
    if cc != (9, 0):
        return f"the sm_90 decode needs compute capability 9.0 (Hopper), got {cc[0]}.{cc[1]}"
    return None


def dtype_problem(dtype) -> str | None:
    """Why the kernel cannot take a query of ``dtype`` (a torch dtype or its name), or None: its MMA
    operands are bf16 bit patterns, so only a bfloat16 query runs as the act-mma model says."""
    name = str(dtype).removeprefix("torch.")
    if name != "bfloat16":
        return (f"the sm_90 decode's MMA operands are bf16 (bf16 bit tricks for keys and values), so it takes "
                f"bfloat16 queries only, got {name} (decode_grouped runs float16 and float32)")
    return None


def shape_problem(preset: str, layout: str, D: int, block_size: int | None) -> str | None:
    """Why the kernel cannot read this cache (a block size of None: not asked), or None."""
    from reference.turboquant.presets import preset as lookup

    if lookup(preset).name != PRESET or layout != "soa":
        return f"the sm_90 decode reads {PRESET} caches in the SoA layout, got {preset}/{layout}"
    if D not in HEAD_SIZES:
        return f"the sm_90 decode supports head sizes {HEAD_SIZES}, got {D}"
    if block_size is not None and block_size % 16 and block_size != 8:
        return f"the sm_90 decode needs a cache block size of 8 or a multiple of 16, got {block_size}"
    return None


def problem(*, preset: str, layout: str, D: int, block_size: int | None = None, G: int | None = None,
            sinks: bool = False, act: str | None = None, device=None) -> str | None:
    """Why this kernel cannot serve a request (None if it can): the cache's preset, layout, head size
    ``D`` and block size, the activation dtype ``act`` (a name; None: not asked) and, when given, the
    torch ``device`` it would run on. Any ``G`` and sinks are served."""
    return (shape_problem(preset, layout, D, block_size)
            or (device_problem(device) if device is not None else None)
            or (dtype_problem(act) if act is not None else None))


def sm90_stage1(a, S: int, ws, kv_cache, block_table, seq_lens, block_n: int) -> None:
    """The kernel alone (split-KV stage 1) for checked arguments: partials of ``S`` splits into
    ``ws.partials`` from the rotated queries in ``ws.q_rot``."""
    spec = a.spec
    D = spec.head_size
    qg = triton.cdiv(a.G, MAX_GROUP)
    _sm90_kernel[(a.B, spec.num_kv_heads * qg, S)](
        ws.q_rot, kv_cache, block_table, seq_lens, key_table(D, kv_cache.device),
        a.sinks if a.sinks is not None else ws.q_rot, ws.partials, kv_cache.stride(0), block_table.stride(0), a.scale,
        D=D, HK=spec.num_kv_heads, BS=spec.block_size, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes,
        HQ=a.Hq, G=a.G, S=S, MAXS=ws.max_splits, HAS_SINKS=a.sinks is not None, BLOCK_N=block_n, num_warps=1)


def decode_sm90(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation=None, scale=None, sinks=None,
                num_kv_splits=None, workspace=None, out=None, block_n=16, programs_per_sm=16):
    """Like ``tq_decode_split.decode_split`` (same arguments and result) for SoA ``turboquant_4bit_nc``
    caches on sm_90; ``block_n`` in ``BLOCK_NS`` (tokens per loop step; 16 keeps the program within
    the register file); by default about ``programs_per_sm`` one-warp programs per multiprocessor.
    ValueError naming the argument for what the kernel cannot serve: another preset or layout, head
    size, block size, device, a cache not aligned to 4 bytes, a query that is not bfloat16."""
    if block_n not in BLOCK_NS:
        raise ValueError(f"block_n must be one of {BLOCK_NS}, got {block_n}")
    a = check_decode_args(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout, rotation=rotation,
                          scale=scale, sinks=sinks)
    spec = a.spec
    why = shape_problem(preset, layout, spec.head_size, spec.block_size) or device_problem(kv_cache.device)
    if why:
        raise ValueError(f"kv_cache: {why}")
    why = dtype_problem(query.dtype)
    if why:
        raise ValueError(f"query: {why}")
    if kv_cache.data_ptr() % 4 or kv_cache.stride(0) % 4:
        raise ValueError("kv_cache: the sm_90 decode loads the codes as 32-bit words, so the cache start and block "
                         f"stride must be multiples of 4 bytes, got start % 4 = {kv_cache.data_ptr() % 4} and "
                         f"stride(0) = {kv_cache.stride(0)}")
    block_n = tile_for(spec.block_size, block_n)
    S, ws, out = split_decode_prologue(a, query, kv_cache, rotation, num_kv_splits=num_kv_splits, workspace=workspace,
                                       out=out, block_n=block_n, programs_per_sm=programs_per_sm,
                                       programs_per_row=spec.num_kv_heads * triton.cdiv(a.G, MAX_GROUP))
    sm90_stage1(a, S, ws, kv_cache, a.block_table, a.seq_lens, block_n)
    reduce_partials(ws, a.seq_lens, out, S, align=block_n)
    return out
