"""FlyDSL TurboQuant SoA 4-bit decode kernel for gfx950 (CDNA4), one partition per workgroup.

Kernel grid ``(B, Hk, P)``, one wave (64 lanes) per workgroup. Workgroup (b, h, p) handles the
G query heads of kv head h over the tokens ``[p * PART, (p + 1) * PART)`` of sequence b, with
``PART = TILES * 32``. Per 32-token tile:

* QK: two ``v_mfma_f32_16x16x32_bf16`` chains (16 tokens each, 4 MFMAs over D = 128).
  A = query rows (row r < 16; rows >= G repeat row G-1 and are ignored by the reduce),
  B = K^T. Lane l dequantizes token ``l % 16``, dims ``8w .. 8w+7`` for the packed word
  ``w = l // 16 + 4 kk``: ``K = bf16(c[nibble] * f32(k_norm16))`` (RNE), c from the LDS table.
* online softmax per query row in fp32: ``s = acc * scale`` (masked to -inf past seq_len),
  ``m = max(m, rowmax)``, ``p = exp2((s - m) * log2e)``, ``alpha = exp2((m_old - m) * log2e)``,
  ``l = l * alpha + sum(p)`` (fp32, P unrounded), acc scaled by alpha.
* PV: P rounded to bf16 (RNE) into LDS ``[16][32]``; V dequantized by each lane
  (token ``l // 2``, 64 dims) as ``bf16(code * f32(v_scale16) + f32(v_zero16))`` into LDS
  transposed ``[128][32]``; eight ``v_mfma_f32_16x16x32_bf16`` (one per 16 output dims).

Outputs per partition (fp32): ``o[B, Hk, P, 16, 128] = acc / l`` (0 where l == 0),
``m[B, Hk, P, 16]`` (natural-log units; -inf for an empty partition) and ``l[B, Hk, P, 16]``.
The partitions are merged by ``launcher.reduce_partitions``.

Tokens past ``seq_len`` read the block of token 0 (``block_table[b, 0]`` must be valid) and are
masked, so the cache is never read out of bounds through the block table.
Byte offsets into the cache are 32-bit: the cache must be under 2 GiB (the launcher checks).
"""

HEAD_DIM = 128
TILE_TOKENS = 32          # tokens per tile: the K of one PV MFMA
KEY_BYTES = HEAD_DIM // 2  # 4-bit key codes per (token, head)
VAL_BYTES = HEAD_DIM // 2  # 4-bit value codes per (token, head)
DATA_BYTES = KEY_BYTES + VAL_BYTES
NUM_SOA_FIELDS = 3         # k_norm, v_scale, v_zero (fp16), SoA metadata region
SLOT_BYTES = DATA_BYTES + 2 * NUM_SOA_FIELDS
LOG2E = 1.4426950408889634


def build_tq_decode(*, G: int, block_size: int, Hk: int, max_blocks: int, num_parts: int,
                    tiles_per_part: int, scale: float):
    """Return the ``@flyc.jit`` launcher of one kernel variant (FlyDSL 0.2.x API).

    Launch: ``fn(query_bf16[B, Hk*G, 128], cache_u8[nb * block_bytes], block_table_i32[B, M],
    seq_lens_i32[B], centroids_f32[16], o_f32, m_f32, l_f32, B)``.
    """
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from flydsl._mlir.dialects import arith as A
    from flydsl._mlir.dialects import llvm
    from flydsl._mlir.dialects import vector as V
    from flydsl._mlir.dialects import rocdl as ROCDL
    from flydsl._mlir.dialects.gpu import ShuffleOp, ShuffleMode
    from flydsl.expr import buffer_ops, gpu, range_constexpr, rocdl
    from flydsl.expr.typing import T
    from flydsl.expr.utils.arith import _to_raw as raw

    BS = block_size
    Hq = Hk * G
    block_bytes = BS * Hk * SLOT_BYTES
    meta_base = BS * Hk * DATA_BYTES  # byte offset of the metadata region inside a block
    part_tokens = tiles_per_part * TILE_TOKENS

    @fx.struct
    class Lds:
        cent: fx.Array[fx.Float32, 16, 16]
        p: fx.Array[fx.BFloat16, 16 * TILE_TOKENS, 16]          # P[row][token]
        vt: fx.Array[fx.BFloat16, HEAD_DIM * TILE_TOKENS, 16]   # V^T[dim][token]

    def i32(v):
        return raw(fx.Int32(v)) if isinstance(v, int) else v

    def f32(v):
        return A.ConstantOp(T.f32, float(v)).result

    def add(a, b):
        return A.AddIOp(i32(a), i32(b)).result

    def mul(a, b):
        return A.MulIOp(i32(a), i32(b)).result

    def shr(a, n):
        return A.ShRUIOp(i32(a), i32(n)).result

    def band(a, n):
        return A.AndIOp(i32(a), i32(n)).result

    def lt(a, b):
        return A.CmpIOp(A.CmpIPredicate.slt, i32(a), i32(b)).result

    def sel(c, a, b):
        return A.SelectOp(c, a, b).result

    def fmul(a, b):
        return A.MulFOp(a, b).result

    def fadd(a, b):
        return A.AddFOp(a, b).result

    def fsub(a, b):
        return A.SubFOp(a, b).result

    def fmax(a, b):
        return A.MaximumFOp(a, b).result

    def exp2(x):
        return ROCDL.exp2(res=T.f32, arg=x)  # v_exp_f32: no device library needed

    def to_bf16(x):
        return A.TruncFOp(T.bf16, x).result

    def f16_to_f32(x):
        return A.ExtFOp(T.f32, x).result

    def shuffle_xor(x, off):
        return ShuffleOp(x, i32(off), i32(64), ShuffleMode.XOR).shuffleResult

    def reduce16(x, op):
        """Reduce over the 16 lanes that share ``lane // 16`` (xor 1, 2, 4, 8)."""
        for off in (1, 2, 4, 8):
            x = op(x, shuffle_xor(x, off))
        return x

    def lds_ptr(base, byte_off):
        return buffer_ops.get_element_ptr(base, byte_offset=byte_off, elem_type=T.i8)

    @flyc.kernel
    def tq_decode_kernel(query: fx.Tensor, cache: fx.Tensor, block_table: fx.Tensor,
                         seq_lens: fx.Tensor, centroids: fx.Tensor, o_out: fx.Tensor,
                         m_out: fx.Tensor, l_out: fx.Tensor):
        lane = raw(fx.Int32(fx.thread_idx.x))
        b = raw(fx.Int32(fx.block_idx.x))
        h = raw(fx.Int32(fx.block_idx.y))
        p = raw(fx.Int32(fx.block_idx.z))
        q_rs = buffer_ops.create_buffer_resource(query)
        c_rs = buffer_ops.create_buffer_resource(cache)
        bt_rs = buffer_ops.create_buffer_resource(block_table)
        sl_rs = buffer_ops.create_buffer_resource(seq_lens)
        ct_rs = buffer_ops.create_buffer_resource(centroids)
        o_rs = buffer_ops.create_buffer_resource(o_out)
        m_rs = buffer_ops.create_buffer_resource(m_out)
        l_rs = buffer_ops.create_buffer_resource(l_out)

        lds = fx.SharedAllocator().allocate(Lds).peek()
        cent_base = buffer_ops.create_llvm_ptr(fx.Int64(fx.ptrtoint(lds.cent.ptr)), address_space=3)
        p_base = buffer_ops.create_llvm_ptr(fx.Int64(fx.ptrtoint(lds.p.ptr)), address_space=3)
        vt_base = buffer_ops.create_llvm_ptr(fx.Int64(fx.ptrtoint(lds.vt.ptr)), address_space=3)

        lane16 = band(lane, 15)   # MFMA column (token / dim) of this lane
        quad = shr(lane, 4)       # MFMA k-group of this lane (0..3)
        seq_len = buffer_ops.buffer_load(sl_rs, b, vec_width=1, dtype=T.i32)

        # Centroid table -> LDS (every lane writes entry lane % 16; duplicates are equal).
        cval = buffer_ops.buffer_load(ct_rs, lane16, vec_width=1, dtype=T.f32)
        llvm.StoreOp(cval, lds_ptr(cent_base, mul(lane16, 4)))
        gpu.barrier()

        # Query A operands: row lane % 16 (clamped to G - 1), dims 32 kk + 8 quad .. + 7.
        row = sel(lt(lane16, G), lane16, i32(G - 1))
        q_row = add(mul(add(mul(b, Hq), add(mul(h, G), row)), HEAD_DIM), mul(quad, 8))
        q_ops = []
        for kk in range_constexpr(4):
            words = buffer_ops.buffer_load(q_rs, shr(add(q_row, 32 * kk), 1), vec_width=4, dtype=T.i32)
            q_ops.append(V.BitCastOp(T.bf16x8, words).result)

        def block_base(tok):
            """Byte offset of the cache block holding ``tok`` and the slot in it."""
            phys = buffer_ops.buffer_load(
                bt_rs, add(mul(b, max_blocks), A.DivUIOp(tok, i32(BS)).result), vec_width=1, dtype=T.i32)
            return mul(phys, block_bytes), A.RemUIOp(tok, i32(BS)).result

        def meta(base, slot, field):
            """fp16 metadata field of (slot, head h) as f32."""
            byte = add(base, add(meta_base, mul(add(mul(h, NUM_SOA_FIELDS * BS), add(field * BS, slot)), 2)))
            return f16_to_f32(buffer_ops.buffer_load(c_rs, shr(byte, 1), vec_width=1, dtype=T.f16))

        def nibble(word, n):
            return band(shr(word, 4 * n), 15)

        neg_inf = f32(float("-inf"))
        zero = f32(0.0)
        m_run = [neg_inf] * 4     # running max of rows 4 quad + r
        l_run = [zero] * 4        # per-lane partial row sums
        zero4 = V.BroadcastOp(T.f32x4, zero).result
        acc = [zero4] * 8         # O rows 4 quad + r, dims 16 nt + lane16

        for j in range_constexpr(tiles_per_part):
            tile0 = add(mul(p, part_tokens), j * TILE_TOKENS)
            gpu.barrier()  # the previous tile's LDS reads are done before we overwrite
            # ---- QK^T: two 16-token halves ----
            s_half = []
            for hh in range_constexpr(2):
                tok = add(tile0, add(hh * 16, lane16))
                valid = lt(tok, seq_len)
                base, slot = block_base(sel(valid, tok, i32(0)))
                knorm = meta(base, slot, 0)
                kbyte = add(base, add(mul(slot, Hk * DATA_BYTES), mul(h, DATA_BYTES)))
                s = zero4
                for kk in range_constexpr(4):
                    word = buffer_ops.buffer_load(c_rs, shr(add(kbyte, mul(add(quad, 4 * kk), 4)), 2),
                                                  vec_width=1, dtype=T.i32)
                    elems = []
                    for n in range_constexpr(8):
                        c = llvm.LoadOp(T.f32, lds_ptr(cent_base, mul(nibble(word, n), 4))).result
                        elems.append(to_bf16(fmul(c, knorm)))
                    k_op = V.FromElementsOp(T.bf16x8, elems).result
                    s = rocdl.mfma_f32_16x16x32_bf16(T.f32x4, [q_ops[kk], k_op, s])
                vals = []
                for r in range_constexpr(4):
                    x = fmul(V.ExtractOp(s, [], [r]).result, f32(scale))
                    vals.append(sel(valid, x, neg_inf))
                s_half.append(vals)
            # ---- online softmax per row 4 quad + r ----
            p_half = [[None] * 4, [None] * 4]
            for r in range_constexpr(4):
                m_tile = reduce16(fmax(s_half[0][r], s_half[1][r]), fmax)
                m_new = fmax(m_run[r], m_tile)
                is_empty = A.CmpFOp(A.CmpFPredicate.OEQ, m_new, neg_inf).result
                m_safe = sel(is_empty, zero, m_new)
                alpha = exp2(fmul(fsub(m_run[r], m_safe), f32(LOG2E)))
                for hh in range_constexpr(2):
                    p_half[hh][r] = exp2(fmul(fsub(s_half[hh][r], m_safe), f32(LOG2E)))
                l_run[r] = fadd(fmul(l_run[r], alpha), fadd(p_half[0][r], p_half[1][r]))
                m_run[r] = m_new
                for nt in range_constexpr(8):
                    a_r = fmul(V.ExtractOp(acc[nt], [], [r]).result, alpha)
                    acc[nt] = V.InsertOp(a_r, acc[nt], [], [r]).result
            # ---- P (bf16) -> LDS [row][token] ----
            for hh in range_constexpr(2):
                for r in range_constexpr(4):
                    off = mul(add(mul(add(mul(quad, 4), r), TILE_TOKENS), add(hh * 16, lane16)), 2)
                    llvm.StoreOp(to_bf16(p_half[hh][r]), lds_ptr(p_base, off))
            # ---- V dequant -> LDS V^T[dim][token]: lane owns token lane // 2, dims 64 (lane % 2) .. +63
            vt_tok = shr(lane, 1)
            vhalf = band(lane, 1)
            vtok = add(tile0, vt_tok)
            vbase, vslot = block_base(sel(lt(vtok, seq_len), vtok, i32(0)))
            vscale = meta(vbase, vslot, 1)
            vzero = meta(vbase, vslot, 2)
            vbyte = add(vbase, add(mul(vslot, Hk * DATA_BYTES), add(mul(h, DATA_BYTES), add(KEY_BYTES, mul(vhalf, 32)))))
            for w in range_constexpr(8):
                word = buffer_ops.buffer_load(c_rs, shr(add(vbyte, 4 * w), 2), vec_width=1, dtype=T.i32)
                for n in range_constexpr(8):
                    code = A.SIToFPOp(T.f32, nibble(word, n)).result
                    v = to_bf16(fadd(fmul(code, vscale), vzero))
                    dim = add(mul(vhalf, 64), 8 * w + n)
                    llvm.StoreOp(v, lds_ptr(vt_base, mul(add(mul(dim, TILE_TOKENS), vt_tok), 2)))
            gpu.barrier()
            # ---- PV ----
            p_op = llvm.LoadOp(T.bf16x8, lds_ptr(p_base, mul(add(mul(lane16, TILE_TOKENS), mul(quad, 8)), 2)),
                               alignment=16).result
            for nt in range_constexpr(8):
                v_off = mul(add(mul(add(nt * 16, lane16), TILE_TOKENS), mul(quad, 8)), 2)
                v_op = llvm.LoadOp(T.bf16x8, lds_ptr(vt_base, v_off), alignment=16).result
                acc[nt] = rocdl.mfma_f32_16x16x32_bf16(T.f32x4, [p_op, v_op, acc[nt]])

        # ---- epilogue: o = acc / l, per-row m and l ----
        slot_row = add(mul(add(mul(b, Hk), h), num_parts), p)   # (b, h, p) index
        for r in range_constexpr(4):
            l_row = reduce16(l_run[r], fadd)
            has = A.CmpFOp(A.CmpFPredicate.OGT, l_row, zero).result
            inv = sel(has, A.DivFOp(f32(1.0), sel(has, l_row, f32(1.0))).result, zero)
            qrow = add(mul(quad, 4), r)
            stat_idx = add(mul(slot_row, 16), qrow)
            buffer_ops.buffer_store(m_run[r], m_rs, stat_idx)
            buffer_ops.buffer_store(l_row, l_rs, stat_idx)
            for nt in range_constexpr(8):
                o = fmul(V.ExtractOp(acc[nt], [], [r]).result, inv)
                buffer_ops.buffer_store(o, o_rs, add(mul(stat_idx, HEAD_DIM), add(nt * 16, lane16)))

    @flyc.jit
    def launch(query: fx.Tensor, cache: fx.Tensor, block_table: fx.Tensor, seq_lens: fx.Tensor,
               centroids: fx.Tensor, o_out: fx.Tensor, m_out: fx.Tensor, l_out: fx.Tensor,
               batch: fx.Int32, stream: fx.Stream = fx.Stream(None)):
        tq_decode_kernel(query, cache, block_table, seq_lens, centroids, o_out, m_out, l_out).launch(
            grid=(batch, Hk, num_parts), block=(64, 1, 1), stream=stream)

    return launch
