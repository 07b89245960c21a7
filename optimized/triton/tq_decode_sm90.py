"""TurboQuant decode for NVIDIA sm_90 whose dequantized key and value operands are built in registers,
in the register layouts of the ``mma.sync.m16n8k16`` operands: no shared-memory round trip for them.
SoA ``turboquant_4bit_nc`` caches, head size ``D`` in (64, 128, 256), any ``G`` (programs of up to 8
query heads each), cache block size 8 or a multiple of 16; bfloat16 or float16 queries, MMA operands in
the query's dtype.

Written in Gluon (``triton.experimental.gluon``: explicit layouts), NVIDIA-only by design (inline PTX).
One warp per program; a program is one (sequence, kv head, group of <= 8 query heads, split) and walks
its tokens in tiles of ``BLOCK_N``. The code words and fp16 fields stream through a shared-memory ring of
``STAGES`` tiles filled by cp.async ``STAGES - 1`` tiles ahead (raw bytes; each lane then loads the words
its operand fragments need), or, with ``STAGES = 1``, the next tile is loaded into registers while the
current one is computed.

- scores ``S [16, BLOCK_N] = Q [16, D] @ K^T [D, BLOCK_N]`` (rows >= 8 of ``Q`` are 0). The key operand's
  contraction index is a permutation of the head dimensions (the queries are loaded in the same order):
  lane ``4g + t`` owns token ``g`` (mod 8) and key words ``[D/32 t, D/32 (t + 1))``, one vector load; a
  byte's two nibbles are the operand's adjacent pair. The 16-entry centroid lookup uses the table's
  symmetry ``c[15 - i] = -c[i]``: PTX ``prmt`` on the low and high bytes of entries 0..7 and a sign flip
  (``KEY_ASM``, 18 instructions per word of 8 codes), the 4 table words held in registers.
- values: ``P @ (code * s + z) = (P * s) @ code + (P @ z)``, computed transposed, ``O^T [D, 8] = V^T [D, N]
  @ (P s)^T [N, 8]``: the 8 queries fill the MMA's n = 8. ``V^T`` is the raw codes (``VALUE_CODES``:
  bf16 ``128 + code``, or exact fp16 codes; a register holds one dimension of two adjacent tokens, the
  operand's k pair); its rows are a permutation of the dimensions (undone by the store): lane ``4g + t``
  owns tokens ``2t, 2t + 1`` (mod 8) and value words ``[D/64 g, D/64 (g + 1))``. ``(P s)^T`` is the score
  accumulator's first 8 rows as they lie in registers (its ownership equals the B operand's). ``P * s`` is
  rounded once to the operand dtype; bf16: the ``128 * sum(bf16(P s))`` the code offset adds is removed
  with the sum of the same bf16 values, so it cancels exactly; ``sum(P z)`` and ``sum(P)`` are fp32 sums.
Softmax in base 2; the running max moves only when a score exceeds it by more than 2^TAU (then the
accumulators are rescaled; bf16 TAU = 8; fp16 TAU = 2 and ``P * s / 4`` is the operand, so it stays within
fp16's range for any finite fp16 ``s``), statistics per (query, token) in registers, reduced once. Sinks:
split 0 starts at ``m = sink, l = 1``. Partials ``[D + 1]`` fp32 as in ``tq_decode_launch``; the split-KV
reduce merges them.

Rounding model ``act-mma-table``: rotated queries and centroids in the query's dtype (bf16 or fp16), the fp16
norm applied to the fp32 score (keys ``norm * centroid`` exact, not rounded as products), exact value codes,
``P * s`` rounded to that dtype, fp32 accumulation. A float32 query is refused
(``dtype_problem``) rather than rounded to 16 bits; ``decode_grouped`` serves it.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

from optimized.triton.tq_cache import HEAD_SIZES
from optimized.triton.tq_decode_grouped import tile_for
from optimized.triton.tq_decode_launch import check_decode_args, reduce_partials, split_decode_prologue

# The Gluon names differ between Triton versions: 3.6 (the H200's) and 3.8 (the CPU machines' compile check).
_async_copy = getattr(async_copy, "async_copy_global_to_shared", None) or async_copy.async_load
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

PRESET = "turboquant_4bit_nc"
MAX_GROUP = 8
BLOCK_NS = (16, 32, 64)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
LN2: gl.constexpr = gl.constexpr(0.6931471805599453)


def key_table_words(bits16) -> list[int]:
    """The 16 centroid bit patterns ``bits16`` (bf16 or fp16) of a symmetric table (``c[15 - i] = -c[i]``:
    entry ``15 - i`` is entry ``i`` with the sign bit flipped) as 4 int32 ``prmt`` tables: the low bytes
    of entries ``[0, 4)`` and ``[4, 8)``, then their high bytes. ValueError for another table."""
    bits = [int(v) & 0xFFFF for v in bits16]
    if len(bits) != 16:
        raise ValueError(f"a 4-bit key table has 16 entries, got {len(bits)}")
    if any(bits[15 - i] != bits[i] ^ 0x8000 for i in range(8)):
        raise ValueError("the sm_90 decode's key lookup needs a symmetric centroid table (c[15 - i] = -c[i]), "
                         f"got bit patterns {[hex(b) for b in bits]}")
    words = [sum(((bits[4 * q + k] >> shift) & 0xFF) << (8 * k) for k in range(4)) for shift in (0, 8) for q in range(2)]
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


# One 32-bit key word (code i in nibble i) -> 4 registers, register b the 16-bit pair (c[nibble 2b],
# c[nibble 2b + 1]) (low half first). $5, $6: low bytes of entries 0..7, $7, $8: their high bytes
# (key_table_words, kept in registers). The table is symmetric, c[i] = -c[15 - i] for i >= 8: each nibble
# becomes j = i < 8 ? i : 15 - i (i XOR 7 times its bit 3), prmt looks both bytes of c[j] up, and the
# sign bit of the high byte is flipped where bit 3 was set (a byte mask made by prmt's sign-replicate
# mode); 18 instructions per word.
KEY_ASM = gl.constexpr("\n".join([
    "{", ".reg .b32 s, j, jh, t, m0, m1, l, h;",
    "shr.u32 s, $4, 3;", "and.b32 s, s, 0x11111111;", "mul.lo.u32 s, s, 7;",
    "lop3.b32 j, $4, s, 0x77777777, 0x28;", "shr.u32 jh, j, 16;", "shl.b32 t, $4, 4;",
    "prmt.b32 m0, t, $4, 0xD9C8;", "prmt.b32 m1, t, $4, 0xFBEA;"]
    + [line for x, m, o0, o1 in (("j", "m0", "$0", "$1"), ("jh", "m1", "$2", "$3")) for line in (
        f"prmt.b32 l, $5, $6, {x};", f"prmt.b32 h, $7, $8, {x};", f"lop3.b32 h, h, {m}, 0x80808080, 0x78;",
        f"prmt.b32 {o0}, l, h, 0x5140;", f"prmt.b32 {o1}, l, h, 0x7362;")]
    + ["}"]))


@gluon.jit
def _halves(x, DT: gl.constexpr):
    """int32 pairs of 16-bit patterns of ``DT`` (bf16 or fp16) ``[...]`` -> ``DT [..., 2]`` (low half first)."""
    return gl.join(x.to(gl.int16), (x >> 16).to(gl.int16)).to(DT, bitcast=True)


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
def _scores(q, kw, table_ptr, zero, OPA: gl.constexpr, OPB: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
            DT: gl.constexpr):
    """``Q2 @ K^T`` in two halves of the contraction (dimension blocks ``[0, D/2)`` and ``[D/2, D)`` of the
    permuted order: each thread's first and second half of its key words), so only half of the key
    operand is live at a time."""
    q0, q1 = _halves_of(q, 1)
    k0, k1 = gl.split(gl.permute(gl.reshape(kw, [N, 4, 2, D // 64]), [0, 1, 3, 2]))
    HALF_A: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=OPA.parent, k_width=2)
    x = mma_v2(gl.convert_layout(q0, HALF_A, assert_trivial=True),
               _key_operand(gl.reshape(k0, [N, D // 16]), table_ptr, OPB, N, D // 2, DT), zero)
    return mma_v2(gl.convert_layout(q1, HALF_A, assert_trivial=True),
                  _key_operand(gl.reshape(k1, [N, D // 16]), table_ptr, OPB, N, D // 2, DT), x)


@gluon.jit
def _key_operand(kw, table_ptr, LAYOUT: gl.constexpr, N: gl.constexpr, D: gl.constexpr, DT: gl.constexpr):
    """``K^T [D, N]`` in ``DT`` (rows in the permuted order) in ``LAYOUT`` from key words ``kw [N, D/8]`` and
    the 4 table words at ``table_ptr``, loaded as per-thread values (the same address for every element:
    one load each, kept in registers; uniform scalars would be copied from uniform registers per use)."""
    tp = table_ptr + gl.zeros_like(kw)
    p0, p1, p2, p3 = gl.inline_asm_elementwise(KEY_ASM, "=r,=r,=r,=r" + ",r" * 5,
                                               [kw, gl.load(tp), gl.load(tp + 1), gl.load(tp + 2), gl.load(tp + 3)],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    e = _halves(gl.join(gl.join(p0, p1), gl.join(p2, p3)), DT)  # [N, D/8, i, j, e]: byte 2j + i, nibble e
    e = gl.permute(gl.reshape(e, [N, 4, D // 32, 2, 2, 2]), [0, 2, 4, 3, 1, 5])  # [N, r, j, i, t, e]
    return gl.convert_layout(gl.permute(gl.reshape(e, [N, D]), [1, 0]), LAYOUT, assert_trivial=True)


def _value_asm(high: int, subtract: bool) -> str:
    """Two value words (the same word of an even and an odd token; code i in nibble i) -> 8 registers,
    register i the 16-bit pair (code i of the even token, code i of the odd token) with high byte ``high``:
    the tokens' 16-bit halves are paired by prmt, nibbles isolated by masks, and each pair of isolated
    bytes gets its high bytes from a constant register by prmt (16 instructions per word pair); with
    ``subtract``, ``high << 8`` is then subtracted from both fp16 halves (8 more)."""
    lines = ["{", ".reg .b32 x, y, c, m0, m1, m2, m3;", f"mov.b32 c, {high * 0x01010101:#010x};",
             "prmt.b32 x, $8, $9, 0x5410;", "prmt.b32 y, $8, $9, 0x7632;",
             "and.b32 m0, x, 0x0F0F0F0F;", "shr.u32 m1, x, 4;", "and.b32 m1, m1, 0x0F0F0F0F;",
             "and.b32 m2, y, 0x0F0F0F0F;", "shr.u32 m3, y, 4;", "and.b32 m3, m3, 0x0F0F0F0F;",
             "prmt.b32 $0, m0, c, 0x4240;", "prmt.b32 $1, m1, c, 0x4240;", "prmt.b32 $2, m0, c, 0x4341;",
             "prmt.b32 $3, m1, c, 0x4341;", "prmt.b32 $4, m2, c, 0x4240;", "prmt.b32 $5, m3, c, 0x4240;",
             "prmt.b32 $6, m2, c, 0x4341;", "prmt.b32 $7, m3, c, 0x4341;"]
    if subtract:
        lines += [f"mov.b32 c, {(high << 8) * 0x00010001:#010x};"] + [f"sub.rn.f16x2 ${i}, ${i}, c;" for i in range(8)]
    return "\n".join(lines + ["}"])


# Value code operands by VALUES (a constexpr of the kernel): 0: bf16 128 + code (high byte 0x43), the offset
# removed after the MMA; 1: fp16 subnormals code * 2^-24 (high byte 0), exact, scaled back after the MMA;
# 2: fp16 integers, 1024 + code (high byte 0x64) minus 1024, exact.
VALUE_CODES = ("bf16-offset", "fp16-subnormal", "fp16-integer")
VALUE_ASM_BF16 = gl.constexpr(_value_asm(0x43, False))
VALUE_ASM_FP16_SUBNORMAL = gl.constexpr(_value_asm(0x00, False))
VALUE_ASM_FP16_INTEGER = gl.constexpr(_value_asm(0x64, True))


@gluon.jit
def _value_operand(vw, LAYOUT: gl.constexpr, N: gl.constexpr, D: gl.constexpr, VALUES: gl.constexpr):
    """``V^T [D, N]`` of the value codes (``VALUE_CODES[VALUES]``; rows a permutation of the dimensions,
    undone by the store) in ``LAYOUT`` from value words ``vw [N, D/8]``."""
    we, wo = gl.split(gl.permute(gl.reshape(vw, [N // 2, 2, D // 8]), [0, 2, 1]))  # even and odd tokens
    if VALUES == 0:
        v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
            VALUE_ASM_BF16, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [we, wo], dtype=(gl.int32, ) * 8, is_pure=True, pack=1)
        DT: gl.constexpr = gl.bfloat16
    elif VALUES == 1:
        v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
            VALUE_ASM_FP16_SUBNORMAL, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [we, wo], dtype=(gl.int32, ) * 8, is_pure=True,
            pack=1)
        DT: gl.constexpr = gl.float16
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = gl.inline_asm_elementwise(
            VALUE_ASM_FP16_INTEGER, "=r,=r,=r,=r,=r,=r,=r,=r,r,r", [we, wo], dtype=(gl.int32, ) * 8, is_pure=True,
            pack=1)
        DT: gl.constexpr = gl.float16
    v = _halves(gl.join(gl.join(gl.join(v0, v1), gl.join(v2, v3)), gl.join(gl.join(v4, v5), gl.join(v6, v7))), DT)
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


@gluon.constexpr_function
def _copy_layout(W):
    """``[N, W]`` words copied 32 bytes (two 16-byte cp.async) per lane, a row's lanes adjacent: few rows
    per lane, so few block-table loads and record addresses."""
    cols = min(32, max(1, W // 8))
    return gl.BlockedLayout([1, W // cols], [32 // cols, cols], [1, 1], [1, 0])


@gluon.constexpr_function
def _meta_copy_layout(P):
    """``[NB, P]`` metadata words, one per lane."""
    cols = min(32, P)
    return gl.BlockedLayout([1, 1], [32 // cols, cols], [1, 1], [1, 0])


@gluon.constexpr_function
def _ring_key_layout(D):
    """The key word layout of ``_load_tile`` for ``[N, D/8]`` (tokens of every block row flattened): what
    the ring's shared-memory loads of keys produce."""
    return gl.BlockedLayout([1, D // 32], [8, 4], [1, 1], [1, 0])


@gluon.constexpr_function
def _ring_value_layout(N, D):
    """The value word layout of ``_load_tile`` for ``[N, D/8]`` over ring rows (``_swap01`` of the token:
    the bases of token + 1 and token + 2 exchanged): what the ring's shared-memory loads of values produce."""
    R = D // 64
    reg = [[0, 1 << i] for i in range(_bits(R))] + [[2, 0]] + [[1 << i, 0] for i in range(3, _bits(N))]
    lane = [[1, 0], [4, 0]] + [[0, R << k] for k in range(3)]
    return gl.DistributedLinearLayout(reg, lane, [], [], [N, D // 8])


@gluon.jit
def _swap01(n):
    """``n`` with bits 0 and 1 exchanged (an involution): the ring's row of token ``n`` of a tile's values."""
    return (n & ~3) | ((n & 1) << 1) | ((n >> 1) & 1)


@gluon.jit
def _copy_rows(kbuf, vbuf, cache_ptr, row, t0, end, h, stride_blk, HK: gl.constexpr, BS: gl.constexpr,
               REC: gl.constexpr, KEY_BYTES: gl.constexpr, N: gl.constexpr, W: gl.constexpr, CP: gl.constexpr):
    """cp.async of the key words of token ``t0 + n`` into row ``n`` of ``kbuf [N, W]`` and of the value words
    of token ``t0 + _swap01(n)`` into row ``n`` of ``vbuf [N, W]`` (both tokens lie in one cache block: the
    tile starts at a multiple of 4 tokens); tokens at or past ``end`` are zero-filled."""
    n = gl.arange(0, N, layout=gl.SliceLayout(1, CP))
    tok = t0 + n
    vtok = t0 + _swap01(n)
    blk = gl.load(row + tok // BS, mask=(tok < end) | (vtok < end), other=0)  # the block of both tokens
    base = cache_ptr + blk.to(gl.int64) * stride_blk + h * REC
    words = gl.expand_dims(gl.arange(0, W, layout=gl.SliceLayout(0, CP)), 0)
    kp = gl.expand_dims((base + (tok % BS) * (HK * REC)).to(gl.pointer_type(gl.int32)), 1) + words
    vp = gl.expand_dims((base + (vtok % BS) * (HK * REC) + KEY_BYTES).to(gl.pointer_type(gl.int32)), 1) + words
    _async_copy(kbuf, kp, gl.expand_dims(tok < end, 1))
    _async_copy(vbuf, vp, gl.expand_dims(vtok < end, 1))


@gluon.jit
def _issue_tile(kbuf, vbuf, mbuf, stage, cache_ptr, row, t0, end, h, stride_blk, HK: gl.constexpr, BS: gl.constexpr,
                REC: gl.constexpr, KEY_BYTES: gl.constexpr, D: gl.constexpr, N: gl.constexpr, NB: gl.constexpr,
                RB: gl.constexpr):
    """Start the copies of tile ``[t0, t0 + N)`` into ring stage ``stage`` (cp.async, one commit group):
    key words ``kbuf[stage] [N, D/8]`` (row = token), value words ``vbuf[stage] [N, D/8]`` (row ``_swap01``
    of the token: the value loads' lanes then meet two bank groups instead of one), and the k_scalar,
    v_scale and v_zero pairs ``mbuf[3 stage + f] [NB, RB/2]``; tokens at or past ``end`` are zero-filled."""
    W: gl.constexpr = D // 8
    CP: gl.constexpr = _copy_layout(W)
    _copy_rows(kbuf.index(stage), vbuf.index(stage), cache_ptr, row, t0, end, h, stride_blk, HK, BS, REC, KEY_BYTES, N,
               W, CP)
    MP: gl.constexpr = _meta_copy_layout(RB // 2)
    nb = gl.arange(0, NB, layout=gl.SliceLayout(1, MP))
    pp = gl.arange(0, RB // 2, layout=gl.SliceLayout(0, MP))
    first = t0 + nb * RB
    mblk = gl.load(row + first // BS, mask=first < end, other=0)
    meta = (cache_ptr + mblk.to(gl.int64) * stride_blk + (BS * HK * REC + h * (6 * BS))).to(gl.pointer_type(gl.int32))
    meta = gl.expand_dims(meta + (first % BS) // 2, 1) + gl.expand_dims(pp, 0)
    mlive = gl.expand_dims(first, 1) + 2 * gl.expand_dims(pp, 0) < end
    for f in gl.static_range(3):
        _async_copy(mbuf.index(3 * stage + f), meta + f * (BS // 2), mlive)
    async_copy.commit_group()


@gluon.jit
def _ring_values(vbuf, stage, N: gl.constexpr, W: gl.constexpr, LAYOUT: gl.constexpr):
    """Value words ``[N, W]`` of ring stage ``stage`` in token order (``LAYOUT``: ``_ring_value_layout``, with
    token bits 0 and 1 exchanged, so that exchanging the index bits back is a relabelling of registers)."""
    v = vbuf.index(stage).load(LAYOUT)  # row r holds token _swap01(r)
    v = gl.permute(gl.reshape(v, [N // 4, 2, 2, W]), [0, 2, 1, 3])
    return gl.reshape(v, [N, W])


@gluon.jit
def _ring_fields(mbuf, stage, N: gl.constexpr, TP: gl.constexpr):
    """The fp16 k_scalar, v_scale, v_zero ``[N]`` of ring stage ``stage``."""
    return (_fp16_pairs(mbuf.index(3 * stage).load(TP), N), _fp16_pairs(mbuf.index(3 * stage + 1).load(TP), N),
            _fp16_pairs(mbuf.index(3 * stage + 2).load(TP), N))


@gluon.jit
def _sm90_kernel(q_ptr, cache_ptr, bt_ptr, seq_lens_ptr, table_ptr, sinks_ptr, part_ptr, stride_blk, stride_bt, scale,
                 D: gl.constexpr, HK: gl.constexpr, BS: gl.constexpr, KEY_BYTES: gl.constexpr,
                 VAL_BYTES: gl.constexpr, HQ: gl.constexpr, G: gl.constexpr, S: gl.constexpr, MAXS: gl.constexpr,
                 HAS_SINKS: gl.constexpr, BLOCK_N: gl.constexpr, VALUES: gl.constexpr, STAGES: gl.constexpr):
    """Program ``(b, h * QG + qg, s)``: queries ``[8 qg, min(8 qg + 8, G))`` of kv head ``h``, split ``s``.
    ``VALUES``: the operand format (``VALUE_CODES``; 0 bf16, else fp16); ``STAGES``: 1 loads the next
    tile into registers while the current one is computed, more stage tiles through a shared-memory ring
    of ``STAGES`` tiles filled by cp.async, ``STAGES - 1`` ahead."""
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
    W: gl.constexpr = D // 8
    if VALUES == 0:
        DT: gl.constexpr = gl.bfloat16
        TAU: gl.constexpr = 8.0  # the running max moves only when a score exceeds it by 2^8 (p <= 256)
        P_SCALE: gl.constexpr = 1.0
        OUT_SCALE: gl.constexpr = 1.0  # 1 / (P_SCALE * the operand of code 1)
        OFFSET: gl.constexpr = 128.0  # operand of code 0
    else:
        DT: gl.constexpr = gl.float16
        TAU: gl.constexpr = 2.0  # p <= 4, so that p * v_scale / 4 <= v_scale stays in fp16's range
        P_SCALE: gl.constexpr = 0.25
        OUT_SCALE: gl.constexpr = 67108864.0 if VALUES == 1 else 4.0  # subnormal codes: code 1 is 2^-24
        OFFSET: gl.constexpr = 0.0
    b = gl.program_id(0)
    h = gl.program_id(1) // QG
    q0 = h * G + (gl.program_id(1) % QG) * 8  # first query head of the program
    GQ = gl.minimum(G - (gl.program_id(1) % QG) * 8, 8)  # its query heads
    s = gl.program_id(2)
    L = gl.load(seq_lens_ptr + b)
    Wt = gl.cdiv(gl.cdiv(L, S), BLOCK_N) * BLOCK_N
    start = s * Wt
    end = gl.minimum(start + Wt, L)
    if start < end:
        qr = gl.arange(0, 16, layout=gl.SliceLayout(1, OPA))
        qc = gl.arange(0, D, layout=gl.SliceLayout(0, OPA))
        qd = 8 * ((D // 32) * ((qc // 2) % 4) + qc // 32) + 2 * (2 * ((qc // 16) % 2) + (qc // 8) % 2) + qc % 2
        qrow = q_ptr + (b.to(gl.int64) * HQ + q0 + qr) * D
        q = gl.load(gl.expand_dims(qrow, 1) + gl.expand_dims(qd, 0), mask=gl.expand_dims(qr < GQ, 1), other=0.0)
        q = q.to(DT)  # rows >= 8 are 0: the MMA's 16 rows, 8 queries
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
        s_t = zt  # sum of the P operand (bf16: removes the code offset)
        row = bt_ptr + b.to(gl.int64) * stride_bt
        TP: gl.constexpr = _token_pair_layout(NB, RB)
        if STAGES > 1:
            RING: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
            kbuf = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, W], RING)
            vbuf = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, W], RING)
            mbuf = gl.allocate_shared_memory(gl.int32, [3 * STAGES, NB, RB // 2], RING)
            KW2: gl.constexpr = _ring_key_layout(D)
            VW2: gl.constexpr = _ring_value_layout(BLOCK_N, D)
            for i in gl.static_range(STAGES - 1):
                _issue_tile(kbuf, vbuf, mbuf, i, cache_ptr, row, start + i * BLOCK_N, end, h, stride_blk, HK, BS, REC,
                            KEY_BYTES, D, BLOCK_N, NB, RB)
        else:
            kw, vw, kn, vs, vz = _load_tile(cache_ptr, row, start, end, h, stride_blk, HK, BS, REC, KEY_BYTES, D,
                                            BLOCK_N, NB, RB)
        for t0 in range(start, end, BLOCK_N):
            if STAGES > 1:
                it = (t0 - start) // BLOCK_N
                stage = it % STAGES
                async_copy.wait_group(STAGES - 2)
                _barrier()  # every lane's copies of this tile landed; the stage refilled next is read
                _issue_tile(kbuf, vbuf, mbuf, (it + STAGES - 1) % STAGES, cache_ptr, row, t0 + (STAGES - 1) * BLOCK_N,
                            end, h, stride_blk, HK, BS, REC, KEY_BYTES, D, BLOCK_N, NB, RB)
                kw = kbuf.index(stage).load(KW2)
                kn, vs, vz = _ring_fields(mbuf, stage, BLOCK_N, TP)
            else:
                nkw, nvw, nkn, nvs, nvz = _load_tile(cache_ptr, row, t0 + BLOCK_N, end, h, stride_blk, HK, BS, REC,
                                                     KEY_BYTES, D, BLOCK_N, NB, RB)
            live = (t0 + gl.arange(0, BLOCK_N, layout=TOK)) < end
            kn = gl.convert_layout(kn, TOK, assert_trivial=True).to(gl.float32)
            x = _scores(q, kw, table_ptr, zero_s, OPA, OPB, BLOCK_N, D, DT)
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
            vs_t = gl.where(live, gl.convert_layout(vs, TOK, assert_trivial=True).to(gl.float32) * P_SCALE, 0.0)
            vz_t = gl.where(live, gl.convert_layout(vz, TOK, assert_trivial=True).to(gl.float32), 0.0)
            p = gl.exp2(x - gl.expand_dims(m, 1))
            r = (p * _cols_top(vs_t, zero_s)).to(DT)  # P * s (fp16: / 4), the MMA operand
            l_t = l_t + p
            z_t = z_t + p * _cols_top(vz_t, zero_s)
            if VALUES == 0:
                s_t = s_t + r.to(gl.float32)
            pt = gl.permute(r, [1, 0])  # P^T [N, 8]
            if STAGES > 1:
                vw = _ring_values(vbuf, stage, BLOCK_N, W, VW2)
            if BLOCK_N >= 32:  # two halves of the tile's tokens: half of the value operand live at a time
                pa, pb = _halves_of(pt, 0)
                va, vb = _halves_of(vw, 0)
                acc = mma_v2(_value_operand(va, OPA, BLOCK_N // 2, D, VALUES), gl.convert_layout(pa, OPB), acc)
                acc = mma_v2(_value_operand(vb, OPA, BLOCK_N // 2, D, VALUES), gl.convert_layout(pb, OPB), acc)
            else:
                acc = mma_v2(_value_operand(vw, OPA, BLOCK_N, D, VALUES), gl.convert_layout(pt, OPB), acc)
            if STAGES == 1:
                kw, vw, kn, vs, vz = nkw, nvw, nkn, nvs, nvz
        if STAGES > 1:
            async_copy.wait_group(0)  # no copy outlives the program
        o = gl.convert_layout(gl.permute(acc, [1, 0]), OUT) * OUT_SCALE
        l = gl.convert_layout(gl.sum(l_t, axis=1) + l0, gl.SliceLayout(1, OUT))
        shift = gl.convert_layout(gl.sum(z_t, axis=1) - OFFSET * gl.sum(s_t, axis=1), gl.SliceLayout(1, OUT))
        mq = gl.convert_layout(m, gl.SliceLayout(1, OUT))
        g = gl.arange(0, 8, layout=gl.SliceLayout(1, OUT))
        n = gl.arange(0, D, layout=gl.SliceLayout(0, OUT))
        dv = 8 * ((D // 64) * (n % 8) + n // 64) + (n // 8) % 8
        base = part_ptr + ((b.to(gl.int64) * HQ + q0 + g) * MAXS + s) * (D + 1)
        res = (o + gl.expand_dims(shift, 1)) / gl.expand_dims(l, 1)
        gl.store(gl.expand_dims(base, 1) + gl.expand_dims(dv, 0), res, mask=gl.expand_dims(g < GQ, 1))
        gl.store(base + D, (mq + gl.log2(l)) * LN2, mask=g < GQ)


_TABLES: dict = {}
MMA_FORMATS = {"bfloat16": "bf16", "float16": "fp16"}  # query dtype -> MMA operand format
FP16_VALUES = ("subnormal", "integer")  # fp16 value code operands: VALUE_CODES[1], VALUE_CODES[2]
MAX_STAGES = 8


def key_table(D: int, device, mma: str = "bf16"):
    """The device int32 ``[4]`` of ``key_table_words`` for the 4-bit Lloyd-Max centroids of head size
    ``D`` in the MMA operand format ``mma`` ("bf16" or "fp16"), built once per (D, format, device) so
    launches allocate nothing."""
    import torch

    from optimized.triton.tq_decode_launch import centroid_table
    from reference.turboquant.presets import preset as lookup

    key = (D, str(device), mma)
    if key not in _TABLES:
        bits = centroid_table(lookup(PRESET), D, "cpu", mma).tolist()
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
    """Why the kernel cannot take a query of ``dtype`` (a torch dtype or its name), or None: its MMA operands
    are 16-bit (``mma.sync`` with bf16 or fp16 operands, the query's dtype), so a float32 query is refused
    rather than rounded to 16 bits."""
    name = str(dtype).removeprefix("torch.")
    if name not in MMA_FORMATS:
        return (f"the sm_90 decode's MMA operands are 16-bit (the query's dtype), so it takes bfloat16 or float16 "
                f"queries, got {name} (decode_grouped runs float32 with fp32 operands)")
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


def values_code(mma: str, fp16_values: str) -> int:
    """The kernel's ``VALUES`` (an index of ``VALUE_CODES``) for operand format ``mma``."""
    return 0 if mma == "bf16" else 1 + FP16_VALUES.index(fp16_values)


def sm90_stage1(a, S: int, ws, kv_cache, block_table, seq_lens, block_n: int, mma: str = "bf16", stages: int = 1,
                fp16_values: str = "subnormal") -> None:
    """The kernel alone (split-KV stage 1) for checked arguments: partials of ``S`` splits into
    ``ws.partials`` from the rotated queries in ``ws.q_rot``, MMA operands in ``mma`` ("bf16", "fp16")."""
    spec = a.spec
    D = spec.head_size
    qg = triton.cdiv(a.G, MAX_GROUP)
    _sm90_kernel[(a.B, spec.num_kv_heads * qg, S)](
        ws.q_rot, kv_cache, block_table, seq_lens, key_table(D, kv_cache.device, mma),
        a.sinks if a.sinks is not None else ws.q_rot, ws.partials, kv_cache.stride(0), block_table.stride(0), a.scale,
        D=D, HK=spec.num_kv_heads, BS=spec.block_size, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes,
        HQ=a.Hq, G=a.G, S=S, MAXS=ws.max_splits, HAS_SINKS=a.sinks is not None, BLOCK_N=block_n,
        VALUES=values_code(mma, fp16_values), STAGES=stages, num_warps=1)


def decode_sm90(query, kv_cache, block_table, seq_lens, *, preset, layout, rotation=None, scale=None, sinks=None,
                num_kv_splits=None, workspace=None, out=None, block_n=32, programs_per_sm=4, stages=2,
                fp16_values="subnormal"):
    """Like ``tq_decode_split.decode_split`` (same arguments and result) for SoA ``turboquant_4bit_nc``
    caches on sm_90, MMA operands in the query's dtype (bfloat16 or float16); ``block_n`` in ``BLOCK_NS``
    (tokens per loop step); by default about ``programs_per_sm`` one-warp programs per multiprocessor:
    at 4 the grid fits in one wave of resident programs (about 12 a multiprocessor at this kernel's
    registers), where 8 left a second, partial wave (the defaults are the fastest configuration measured
    on the H100, ledger/h100/README.md); ``stages`` 1 prefetches the next tile into registers, 2 to
    ``MAX_STAGES`` stream tiles through a shared-memory ring (cp.async) ``stages - 1`` ahead; ``fp16_values`` the float16 value operands (``FP16_VALUES``: exact codes as fp16 subnormals,
    or as integers made by subtracting 1024). ValueError naming the argument for what the kernel cannot
    serve: another preset or layout, head size, block size, device, a cache not aligned to 4 bytes, a
    float32 query."""
    if block_n not in BLOCK_NS:
        raise ValueError(f"block_n must be one of {BLOCK_NS}, got {block_n}")
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= MAX_STAGES:
        raise ValueError(f"stages must be an integer in [1, {MAX_STAGES}], got {stages!r}")
    if fp16_values not in FP16_VALUES:
        raise ValueError(f"fp16_values must be one of {FP16_VALUES}, got {fp16_values!r}")
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
    sm90_stage1(a, S, ws, kv_cache, a.block_table, a.seq_lens, block_n, MMA_FORMATS[str(query.dtype).removeprefix(
        "torch.")], stages, fp16_values)
    reduce_partials(ws, a.seq_lens, out, S, align=block_n)
    return out


ENTRY_POINTS = {"decode": decode_sm90}
# (G, block size, MMA operands, VALUES, STAGES) of the configurations the compile check builds: the shape
# G=8, block 16 and G=16, block 32, bf16 and fp16 operands (both fp16 value codes), register prefetch
# (stages 1) and cp.async rings
COMPILED_CONFIGS = ((8, 16, "bf16", 0, 1), (8, 16, "bf16", 0, 2), (8, 16, "fp16", 1, 1), (8, 16, "fp16", 2, 4),
                    (16, 32, "bf16", 0, 3), (16, 32, "fp16", 1, 1))


def compile_specs():
    """The sm_90 decode in ``COMPILED_CONFIGS``, for CUDA only (inline PTX, ``mma.sync``), one warp, the
    pointers and strides aligned as a launch aligns them (``compile_check``)."""
    from optimized.triton.compile_check import ALIGNED, D, HK, CompileSpec, cache_spec

    spec = cache_spec(PRESET, "soa")
    types = dict(q_ptr="*fp32", cache_ptr="*u8", bt_ptr="*i32", seq_lens_ptr="*i32", table_ptr="*i32",
                 sinks_ptr="*fp32", part_ptr="*fp32", stride_blk="i32", stride_bt="i32", scale="fp32")
    return [CompileSpec(f"sm90 decode G={g} block={bs} mma={mma} values={VALUE_CODES[values]} stages={stages}",
                        _sm90_kernel, types,
                        dict(D=D, HK=HK, BS=bs, KEY_BYTES=spec.key_bytes, VAL_BYTES=spec.value_bytes, HQ=HK * g, G=g,
                             S=4, MAXS=32, HAS_SINKS=True, BLOCK_N=16, VALUES=values, STAGES=stages),
                        vendors=("cuda",), warps=1, aligned=ALIGNED)
            for g, bs, mma, values, stages in COMPILED_CONFIGS]
