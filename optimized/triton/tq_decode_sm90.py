"""TurboQuant decode for NVIDIA sm_90 whose dequantized key and value operands are built in registers,
in the register layout of the ``mma.sync.m16n8k16`` operands: no shared-memory round trip for them.
SoA ``turboquant_4bit_nc`` caches, ``G <= 8`` query heads per kv head, ``D`` in (64, 128, 256).

Written in Gluon (``triton.experimental.gluon``: explicit layouts), NVIDIA-only by design (inline PTX).
One warp per program; a program is one (sequence, kv head, split) and walks its tokens in tiles of
``BLOCK_N``, loading the next tile's code words while it computes the current one.

- scores ``S [16, BLOCK_N] = Q2 [16, D] @ K^T [D, BLOCK_N]``: ``Q2`` rows ``r`` and ``r + 8`` hold query
  ``r`` (``r < G``), so the MMA's two row halves are equal and the second carries the bf16 remainder of
  ``P * v_scale`` in the value product (below). The key operand's contraction index is a permutation of
  the head dimensions (the queries are loaded in the same order): thread ``(g, t)`` of the
  warp (lane ``4g + t``) owns token ``g`` (mod 8) and key words ``[D/32 t, D/32 (t + 1))``, loaded as one
  vector; a byte's two nibbles are the operand's adjacent pair. The 16-entry centroid lookup is PTX
  ``prmt`` on the bf16 low and high bytes of the table (immediates), 21 instructions per word of 8 codes.
- values: ``P @ (code * s + z) = (P * s) @ code + (P @ z)``: the value operand ``V [BLOCK_N, D]`` is the
  raw codes as bf16 ``128 + code`` (``(x >> 4i) & 0x000F000F | 0x43004300`` on a word holding two
  tokens' 16-bit halves); its column index is a permutation of the dimensions (undone by the store): thread ``(g, t)`` owns tokens ``2t, 2t + 1`` (mod 8) and value words
  ``[D/64 g, D/64 (g + 1))``. ``P * s`` enters as bf16 ``hi`` (rows < 8) and ``lo = bf16(P s - hi)``
  (rows >= 8); the ``128 * sum(P s)`` the offset adds is subtracted at the end, with ``sum(P z)``.
- ``P`` goes from the score accumulator to the MMA's A operand in registers (as in flash attention).
Softmax in base 2; statistics per (row, token) in registers, reduced once. Sinks: split 0 starts at
``m = sink, l = 1``. Partials ``[D + 1]`` fp32 as in ``tq_decode_launch``; the split-KV reduce merges them.

Rounding model ``bf16-mma``: bf16 rotated queries and centroids, exact codes, ``P * s`` as bf16 hi + lo,
fp32 accumulation (the same numerics as ``tq_decode_lut``'s bf16 path).
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from optimized.triton.tq_decode_launch import begin_split_decode, reduce_partials
from optimized.triton.tq_decode_lut import tile_for

PRESET = "turboquant_4bit_nc"
HEAD_SIZES = (64, 128, 256)
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
def _row_halves(x):
    """``x [16, X]`` -> rows ``[0, 8)`` and rows ``[8, 16)`` (a register split in the MMA layout)."""
    return gl.split(gl.permute(gl.reshape(x, [2, 8, x.shape[1]]), [1, 2, 0]))


@gluon.jit
def _stack_rows(top, bottom, layout: gl.constexpr):
    """Two ``[8, X]`` -> ``[16, X]`` (``top`` first) in ``layout``."""
    x = gl.reshape(gl.permute(gl.join(top, bottom), [2, 0, 1]), [16, top.shape[1]])
    return gl.convert_layout(x, layout, assert_trivial=True)


@gluon.jit
def _top(v, like):
    """Rows ``[0, 8)`` of ``v [16]`` broadcast over ``like [16, X]``: ``[8, X]``, the layout of
    ``_row_halves(like)``."""
    b, _ = gl.broadcast(gl.expand_dims(v, 1), like)
    t, _ = _row_halves(b)
    return t


@gluon.jit
def _cols_top(v, like):
    """``v [X]`` (one value per token) broadcast over rows ``[0, 8)`` of ``like [16, X]``: ``[8, X]``."""
    b, _ = gl.broadcast(gl.expand_dims(v, 0), like)
    t, _ = _row_halves(b)
    return t


@gluon.jit
def _key_operand(kw, tab, LAYOUT: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """``K^T [D, N]`` bf16 (rows in ``key_dims`` order) in ``LAYOUT`` from key words ``kw [N, D/8]`` and
    the 8 table words ``tab`` (scalars)."""
    p0, p1, p2, p3 = gl.inline_asm_elementwise(KEY_ASM, "=r,=r,=r,=r" + ",r" * 9, [kw, tab[0], tab[1], tab[2], tab[3], tab[4], tab[5], tab[6], tab[7]],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    e = _halves(gl.join(gl.join(p0, p1), gl.join(p2, p3)))  # [N, D/8, i, j, e]: byte 2j + i, nibble e
    e = gl.permute(gl.reshape(e, [N, 4, D // 32, 2, 2, 2]), [0, 2, 4, 3, 1, 5])  # [N, r, j, i, t, e]
    return gl.convert_layout(gl.permute(gl.reshape(e, [N, D]), [1, 0]), LAYOUT, assert_trivial=True)


@gluon.jit
def _value_operand(vw, LAYOUT: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """``V [N, D]`` bf16 ``128 + code`` (columns in ``value_dims`` order) in ``LAYOUT`` from value words
    ``vw [N, D/8]``."""
    we, wo = gl.split(gl.permute(gl.reshape(vw, [N // 2, 2, D // 8]), [0, 2, 1]))  # even and odd tokens
    x = (we & 0xFFFF) | (wo << 16)  # nibbles 0-3 of both tokens
    y = ((we >> 16) & 0xFFFF) | (wo & -65536)  # nibbles 4-7
    v0 = (x & 0x000F000F) | 0x43004300
    v1 = ((x >> 4) & 0x000F000F) | 0x43004300
    v2 = ((x >> 8) & 0x000F000F) | 0x43004300
    v3 = ((x >> 12) & 0x000F000F) | 0x43004300
    v4 = (y & 0x000F000F) | 0x43004300
    v5 = ((y >> 4) & 0x000F000F) | 0x43004300
    v6 = ((y >> 8) & 0x000F000F) | 0x43004300
    v7 = ((y >> 12) & 0x000F000F) | 0x43004300
    v = _halves(gl.join(gl.join(gl.join(v0, v1), gl.join(v2, v3)), gl.join(gl.join(v4, v5), gl.join(v6, v7))))
    v = gl.permute(gl.reshape(v, [N // 2, 8, D // 64, 2, 2, 2, 2]), [0, 6, 2, 5, 4, 3, 1])  # [N/2, e, r, c, b, a, g]
    return gl.convert_layout(gl.reshape(v, [N, D]), LAYOUT, assert_trivial=True)


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
def _token_layout(NB, RB):
    """``[NB, RB]`` per-token values laid out as the score accumulator's columns (``SliceLayout(0, MMA)``
    reshaped): lane ``4g + t`` holds tokens ``2t, 2t + 1`` (mod 8)."""
    reg = [[0, 1]] + [[0, 1 << i] for i in range(3, _bits(RB))] + [[1 << i, 0] for i in range(_bits(NB))]
    return gl.DistributedLinearLayout(reg, [[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]], [], [], [NB, RB])


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
    (``_token_layout``) of tokens ``[t0, t0 + N)``, a tile of ``NB`` cache blocks of ``RB`` rows;
    tokens at or past ``end`` read as 0."""
    KWL: gl.constexpr = gl.BlockedLayout([1, 1, D // 32], [1, 8, 4], [1, 1, 1], [2, 1, 0])
    VWL: gl.constexpr = _value_words_layout(NB, RB, D)
    TL: gl.constexpr = _token_layout(NB, RB)
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
    base, pos, live = _block_rows(cache_ptr, row, t0, end, stride_blk, BS, NB, RB, TL)
    meta = (gl.expand_dims(base, 1) + BS * HK * REC).to(gl.pointer_type(gl.float16)) + h * (3 * BS) + pos
    kn = gl.reshape(gl.load(meta, mask=live, other=0.0), [N]).to(gl.float32)
    vs = gl.reshape(gl.load(meta + BS, mask=live, other=0.0), [N]).to(gl.float32)
    vz = gl.reshape(gl.load(meta + 2 * BS, mask=live, other=0.0), [N]).to(gl.float32)
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
        qr = gl.arange(0, 16, layout=gl.SliceLayout(1, OPA)) % 8
        qc = gl.arange(0, D, layout=gl.SliceLayout(0, OPA))
        qd = 8 * ((D // 32) * ((qc // 2) % 4) + qc // 32) + 2 * (2 * ((qc // 16) % 2) + (qc // 8) % 2) + qc % 2
        qrow = q_ptr + (b.to(gl.int64) * HQ + q0 + qr) * D
        q = gl.load(gl.expand_dims(qrow, 1) + gl.expand_dims(qd, 0), mask=gl.expand_dims(qr < GQ, 1), other=0.0)
        q = q.to(gl.bfloat16)
        qk_scale = scale * LOG2E
        tab = (gl.load(table_ptr), gl.load(table_ptr + 1), gl.load(table_ptr + 2), gl.load(table_ptr + 3),
               gl.load(table_ptr + 4), gl.load(table_ptr + 5), gl.load(table_ptr + 6), gl.load(table_ptr + 7))
        rows = gl.arange(0, 16, layout=ROW) % 8
        m = gl.full([16], float("-inf"), gl.float32, ROW)
        l0 = gl.zeros([16], gl.float32, ROW)
        if HAS_SINKS:
            if s == 0:
                m = gl.load(sinks_ptr + q0 + rows, mask=rows < GQ, other=float("-inf")) * LOG2E
                l0 = gl.where(rows < GQ, 1.0, 0.0)
        acc = gl.zeros([16, D], gl.float32, MMA)
        zero_s = gl.zeros([16, BLOCK_N], gl.float32, MMA)
        zt, _ = _row_halves(zero_s)
        l_t = zt  # sum p, per (row, token)
        z_t = zt  # sum p * v_zero
        s_t = zt  # sum p * v_scale (the offset of the value codes)
        row = bt_ptr + b.to(gl.int64) * stride_bt
        kw, vw, kn, vs, vz = _load_tile(cache_ptr, row, start, end, h, stride_blk, HK, BS, REC, KEY_BYTES, D,
                                        BLOCK_N, NB, RB)
        for t0 in range(start, end, BLOCK_N):
            nkw, nvw, nkn, nvs, nvz = _load_tile(cache_ptr, row, t0 + BLOCK_N, end, h, stride_blk, HK, BS, REC,
                                                 KEY_BYTES, D, BLOCK_N, NB, RB)
            live = (t0 + gl.arange(0, BLOCK_N, layout=TOK)) < end
            kn = gl.convert_layout(kn, TOK, assert_trivial=True)
            x = mma_v2(q, _key_operand(kw, tab, OPB, BLOCK_N, D), zero_s)
            x = gl.where(gl.expand_dims(live, 0), x * gl.expand_dims(kn * qk_scale, 0), float("-inf"))
            m_new = gl.maximum(m, gl.max(x, axis=1))
            if gl.max(m_new - m, axis=0) > TAU:  # rescale (rarely after the first tiles)
                alpha = gl.exp2(m - m_new)
                acc = acc * gl.expand_dims(alpha, 1)
                at = _top(alpha, x)
                l_t = l_t * at
                z_t = z_t * at
                s_t = s_t * at
                l0 = l0 * alpha
                m = m_new
            xt, _ = _row_halves(x - gl.expand_dims(m, 1))
            p = gl.exp2(xt)
            ps = p * _cols_top(gl.convert_layout(vs, TOK, assert_trivial=True), x)
            l_t = l_t + p
            z_t = z_t + p * _cols_top(gl.convert_layout(vz, TOK, assert_trivial=True), x)
            s_t = s_t + ps
            hi = ps.to(gl.bfloat16)
            p2 = _stack_rows(hi, (ps - hi.to(gl.float32)).to(gl.bfloat16), MMA)
            acc = mma_v2(gl.convert_layout(p2, OPA), _value_operand(vw, OPB, BLOCK_N, D), acc)
            kw, vw, kn, vs, vz = nkw, nvw, nkn, nvs, nvz
        # rows r and r + 8 hold the same query: the hi and lo halves of P * s
        hi_o, lo_o = _row_halves(acc)
        o = gl.convert_layout(hi_o + lo_o, OUT)
        l = gl.convert_layout(gl.sum(l_t, axis=1) + gl.max(_top(l0, zero_s), axis=1), gl.SliceLayout(1, OUT))
        shift = gl.convert_layout(gl.sum(z_t, axis=1) - 128.0 * gl.sum(s_t, axis=1), gl.SliceLayout(1, OUT))
        mq = gl.convert_layout(gl.max(_top(m, zero_s), axis=1), gl.SliceLayout(1, OUT))
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
        bits = centroid_table(lookup(PRESET), D, "cpu", bf16_bits=True).tolist()
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


def shape_problem(preset: str, layout: str, D: int, block_size: int) -> str | None:
    """Why the kernel cannot read this cache, or None."""
    from reference.turboquant.presets import preset as lookup

    if lookup(preset).name != PRESET or layout != "soa":
        return f"the sm_90 decode reads {PRESET} caches in the SoA layout, got {preset}/{layout}"
    if D not in HEAD_SIZES:
        return f"the sm_90 decode supports head sizes {HEAD_SIZES}, got {D}"
    if block_size % 16 and block_size != 8:
        return f"the sm_90 decode needs a cache block size of 8 or a multiple of 16, got {block_size}"
    return None


def num_splits(B: int, programs_per_row: int, max_tokens: int, tile: int, device, max_splits: int,
               programs_per_sm: int) -> int:
    """About ``programs_per_sm`` one-warp programs per multiprocessor, never more splits than tiles;
    decided from shapes only, so a captured graph keeps it."""
    import torch

    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.next_power_of_2(triton.cdiv(programs_per_sm * sms, B * programs_per_row))
    return max(1, min(want, max_splits, triton.cdiv(max_tokens, tile)))


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
    the register file). ValueError naming the argument for what the kernel cannot serve: another
    preset or layout, head size, block size, device, a cache not aligned to 4 bytes."""
    if block_n not in BLOCK_NS:
        raise ValueError(f"block_n must be one of {BLOCK_NS}, got {block_n}")
    if getattr(kv_cache, "dim", lambda: 0)() != 4:
        raise ValueError(f"kv_cache must be a 4-d uint8 tensor, got {getattr(kv_cache, 'shape', kv_cache)}")
    why = shape_problem(preset, layout, query.shape[-1], kv_cache.shape[1]) or device_problem(kv_cache.device)
    if why:
        raise ValueError(f"kv_cache: {why}")
    if kv_cache.data_ptr() % 4 or kv_cache.stride(0) % 4:
        raise ValueError("kv_cache: the sm_90 decode loads the codes as 32-bit words, so the cache start and block "
                         f"stride must be multiples of 4 bytes, got start % 4 = {kv_cache.data_ptr() % 4} and "
                         f"stride(0) = {kv_cache.stride(0)}")
    block_n = tile_for(kv_cache.shape[1], block_n)
    if num_kv_splits is None:
        Hk = kv_cache.shape[2]
        G = max(1, query.shape[1] // Hk)
        num_kv_splits = num_splits(query.shape[0], Hk * triton.cdiv(G, MAX_GROUP),
                                   block_table.shape[1] * kv_cache.shape[1], block_n, kv_cache.device,
                                   workspace.max_splits if workspace is not None else 32, programs_per_sm)
    a, S, ws, out = begin_split_decode(query, kv_cache, block_table, seq_lens, preset=preset, layout=layout,
                                       rotation=rotation, scale=scale, sinks=sinks, num_kv_splits=num_kv_splits,
                                       workspace=workspace, out=out, block_n=block_n)
    sm90_stage1(a, S, ws, kv_cache, block_table, seq_lens, block_n)
    reduce_partials(ws, seq_lens, out, S, align=block_n)
    return out
