"""GDN chunked prefill (``reference.gdn.numpy_ref.chunked``, chunk 64, UT / WY form) for CUDA and ROCm
GPUs, and for the CPU through ``TRITON_INTERPRET=1``.

Packed sequences (``cu_seqlens``), each starting from its pool slot ``state_indices[n]`` (-1: padding:
no slot read or written, its output rows zero); chunks start at 0, 64, 128 ... of each sequence. Up to
three kernels (by default the prep kernel computes step 2's operands: two); what passes between them goes
through global memory (``stage_bytes`` counts it):

1. ``_prep_tiles_kernel``, one program per (chunk, value head): G = the chunk-local cumsum of g (fp32,
   stored [T, HV]); the strictly lower A = bf16(-beta_i (k_i . k_j) exp(G_i - G_j)) (one [64, 64] dot); its
   inverse T = bf16((I - A)^-1) from the 16-row diagonal blocks' inverses (fp32 products of (I + A^(2^i)))
   and fp32 block products below them (the blocks split from A and joined into T in registers); W =
   bf16(T @ bf16(beta exp(G) k)), U = bf16(T @ bf16(beta v)) and the state increment's operand
   bf16(k exp(G_last - G)) (bf16 [T, HV, K], [T, HV, V], [T, HV, K]). ``stages(..., prep="blocks")`` runs
   ``_prep_kernel`` instead, which computes the same in 16-row blocks throughout (A's blocks, W and U summed
   over T's 16-column blocks). The "tiles" kernel's variants (``stages``' prep_* arguments): several value
   heads of one key head a program (k, its norm and k k^T computed once for them; the same values), the
   step 2 operands computed there too (the same values; no readout kernel), the solve's four diagonal blocks
   batched, the norms by one reciprocal a row (within 1.5 fp32 ulps of the quotient, before the bf16
   rounding). By default it runs two value heads a program where the group allows, computes the step 2
   operands and solves in batched blocks, with 8 warps (the same bits as its plain form).
2. ``_readout_kernel``, per (chunk, value head): the output's state-free operands bf16(q exp(G)) and
   bf16(tril(q k^T exp(G_i - G_j))) (bf16 [T, HV, K] and [T, HV, 64]).
3. ``_state_kernel``, per (sequence, value head, V-tile) (the V-tiles of a value head launched side by
   side), serial over the sequence's chunks (the next chunk's tiles loaded while one is computed): the
   carried fp32 state S; per chunk h = bf16(S), v_new = bf16(U - W @ h), o = bf16(q exp(G)) @ h +
   bf16(tril(...)) @ v_new stored in ``out``'s dtype (nearest even), S = exp(G_last) S +
   bf16(k exp(G_last - G))^T @ v_new; with a 16-bit pool S is replaced by its stored value (nearest even)
   after every ``state_write_interval`` tokens of the sequence; the final S stored into the pool in its dtype.

Segmented state pass (``stages(..., segment_chunks=n)``; off by default): each sequence is split into segments
of n chunks (the last: the rest; a sequence of at most n chunks is one segment and runs as above) and step 3
runs on a grid of (segment, value head, V-tile) programs, from start states computed first by two kernels:
``_maps_kernel`` per (segment but a sequence's last, value head, column tile of [A | B]) carries M = [A | B]
(fp32 [K, K + V]) from [I | 0] through the segment's chunks as the state pass carries S, with values [0 | U]:
M = exp(G_last) M + bf16(k exp(G_last - G))^T bf16([0 | U] - W @ bf16(M)), no 16-bit pool rounding, so that the
segment maps S to A S + B; stored fp32 ([segments, HV, K, K + V]). ``_merge_kernel`` per (sequence, value head,
V-tile) then runs S_0 = the pool slot's state, S_{i+1} = A_i S_i + B_i (fp32 operands; on NVIDIA GPUs the dot as
three TF32 products, ``MERGE_PRECISION``), stored fp32 ([segments, HV, K, V]). A segment's state pass starts
from its S_i, rounded to a 16-bit pool's dtype where the sequence's ``state_write_interval`` falls on its first
token; only a sequence's last segment stores the pool. These are the rounding points of the family's
``bf16-operands-segmented`` model (``reference.gdn.numpy_ref.chunked(segment_chunks)``). On an H100 (2026-12-07)
it was slower than the serial pass at 1 x 8192 and 4 x 2048 tokens in every configuration tried (whole prefill
1.17-1.30x): there the serial pass is bound by throughput, not by its chunk-to-chunk chain, so the maps' work is
added and nothing saved (``bench.probes.gdn_chunked_segments``); hence off by default.

``stages(..., readout=False)`` leaves the output to a fourth kernel, ``_output_kernel`` per (chunk, value
head), which computes both readout operands itself from h (bf16 [chunks, HV, K, V]) and v_new (bf16
[T, HV, V]) that the state pass then stores; the step 2 kernel is not run.

q and k are l2-normalised in fp32 (eps added to the sum of squares), q times ``scale``, then rounded to
bf16, in every kernel that reads them. Every product is a dot of bf16 operands accumulated in fp32 (the
solve's: fp32 operands, IEEE); every other operation is fp32.
These are the rounding points of the family's ``bf16-operands`` model, for any activation dtype (float16
and float32 activations are rounded to bf16 where it rounds), in both readout modes. The chunk grids of
the chunk-parallel kernels run over a table of every chunk of every sequence (a binary search of the
chunk offsets), so short sequences of a varlen batch do not wait on the longest. The interpreter (whose
bf16 arithmetic and fp32 -> bf16 conversion are wrong) gets the same roundings through the bits, the
operands held in fp32.

Inputs are checked before launch (``ValueError``/``TypeError`` naming the argument), as in
``gdn_recurrent``; checks that read values are skipped while a CUDA graph is captured.
"""
from __future__ import annotations

import triton
import triton.language as tl

from optimized.triton.gdn_recurrent import _packed, _rounded
from optimized.triton.gdn_recurrent import problem as recurrent_problem
from optimized.triton.tq_decode_launch import interpreting

CHUNK = 64
SUB = 16                       # rows of the solve's blocks
STATE_BV = 32                  # V-tile of the state pass
STATE_STAGES = 3               # its software-pipeline stages (the next chunks' loads in flight)
WARPS = 4
PREP_WARPS = 8                 # the prep kernel's
PREP = "tiles"                 # the prep kernel: its products over the whole chunk, or in 16-row blocks ("blocks")
PREP_HEADS = 2                 # value heads per program of the "tiles" prep kernel (k and k k^T shared by them)
PREP_READOUT = True            # the readout operands computed by the "tiles" prep kernel (no readout kernel)
PREP_NORM = "div"              # the "tiles" prep kernel's l2 norms: a division per element, or "rcp" (``_qk``)
PREP_FORM = "batched"          # its solve's form: 16-row blocks, or "batched" diagonal blocks
READOUT = True                 # the state pass writes the output (h and v_new never go to memory)
MAPS_BC = 64                   # the segment maps kernel's column tile of [A | B]
MAPS_WARPS = 4                 # its warps
MAPS_STAGES = 2                # its software-pipeline stages
MERGE_PRECISION = "tf32x3"     # the merge's fp32 dot on NVIDIA GPUs (three TF32 products); "ieee" elsewhere
MERGE_BV = 32                  # the merge kernel's V-tile (its fp32 [K, K] map and [K, BV] state in registers:
MERGE_WARPS = 8                # sm_90 at K = 128 in 8 warps, one stage: 96 KiB shared memory, no spills to speak
MERGE_STAGES = 1               # of; a V-tile of 64 spills, 128 or two stages need 160 to 320 KiB)


def problem(*, K: int, V: int, state_dtype: str, act: str, H: int | None = None, HV: int | None = None,
            device=None) -> str | None:
    """Why these kernels cannot serve a call (dtype names, head sizes and counts); None when they can."""
    return recurrent_problem(K=K, V=V, state_dtype=state_dtype, act=act, H=H, HV=HV, device=device)


def stage_bytes(T: int, chunks: int, HV: int, K: int, V: int, readout: bool = READOUT) -> int:
    """Bytes the stages write and read back (each written once and read once): G (fp32), W, U and the
    state increment's k operand (bf16) per token and value head; with ``readout`` bf16(q exp(G)) and the
    chunk's bf16 [64]-row of tril(q k^T) per token, otherwise v_new (bf16) per token and h (bf16) per chunk."""
    per_token = HV * (4 + 2 * K + 2 * V + 2 * K + (2 * K + 2 * CHUNK if readout else 2 * V))
    return 2 * (T * per_token + (0 if readout else chunks * HV * K * V * 2))


# ---------------------------------------------------------------- helpers

@triton.jit
def _bf16(x, BITS: tl.constexpr):
    """fp32 ``x`` rounded to bf16 (nearest even): a bf16 tensor on a GPU; with BITS (the interpreter) the
    rounded values held in fp32, through the bits."""
    if BITS:
        b = x.to(tl.uint32, bitcast=True)
        b = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16
        return b.to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _mm(a, b, BITS: tl.constexpr):
    """a @ b of ``_bf16`` operands, fp32 accumulation (the interpreter: fp32 operands, IEEE)."""
    if BITS:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _owner(c, table_ptr, N):
    """The sequence n of entry ``c`` of a table of per-sequence counts (table[n] = entries before sequence n,
    table[N] = all): the last n with table[n] <= c (a binary search)."""
    lo = tl.zeros((), tl.int32)
    hi = lo + N
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tl.load(table_ptr + mid) <= c:
            lo = mid
        else:
            hi = mid
    return lo


@triton.jit
def _chunk(c, chunk_cu_ptr, cu_ptr, N):
    """(sequence n, first token, tokens in the chunk, chunk index within the sequence) of chunk ``c`` of
    the table (chunk_cu[n] = chunks before sequence n); tokens 0 when c is past the last chunk."""
    lo = _owner(c, chunk_cu_ptr, N)
    j = c - tl.load(chunk_cu_ptr + lo)
    bos = tl.load(cu_ptr + lo).to(tl.int64)
    eos = tl.load(cu_ptr + lo + 1).to(tl.int64)
    t0 = bos + j * 64
    length = tl.minimum(eos - t0, 64)
    length = tl.where(c < tl.load(chunk_cu_ptr + N), length, 0)
    return lo, t0, length, j


@triton.jit
def _qk(ptr, t0, rows, valid, s_t, h, s_h, D: tl.constexpr, BD: tl.constexpr, scale, eps, L2NORM: tl.constexpr,
        BITS: tl.constexpr, RCP: tl.constexpr):
    """Rows ``t0 + rows`` of q or k (head h) in fp32, l2-normalised, times ``scale``, rounded to bf16
    (invalid rows and padding columns 0). The norm divides each element (IEEE), or with RCP multiplies it by
    the row's reciprocal (IEEE; within 1.5 fp32 ulps of the quotient)."""
    d = tl.arange(0, BD)
    x = tl.load(ptr + (t0 + rows)[:, None] * s_t + h * s_h + d[None, :],
                mask=valid[:, None] & (d < D)[None, :], other=0.0).to(tl.float32)
    if L2NORM:
        norm = tl.sqrt_rn(tl.sum(x * x, axis=1) + eps)
        if RCP:
            x = x * tl.math.div_rn(tl.full(norm.shape, 1.0, tl.float32), norm)[:, None]
        else:
            x = tl.math.div_rn(x, norm[:, None])
    return _bf16(x * scale, BITS)


@triton.jit
def _gates(g_ptr, beta_ptr, t0, rows, valid, sg_t, sb_t, hv):
    g = tl.load(g_ptr + (t0 + rows) * sg_t + hv, mask=valid, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + (t0 + rows) * sb_t + hv, mask=valid, other=0.0).to(tl.float32)
    return g, beta


@triton.jit
def _a_block(ki, kj, beta_i, Gi, Gj, DIAG: tl.constexpr, BITS: tl.constexpr):
    """bf16(-beta_i (k_i . k_j) exp(G_i - G_j)) of one [16, 16] block (strictly lower on the diagonal)."""
    kk = _mm(ki, tl.trans(kj), BITS)
    if DIAG:
        r = tl.arange(0, 16)
        keep = r[:, None] > r[None, :]
        a = tl.where(keep, -beta_i[:, None] * kk * tl.exp(tl.where(keep, Gi[:, None] - Gj[None, :], 0.0)), 0.0)
    else:
        a = -beta_i[:, None] * kk * tl.exp(Gi[:, None] - Gj[None, :])
    return _bf16(a, BITS).to(tl.float32)


@triton.jit
def _inv_diag(a):
    """(I - a)^-1 of a strictly lower [16, 16] block (or of each of a [B, 16, 16] batch) in fp32:
    (I + a)(I + a^2)(I + a^4)(I + a^8) (a^16 = 0), fp32 products (IEEE)."""
    r = tl.arange(0, 16)
    x = a + tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    p = a
    for _ in tl.static_range(3):
        p = tl.dot(p, p, input_precision="ieee")
        x = x + tl.dot(x, p, input_precision="ieee")
    return x


@triton.jit
def _store_rows(ptr, x, t0, rows, valid, s_t, col0, D: tl.constexpr, BD: tl.constexpr, BITS: tl.constexpr):
    """Rows ``t0 + rows`` (where ``valid``), columns ``col0 + [0, D)`` of a bf16 [T, HV * D] buffer: ``x``
    rounded to bf16 (nearest even)."""
    d = tl.arange(0, BD)
    tl.store(ptr + (t0 + rows)[:, None] * s_t + col0 + d[None, :], _rounded(x, ptr, BITS),
             mask=valid[:, None] & (d < D)[None, :])


@triton.jit
def _at_last(G, rows, length):
    """G at the chunk's last token (``rows == length - 1``), 0 when that row is not among ``rows``: a sum of
    one value and zeros, exact."""
    return tl.sum(tl.where(rows == length - 1, G, 0.0), axis=0)


@triton.jit
def _split4(y):
    """The four slices of ``y [..., 2, 2]`` along its last two dims, indexed 2a + b."""
    y0, y1 = tl.split(y)
    y00, y10 = tl.split(y0)
    y01, y11 = tl.split(y1)
    return y00, y01, y10, y11


@triton.jit
def _join4(y0, y1, y2, y3):
    """``_split4``'s inverse: ``[..., 2, 2]`` from the slices indexed 2a + b."""
    return tl.join(tl.join(y0, y2), tl.join(y1, y3))


@triton.jit
def _column_blocks(x):
    """The [16, 16] blocks on and below the diagonal of ``x [64, 64]`` (block (i, j) holds x[16 i + r, 16 j + c]),
    column block by column block: (0, 0), (1, 0), (2, 0), (3, 0), (1, 1), (2, 1), (3, 1), (2, 2), (3, 2), (3, 3)."""
    y = tl.reshape(tl.permute(tl.reshape(x, (4, 16, 4, 16)), (1, 3, 0, 2)), (16, 16, 2, 2, 2, 2))
    c0, c1, c2, c3 = _split4(y)
    b00, b10, b20, b30 = _split4(c0)
    _0, b11, b21, b31 = _split4(c1)
    _1, _2, b22, b32 = _split4(c2)
    _3, _4, _5, b33 = _split4(c3)
    return b00, b10, b20, b30, b11, b21, b31, b22, b32, b33


@triton.jit
def _from_blocks(b00, b10, b11, b20, b21, b22, b30, b31, b32, b33):
    """The lower block triangle ``b_ij`` (i >= j) as a [64, 64] tensor, zeros above it."""
    z = tl.zeros_like(b00)
    y = _join4(_join4(b00, b10, b20, b30), _join4(z, b11, b21, b31), _join4(z, z, b22, b32), _join4(z, z, z, b33))
    return tl.reshape(tl.permute(tl.reshape(y, (16, 16, 4, 4)), (2, 0, 3, 1)), (64, 64))


@triton.jit
def _below_diagonal(A10, A20, A21, A30, A31, A32, X00, X11, X22, X33):
    """The blocks of (I + A)^-1 below its diagonal from the diagonal blocks' inverses X_ii and A's blocks below
    the diagonal: X_ij = X_ii sum_{j <= m < i} A_im X_mj, rows in order, fp32 products (IEEE)."""
    X10 = tl.dot(X11, tl.dot(A10, X00, input_precision="ieee"), input_precision="ieee")
    X21 = tl.dot(X22, tl.dot(A21, X11, input_precision="ieee"), input_precision="ieee")
    X20 = tl.dot(X22, tl.dot(A20, X00, input_precision="ieee") + tl.dot(A21, X10, input_precision="ieee"),
                 input_precision="ieee")
    X32 = tl.dot(X33, tl.dot(A32, X22, input_precision="ieee"), input_precision="ieee")
    X31 = tl.dot(X33, tl.dot(A31, X11, input_precision="ieee") + tl.dot(A32, X21, input_precision="ieee"),
                 input_precision="ieee")
    X30 = tl.dot(X33, tl.dot(A30, X00, input_precision="ieee") + tl.dot(A31, X10, input_precision="ieee") +
                 tl.dot(A32, X20, input_precision="ieee"), input_precision="ieee")
    return X10, X20, X21, X30, X31, X32


@triton.jit
def _unit_lower_inverse(A, BITS: tl.constexpr, FORM: tl.constexpr):
    """bf16((I - A)^-1) of a strictly lower [64, 64] ``A`` (fp32) as a [64, 64] tensor. FORM "blocks": the
    16-row blocks' inverses by ``_inv_diag`` and the blocks below them X_ij = X_ii sum_{j <= m < i} A_im X_mj,
    fp32 products (IEEE); "batched": the same, the four diagonal blocks as one [4, 16, 16] chain of batched
    products."""
    A00, A10, A20, A30, A11, A21, A31, A22, A32, A33 = _column_blocks(A)
    if FORM == "batched":
        X = _inv_diag(tl.permute(tl.reshape(_join4(A00, A11, A22, A33), (16, 16, 4)), (2, 0, 1)))
        X00, X11, X22, X33 = _split4(tl.reshape(tl.permute(X, (1, 2, 0)), (16, 16, 2, 2)))
    else:
        X00 = _inv_diag(A00)
        X11 = _inv_diag(A11)
        X22 = _inv_diag(A22)
        X33 = _inv_diag(A33)
    X10, X20, X21, X30, X31, X32 = _below_diagonal(A10, A20, A21, A30, A31, A32, X00, X11, X22, X33)
    return _bf16(_from_blocks(X00, X10, X11, X20, X21, X22, X30, X31, X32, X33), BITS)


@triton.jit
def _readout_operands(q_ptr, k_ptr, G_ptr, t0, r, valid, sq_t, sq_h, sk_t, sk_h, sG_t, scale, eps, H, HV, hv,
                      K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr, BITS: tl.constexpr):
    """The output's state-free operands of a chunk's rows ``t0 + r``: (bf16(q exp(G)) [64, BK],
    bf16(tril(q k^T) exp(G_i - G_j)) [64, 64])."""
    h = hv // (HV // H)
    qs = _qk(q_ptr, t0, r, valid, sq_t, h, sq_h, K, BK, scale, eps, L2NORM, BITS, False)
    ks = _qk(k_ptr, t0, r, valid, sk_t, h, sk_h, K, BK, 1.0, eps, L2NORM, BITS, False)
    G = tl.load(G_ptr + (t0 + r) * sG_t + hv, mask=valid, other=0.0)
    return _readout_tiles(qs, _mm(qs, tl.trans(ks), BITS), G, _decay(G, r), r, BITS)


@triton.jit
def _decay(G, r):
    """exp(G_i - G_j) on and below the diagonal of a [64, 64] tile, 1 above it."""
    return tl.exp(tl.where(r[:, None] >= r[None, :], G[:, None] - G[None, :], 0.0))


@triton.jit
def _readout_tiles(qs, qk, G, D, r, BITS: tl.constexpr):
    """(bf16(q exp(G)), bf16(tril(q k^T) exp(G_i - G_j))) from the rounded q rows ``qs``, their products with
    the k rows ``qk`` (fp32) and the decay ``D`` (``_decay``)."""
    qkD = _bf16(tl.where(r[:, None] >= r[None, :], qk * D, 0.0), BITS)
    qe = _bf16(qs.to(tl.float32) * tl.exp(G)[:, None], BITS)
    return qe, qkD


# ---------------------------------------------------------------- the kernels

@triton.jit
def _store_lower_product(ptr, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, x0, x1, x2, x3, t0, r0, r1, r2, r3,
                         m0, m1, m2, m3, s_t, col, n: tl.constexpr, BN: tl.constexpr, BITS: tl.constexpr):
    """Rows r0..r3 (valid m0..m3) of bf16(T @ X) stored through ``_store_rows``: T block lower triangular in
    16-row blocks T_ij, X in the matching row blocks x0..x3 (row block i = sum_{j <= i} T_ij x_j)."""
    _store_rows(ptr, _mm(T00, x0, BITS), t0, r0, m0, s_t, col, n, BN, BITS)
    _store_rows(ptr, _mm(T10, x0, BITS) + _mm(T11, x1, BITS), t0, r1, m1, s_t, col, n, BN, BITS)
    _store_rows(ptr, _mm(T20, x0, BITS) + _mm(T21, x1, BITS) + _mm(T22, x2, BITS), t0, r2, m2, s_t, col, n, BN,
                BITS)
    _store_rows(ptr, _mm(T30, x0, BITS) + _mm(T31, x1, BITS) + _mm(T32, x2, BITS) + _mm(T33, x3, BITS), t0, r3, m3,
                s_t, col, n, BN, BITS)


@triton.jit
def _prep_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, chunk_cu_ptr, idx_ptr, G_ptr, W_ptr, U_ptr, Kd_ptr, N, sk_t,
                 sk_h, sv_t, sv_h, sg_t, sb_t, sG_t, sW_t, sU_t, eps, H, HV, K: tl.constexpr, V: tl.constexpr,
                 BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, BITS: tl.constexpr):
    """Step 1 (module docstring) in 16-row blocks, for chunk program_id(0), value head program_id(1)."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    n, t0, length, j = _chunk(c, chunk_cu_ptr, cu_ptr, N)
    if (length > 0) & (tl.load(idx_ptr + n) >= 0):
        h = hv // (HV // H)
        r = tl.arange(0, 16)
        r1, r2, r3 = 16 + r, 32 + r, 48 + r
        v0, v1, v2, v3 = r < length, r1 < length, r2 < length, r3 < length
        k0 = _qk(k_ptr, t0, r, v0, sk_t, h, sk_h, K, BK, 1.0, eps, L2NORM, BITS, False)
        k1 = _qk(k_ptr, t0, r1, v1, sk_t, h, sk_h, K, BK, 1.0, eps, L2NORM, BITS, False)
        k2 = _qk(k_ptr, t0, r2, v2, sk_t, h, sk_h, K, BK, 1.0, eps, L2NORM, BITS, False)
        k3 = _qk(k_ptr, t0, r3, v3, sk_t, h, sk_h, K, BK, 1.0, eps, L2NORM, BITS, False)
        g0, b0 = _gates(g_ptr, beta_ptr, t0, r, v0, sg_t, sb_t, hv)
        g1, b1 = _gates(g_ptr, beta_ptr, t0, r1, v1, sg_t, sb_t, hv)
        g2, b2 = _gates(g_ptr, beta_ptr, t0, r2, v2, sg_t, sb_t, hv)
        g3, b3 = _gates(g_ptr, beta_ptr, t0, r3, v3, sg_t, sb_t, hv)
        G0 = tl.cumsum(g0, axis=0)
        G1 = tl.cumsum(g1, axis=0) + tl.sum(g0, axis=0)
        G2 = tl.cumsum(g2, axis=0) + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0))
        G3 = tl.cumsum(g3, axis=0) + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0) + tl.sum(g2, axis=0))
        tl.store(G_ptr + (t0 + r) * sG_t + hv, G0, mask=v0)
        tl.store(G_ptr + (t0 + r1) * sG_t + hv, G1, mask=v1)
        tl.store(G_ptr + (t0 + r2) * sG_t + hv, G2, mask=v2)
        tl.store(G_ptr + (t0 + r3) * sG_t + hv, G3, mask=v3)
        G_last = _at_last(G0, r, length) + _at_last(G1, r1, length) + _at_last(G2, r2, length) + \
            _at_last(G3, r3, length)
        X00 = _inv_diag(_a_block(k0, k0, b0, G0, G0, True, BITS))
        X11 = _inv_diag(_a_block(k1, k1, b1, G1, G1, True, BITS))
        X22 = _inv_diag(_a_block(k2, k2, b2, G2, G2, True, BITS))
        X33 = _inv_diag(_a_block(k3, k3, b3, G3, G3, True, BITS))
        A10 = _a_block(k1, k0, b1, G1, G0, False, BITS)
        A20 = _a_block(k2, k0, b2, G2, G0, False, BITS)
        A21 = _a_block(k2, k1, b2, G2, G1, False, BITS)
        A30 = _a_block(k3, k0, b3, G3, G0, False, BITS)
        A31 = _a_block(k3, k1, b3, G3, G1, False, BITS)
        A32 = _a_block(k3, k2, b3, G3, G2, False, BITS)
        X10, X20, X21, X30, X31, X32 = _below_diagonal(A10, A20, A21, A30, A31, A32, X00, X11, X22, X33)
        T00, T11, T22, T33 = _bf16(X00, BITS), _bf16(X11, BITS), _bf16(X22, BITS), _bf16(X33, BITS)
        T10, T20, T21 = _bf16(X10, BITS), _bf16(X20, BITS), _bf16(X21, BITS)
        T30, T31, T32 = _bf16(X30, BITS), _bf16(X31, BITS), _bf16(X32, BITS)
        kf0, kf1, kf2, kf3 = k0.to(tl.float32), k1.to(tl.float32), k2.to(tl.float32), k3.to(tl.float32)
        # W = bf16(T @ bf16(beta exp(G) k)), block row by block row
        e0 = _bf16((b0 * tl.exp(G0))[:, None] * kf0, BITS)
        e1 = _bf16((b1 * tl.exp(G1))[:, None] * kf1, BITS)
        e2 = _bf16((b2 * tl.exp(G2))[:, None] * kf2, BITS)
        e3 = _bf16((b3 * tl.exp(G3))[:, None] * kf3, BITS)
        col = hv * K
        _store_lower_product(W_ptr, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, e0, e1, e2, e3, t0, r, r1, r2,
                             r3, v0, v1, v2, v3, sW_t, col, K, BK, BITS)
        # the state increment's operand bf16(k exp(G_last - G))
        _store_rows(Kd_ptr, kf0 * tl.exp(G_last - G0)[:, None], t0, r, v0, sW_t, col, K, BK, BITS)
        _store_rows(Kd_ptr, kf1 * tl.exp(G_last - G1)[:, None], t0, r1, v1, sW_t, col, K, BK, BITS)
        _store_rows(Kd_ptr, kf2 * tl.exp(G_last - G2)[:, None], t0, r2, v2, sW_t, col, K, BK, BITS)
        _store_rows(Kd_ptr, kf3 * tl.exp(G_last - G3)[:, None], t0, r3, v3, sW_t, col, K, BK, BITS)
        # U = bf16(T @ bf16(beta v))
        vv = tl.arange(0, BV)
        vm = (vv < V)[None, :]
        vp = v_ptr + hv * sv_h + vv[None, :]
        u0 = _bf16(b0[:, None] * tl.load(vp + (t0 + r)[:, None] * sv_t, mask=v0[:, None] & vm, other=0.0)
                   .to(tl.float32), BITS)
        u1 = _bf16(b1[:, None] * tl.load(vp + (t0 + r1)[:, None] * sv_t, mask=v1[:, None] & vm, other=0.0)
                   .to(tl.float32), BITS)
        u2 = _bf16(b2[:, None] * tl.load(vp + (t0 + r2)[:, None] * sv_t, mask=v2[:, None] & vm, other=0.0)
                   .to(tl.float32), BITS)
        u3 = _bf16(b3[:, None] * tl.load(vp + (t0 + r3)[:, None] * sv_t, mask=v3[:, None] & vm, other=0.0)
                   .to(tl.float32), BITS)
        col = hv * V
        _store_lower_product(U_ptr, T00, T10, T11, T20, T21, T22, T30, T31, T32, T33, u0, u1, u2, u3, t0, r, r1, r2,
                             r3, v0, v1, v2, v3, sU_t, col, V, BV, BITS)


@triton.jit
def _prep_tiles_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, cu_ptr, chunk_cu_ptr, idx_ptr, G_ptr, W_ptr, U_ptr, Kd_ptr, N,
                       sk_t, sk_h, sv_t, sv_h, sg_t, sb_t, sG_t, sW_t, sU_t, eps, H, HV, q_ptr, qe_ptr, qkd_ptr,
                       sq_t, sq_h, sD_t, scale, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                       BV: tl.constexpr, L2NORM: tl.constexpr, BITS: tl.constexpr, HEADS: tl.constexpr,
                       READOUT: tl.constexpr, RCP: tl.constexpr, FORM: tl.constexpr):
    """Step 1 (module docstring) for chunk program_id(0), value heads HEADS program_id(1) + [0, HEADS) of one
    key head (k, its norm and k k^T computed once for them): A, W, U one dot each over the whole chunk, only
    the solve in the FORM of ``_unit_lower_inverse``; the norms by reciprocal where RCP (``_qk``); with READOUT
    step 2 too (q, its norm and q k^T once for the heads)."""
    c = tl.program_id(0)
    hv0 = tl.program_id(1) * HEADS
    n, t0, length, j = _chunk(c, chunk_cu_ptr, cu_ptr, N)
    if (length > 0) & (tl.load(idx_ptr + n) >= 0):
        h = hv0 // (HV // H)
        r = tl.arange(0, 64)
        valid = r < length
        ks = _qk(k_ptr, t0, r, valid, sk_t, h, sk_h, K, BK, 1.0, eps, L2NORM, BITS, RCP)
        if READOUT:     # first, for every head: q and q k^T are then dead before the solves
            qs = _qk(q_ptr, t0, r, valid, sq_t, h, sq_h, K, BK, scale, eps, L2NORM, BITS, RCP)
            qk = _mm(qs, tl.trans(ks), BITS)
            for i in tl.static_range(HEADS):
                g, beta = _gates(g_ptr, beta_ptr, t0, r, valid, sg_t, sb_t, hv0 + i)
                G = tl.cumsum(g, axis=0)
                qe, qkD = _readout_tiles(qs, qk, G, _decay(G, r), r, BITS)
                _store_rows(qe_ptr, qe, t0, r, valid, sW_t, (hv0 + i) * K, K, BK, BITS)
                _store_rows(qkd_ptr, qkD, t0, r, valid, sD_t, (hv0 + i) * 64, 64, 64, BITS)
        kk = _mm(ks, tl.trans(ks), BITS)
        kf = ks.to(tl.float32)
        strict = r[:, None] > r[None, :]
        vv = tl.arange(0, BV)
        for i in tl.static_range(HEADS):
            hv = hv0 + i
            g, beta = _gates(g_ptr, beta_ptr, t0, r, valid, sg_t, sb_t, hv)
            G = tl.cumsum(g, axis=0)
            tl.store(G_ptr + (t0 + r) * sG_t + hv, G, mask=valid)
            G_last = _at_last(G, r, length)
            Tm = _unit_lower_inverse(_bf16(tl.where(strict, -beta[:, None] * kk * _decay(G, r), 0.0), BITS)
                                     .to(tl.float32), BITS, FORM)
            _store_rows(W_ptr, _mm(Tm, _bf16((beta * tl.exp(G))[:, None] * kf, BITS), BITS), t0, r, valid, sW_t,
                        hv * K, K, BK, BITS)
            _store_rows(Kd_ptr, kf * tl.exp(G_last - G)[:, None], t0, r, valid, sW_t, hv * K, K, BK, BITS)
            vs = tl.load(v_ptr + (t0 + r)[:, None] * sv_t + hv * sv_h + vv[None, :],
                         mask=valid[:, None] & (vv < V)[None, :], other=0.0).to(tl.float32)
            _store_rows(U_ptr, _mm(Tm, _bf16(beta[:, None] * vs, BITS), BITS), t0, r, valid, sU_t, hv * V, V, BV,
                        BITS)


@triton.jit
def _readout_kernel(q_ptr, k_ptr, cu_ptr, chunk_cu_ptr, idx_ptr, G_ptr, qe_ptr, qkd_ptr, N, sq_t, sq_h, sk_t, sk_h,
                    sG_t, sW_t, sD_t, scale, eps, H, HV, K: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr,
                    BITS: tl.constexpr):
    """Step 2 (module docstring) for chunk program_id(0), value head program_id(1)."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    n, t0, length, j = _chunk(c, chunk_cu_ptr, cu_ptr, N)
    if (length > 0) & (tl.load(idx_ptr + n) >= 0):
        r = tl.arange(0, 64)
        valid = r < length
        qe, qkD = _readout_operands(q_ptr, k_ptr, G_ptr, t0, r, valid, sq_t, sq_h, sk_t, sk_h, sG_t, scale, eps,
                                    H, HV, hv, K, BK, L2NORM, BITS)
        _store_rows(qe_ptr, qe, t0, r, valid, sW_t, hv * K, K, BK, BITS)
        _store_rows(qkd_ptr, qkD, t0, r, valid, sD_t, hv * 64, 64, 64, BITS)


@triton.jit
def _grid_item(HV, tiles):
    """(outer index, value head, tile) of this program in a 1-D grid numbering (outer, value head, tile) in that
    order, the tile fastest (``tiles`` a value head)."""
    pid = tl.program_id(0)
    return pid // (HV * tiles), (pid // tiles) % HV, pid % tiles


@triton.jit
def _w_kd(W_ptr, Kd_ptr, t0, r, mask, sW_t, hv, kk, K: tl.constexpr, BITS: tl.constexpr):
    """Rows ``t0 + r`` (where ``mask``), columns ``kk`` of value head ``hv`` of W and bf16(k exp(G_last - G))
    (bf16 [T, HV, K]; in the interpreter held in fp32)."""
    W = tl.load(W_ptr + (t0 + r)[:, None] * sW_t + hv * K + kk[None, :], mask=mask, other=0.0)
    Kd = tl.load(Kd_ptr + (t0 + r)[:, None] * sW_t + hv * K + kk[None, :], mask=mask, other=0.0)
    if BITS:
        W = W.to(tl.float32)
        Kd = Kd.to(tl.float32)
    return W, Kd


@triton.jit
def _chunk_step(S, hs, U, W, Kd, G_last, BITS: tl.constexpr):
    """One chunk of the state recurrence from S (fp32) and its dot operand hs: (v_new = bf16(U - W @ hs),
    exp(G_last) S + Kd^T @ v_new)."""
    vn = _bf16(U - _mm(W, hs, BITS), BITS)
    return vn, S * tl.exp(G_last) + _mm(tl.trans(Kd), vn, BITS)


@triton.jit
def _state_chunks(S, j0, j1, bos, length, c0, hv, kk, vv, G_ptr, W_ptr, U_ptr, Kd_ptr, state_ptr, h_ptr, vn_ptr,
                  qe_ptr, qkd_ptr, o_ptr, sG_t, sW_t, sU_t, sD_t, so_t, so_h, interval, HV, K: tl.constexpr,
                  V: tl.constexpr, READOUT: tl.constexpr, STAGES: tl.constexpr, BITS: tl.constexpr):
    """Step 3's body (module docstring): the state S (fp32 [BK, BV], rows ``kk``, value columns ``vv`` of value
    head ``hv``) carried through chunks j0 .. j1 - 1 of the sequence of tokens bos .. bos + length - 1 (c0 its
    first chunk in the chunk table: h's rows), the output (READOUT) or h and v_new stored on the way; the 16-bit
    pool's rounding after every ``interval`` tokens of the sequence (``state_ptr``'s dtype). Returns S."""
    r = tl.arange(0, 64)
    m2 = (kk < K)[:, None] & (vv < V)[None, :]
    tile = hv * (K * V) + kk[:, None] * V + vv[None, :]
    for j in tl.range(j0, j1, num_stages=STAGES):
        t0 = bos + j * 64
        rows = tl.minimum(length - j * 64, 64)
        valid = r < rows
        vm = valid[:, None] & (vv < V)[None, :]
        km = valid[:, None] & (kk < K)[None, :]
        W, Kd = _w_kd(W_ptr, Kd_ptr, t0, r, km, sW_t, hv, kk, K, BITS)
        U = tl.load(U_ptr + (t0 + r)[:, None] * sU_t + hv * V + vv[None, :], mask=vm, other=0.0).to(tl.float32)
        G_last = tl.load(G_ptr + (t0 + rows - 1) * sG_t + hv)
        hs = _bf16(S, BITS)
        vn, S = _chunk_step(S, hs, U, W, Kd, G_last, BITS)
        if READOUT:
            qe = tl.load(qe_ptr + (t0 + r)[:, None] * sW_t + hv * K + kk[None, :], mask=km, other=0.0)
            qkd = tl.load(qkd_ptr + (t0 + r)[:, None] * sD_t + hv * 64 + r[None, :], mask=valid[:, None],
                          other=0.0)
            if BITS:
                qe = qe.to(tl.float32)
                qkd = qkd.to(tl.float32)
            o = _mm(qe, hs, BITS) + _mm(qkd, vn, BITS)
            tl.store(o_ptr + (t0 + r)[:, None] * so_t + hv * so_h + vv[None, :], _rounded(o, o_ptr, BITS),
                     mask=vm)
        else:
            tl.store(h_ptr + (c0 + j) * (HV * K * V) + tile, _rounded(hs, h_ptr, BITS), mask=m2)
            tl.store(vn_ptr + (t0 + r)[:, None] * sU_t + hv * V + vv[None, :], _rounded(vn, vn_ptr, BITS),
                     mask=vm)
        if state_ptr.dtype.element_ty != tl.float32:   # a select, not a branch: the loop stays pipelined
            S = tl.where(((j * 64 + rows) % interval == 0) & (j * 64 + rows < length),
                         _rounded(S, state_ptr, BITS).to(tl.float32), S)
    return S


@triton.jit
def _zero_rows(o_ptr, bos, length, j0, j1, hv, vv, so_t, so_h, V: tl.constexpr, BV: tl.constexpr,
               BITS: tl.constexpr):
    """Zeros into the output rows of chunks j0 .. j1 - 1 (columns ``vv`` of value head ``hv``) of a padding
    sequence of tokens bos .. bos + length - 1."""
    r = tl.arange(0, 64)
    for j in range(j0, j1):
        vm = (r < length - j * 64)[:, None] & (vv < V)[None, :]
        tl.store(o_ptr + (bos + j * 64 + r)[:, None] * so_t + hv * so_h + vv[None, :],
                 _rounded(tl.zeros((64, BV), tl.float32), o_ptr, BITS), mask=vm)


@triton.jit
def _state_kernel(cu_ptr, chunk_cu_ptr, idx_ptr, G_ptr, W_ptr, U_ptr, Kd_ptr, state_ptr, h_ptr, vn_ptr, qe_ptr,
                  qkd_ptr, o_ptr, sG_t, sW_t, sU_t, sD_t, so_t, so_h, s_slot, interval, HV, K: tl.constexpr,
                  V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, READOUT: tl.constexpr, STAGES: tl.constexpr,
                  BITS: tl.constexpr):
    """Step 3 (module docstring) for one (sequence, value head, V-tile), program_id(0) numbering them in that
    order, V-tile fastest: the V-tiles of one value head, which read the same W, k and readout tiles, are
    launched side by side (a grid of more than one wave then reads those tiles from memory once, not once a
    V-tile); with READOUT the output too (a padding sequence's rows written as zeros), else h and v_new stored."""
    n, hv, vt = _grid_item(HV, (V + BV - 1) // BV)
    slot = tl.load(idx_ptr + n).to(tl.int64)
    bos = tl.load(cu_ptr + n).to(tl.int64)
    length = tl.load(cu_ptr + n + 1).to(tl.int64) - bos
    kk = tl.arange(0, BK)
    vv = vt * BV + tl.arange(0, BV)
    if slot >= 0:
        c0 = tl.load(chunk_cu_ptr + n).to(tl.int64)
        m2 = (kk < K)[:, None] & (vv < V)[None, :]
        tile = hv * (K * V) + kk[:, None] * V + vv[None, :]
        S = tl.load(state_ptr + slot * s_slot + tile, mask=m2, other=0.0).to(tl.float32)
        S = _state_chunks(S, 0, tl.cdiv(length, 64), bos, length, c0, hv, kk, vv, G_ptr, W_ptr, U_ptr, Kd_ptr,
                          state_ptr, h_ptr, vn_ptr, qe_ptr, qkd_ptr, o_ptr, sG_t, sW_t, sU_t, sD_t, so_t, so_h,
                          interval, HV, K, V, READOUT, STAGES, BITS)
        tl.store(state_ptr + slot * s_slot + tile, _rounded(S, state_ptr, BITS), mask=m2)
    elif READOUT:
        _zero_rows(o_ptr, bos, length, 0, tl.cdiv(length, 64), hv, vv, so_t, so_h, V, BV, BITS)


# ---------------------------------------------------------------- the segmented state pass (``segment_chunks``)

@triton.jit
def _maps_kernel(cu_ptr, seg_cu_ptr, idx_ptr, G_ptr, W_ptr, U_ptr, Kd_ptr, M_ptr, N, sG_t, sW_t, sU_t, SEG, HV,
                 K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, STAGES: tl.constexpr,
                 BITS: tl.constexpr):
    """The affine map S -> A S + B of one segment's chunks (every segment of a sequence but its last, whose SEG
    chunks are all full) for one (segment, value head, BC-column tile of the K + V columns of [A | B]),
    program_id(0) numbering them in that order, the tile fastest: M = [A | B] from [I | 0], per chunk
    M = exp(G_last) M + bf16(k exp(G_last - G))^T bf16([0 | U] - W @ bf16(M)) (the state pass's roundings but
    the 16-bit pool's), fp32; stored fp32 into M [segments, HV, K, K + V]."""
    ta = (K + BC - 1) // BC
    s, hv, ct = _grid_item(HV, ta + (V + BC - 1) // BC)
    n = _owner(s, seg_cu_ptr, N)
    i = s - tl.load(seg_cu_ptr + n)
    last = tl.load(seg_cu_ptr + n + 1) - 1 - tl.load(seg_cu_ptr + n)
    if (i < last) & (tl.load(idx_ptr + n) >= 0):
        bos = tl.load(cu_ptr + n).to(tl.int64)
        is_b = ct >= ta
        col = tl.where(is_b, ct - ta, ct) * BC + tl.arange(0, BC)       # within A or within B
        cm = col < tl.where(is_b, V, K)
        kk = tl.arange(0, BK)
        r = tl.arange(0, 64)
        km = (kk < K)[None, :]
        M = tl.where((kk[:, None] == col[None, :]) & (~is_b), 1.0, 0.0)
        for j in tl.range(i * SEG, (i + 1) * SEG, num_stages=STAGES):
            t0 = bos + j * 64
            W, Kd = _w_kd(W_ptr, Kd_ptr, t0, r, km, sW_t, hv, kk, K, BITS)
            X = tl.load(U_ptr + (t0 + r)[:, None] * sU_t + hv * V + col[None, :], mask=(cm & is_b)[None, :],
                        other=0.0).to(tl.float32)
            G_last = tl.load(G_ptr + (t0 + 63) * sG_t + hv)
            _, M = _chunk_step(M, _bf16(M, BITS), X, W, Kd, G_last, BITS)
        out = M_ptr + (s.to(tl.int64) * HV + hv) * (K * (K + V)) + kk[:, None] * (K + V) + tl.where(is_b, K, 0)
        tl.store(out + col[None, :], M, mask=(kk < K)[:, None] & cm[None, :])


@triton.jit
def _merge_kernel(seg_cu_ptr, idx_ptr, state_ptr, M_ptr, start_ptr, s_slot, HV, K: tl.constexpr, V: tl.constexpr,
                  BK: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, STAGES: tl.constexpr):
    """The segments' start states of one (sequence, value head, V-tile), program_id(0) numbering them in that
    order: S_0 the pool slot's state (fp32), S_{i+1} = A_i S_i + B_i (``_maps_kernel``'s maps; fp32 operands,
    the dot at PRECISION) stored into start [segments, HV, K, V] (fp32) at the sequence's segment i + 1."""
    n, hv, vt = _grid_item(HV, (V + BV - 1) // BV)
    slot = tl.load(idx_ptr + n).to(tl.int64)
    if slot >= 0:
        s0 = tl.load(seg_cu_ptr + n).to(tl.int64)
        segs = tl.load(seg_cu_ptr + n + 1) - tl.load(seg_cu_ptr + n)
        kk = tl.arange(0, BK)
        vv = vt * BV + tl.arange(0, BV)
        m2 = (kk < K)[:, None] & (vv < V)[None, :]
        S = tl.load(state_ptr + slot * s_slot + hv * (K * V) + kk[:, None] * V + vv[None, :], mask=m2,
                    other=0.0).to(tl.float32)
        for i in tl.range(0, segs - 1, num_stages=STAGES):
            maps = M_ptr + ((s0 + i) * HV + hv) * (K * (K + V)) + kk[:, None] * (K + V)
            A = tl.load(maps + kk[None, :], mask=(kk < K)[:, None] & (kk < K)[None, :], other=0.0)
            B = tl.load(maps + K + vv[None, :], mask=m2, other=0.0)
            S = tl.dot(A, S, input_precision=PRECISION) + B
            tl.store(start_ptr + ((s0 + i + 1) * HV + hv) * (K * V) + kk[:, None] * V + vv[None, :], S, mask=m2)


@triton.jit
def _segment_state_kernel(cu_ptr, chunk_cu_ptr, seg_cu_ptr, idx_ptr, G_ptr, W_ptr, U_ptr, Kd_ptr, state_ptr,
                          start_ptr, h_ptr, vn_ptr, qe_ptr, qkd_ptr, o_ptr, N, SEG, sG_t, sW_t, sU_t, sD_t, so_t,
                          so_h, s_slot, interval, HV, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                          BV: tl.constexpr, READOUT: tl.constexpr, STAGES: tl.constexpr, BITS: tl.constexpr):
    """Step 3 on a segment grid for one (segment, value head, V-tile), program_id(0) numbering them in that
    order, V-tile fastest: ``_state_chunks`` over the segment's chunks from its start state (the first segment
    of a sequence: the pool slot's; the others: ``_merge_kernel``'s, rounded to a 16-bit pool's dtype where the
    sequence's ``interval`` rounding falls on the segment's first token); the last segment stores the pool."""
    s, hv, vt = _grid_item(HV, (V + BV - 1) // BV)
    n = _owner(s, seg_cu_ptr, N)
    i = s - tl.load(seg_cu_ptr + n)
    if s < tl.load(seg_cu_ptr + N):
        slot = tl.load(idx_ptr + n).to(tl.int64)
        bos = tl.load(cu_ptr + n).to(tl.int64)
        length = tl.load(cu_ptr + n + 1).to(tl.int64) - bos
        j0 = i * SEG
        j1 = tl.minimum(j0 + SEG, tl.cdiv(length, 64))
        kk = tl.arange(0, BK)
        vv = vt * BV + tl.arange(0, BV)
        m2 = (kk < K)[:, None] & (vv < V)[None, :]
        tile = hv * (K * V) + kk[:, None] * V + vv[None, :]
        if slot >= 0:
            if i == 0:
                S = tl.load(state_ptr + slot * s_slot + tile, mask=m2, other=0.0).to(tl.float32)
            else:
                S = tl.load(start_ptr + s.to(tl.int64) * (HV * K * V) + tile, mask=m2, other=0.0)
                if state_ptr.dtype.element_ty != tl.float32:
                    S = tl.where((j0 * 64) % interval == 0, _rounded(S, state_ptr, BITS).to(tl.float32), S)
            c0 = tl.load(chunk_cu_ptr + n).to(tl.int64)
            S = _state_chunks(S, j0, j1, bos, length, c0, hv, kk, vv, G_ptr, W_ptr, U_ptr, Kd_ptr, state_ptr,
                              h_ptr, vn_ptr, qe_ptr, qkd_ptr, o_ptr, sG_t, sW_t, sU_t, sD_t, so_t, so_h, interval,
                              HV, K, V, READOUT, STAGES, BITS)
            if j1 * 64 >= length:
                tl.store(state_ptr + slot * s_slot + tile, _rounded(S, state_ptr, BITS), mask=m2)
        elif READOUT:
            _zero_rows(o_ptr, bos, length, j0, j1, hv, vv, so_t, so_h, V, BV, BITS)


@triton.jit
def _output_kernel(q_ptr, k_ptr, cu_ptr, chunk_cu_ptr, idx_ptr, G_ptr, h_ptr, vn_ptr, o_ptr, N, sq_t, sq_h, sk_t,
                   sk_h, sG_t, sU_t, so_t, so_h, scale, eps, H, HV, K: tl.constexpr,
                   V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr,
                   BITS: tl.constexpr):
    """The output after the state pass (``readout=False``, module docstring) for chunk program_id(0), value head
    program_id(1), V-tile program_id(2); a padding sequence's rows are written as zeros."""
    c = tl.program_id(0)
    hv = tl.program_id(1)
    vt = tl.program_id(2)
    n, t0, length, j = _chunk(c, chunk_cu_ptr, cu_ptr, N)
    r = tl.arange(0, 64)
    valid = r < length
    vv = vt * BV + tl.arange(0, BV)
    om = valid[:, None] & (vv < V)[None, :]
    optrs = o_ptr + (t0 + r)[:, None] * so_t + hv * so_h + vv[None, :]
    if length > 0:
        if tl.load(idx_ptr + n) >= 0:
            kk = tl.arange(0, BK)
            qe, qkD = _readout_operands(q_ptr, k_ptr, G_ptr, t0, r, valid, sq_t, sq_h, sk_t, sk_h, sG_t, scale, eps,
                                        H, HV, hv, K, BK, L2NORM, BITS)
            hs = tl.load(h_ptr + c.to(tl.int64) * (HV * K * V) + hv * (K * V) + kk[:, None] * V + vv[None, :],
                         mask=(kk < K)[:, None] & (vv < V)[None, :], other=0.0)
            vn = tl.load(vn_ptr + (t0 + r)[:, None] * sU_t + hv * V + vv[None, :], mask=om, other=0.0)
            if BITS:
                hs = hs.to(tl.float32)
                vn = vn.to(tl.float32)
            o = _mm(qe, hs, BITS) + _mm(qkD, vn, BITS)
            tl.store(optrs, _rounded(o, o_ptr, BITS), mask=om)
        else:
            tl.store(optrs, _rounded(tl.zeros((64, BV), tl.float32), o_ptr, BITS), mask=om)


# ---------------------------------------------------------------- the launcher

def _blocks(K: int, V: int) -> tuple[int, int]:
    """(BK, BV): powers of two, at least 16 (the smallest dot)."""
    return max(16, triton.next_power_of_2(K)), max(16, triton.next_power_of_2(V))


def chunked(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
            l2norm_eps=1e-6, chunk_size=CHUNK, state_write_interval=None, out=None, workspace=None):
    """Chunked prefill of packed sequences (module docstring): q, k ``[T, H, K]``, v ``[T, HV, V]`` (one float
    dtype), g (float32 log decay) and beta ``[T, HV]``, ``cu_seqlens`` int32 ``[N + 1]``, ``state_indices``
    int32 ``[N]``; ``state [S, HV, K, V]`` (float32, bfloat16, float16) updated in place; ``chunk_size`` 64;
    ``state_write_interval`` a multiple of it (default 64). Returns ``out [T, HV, V]`` (default: q's dtype)."""
    out, launches = stages(q, k, v, g, beta, cu_seqlens, state, state_indices, scale=scale,
                           use_qk_l2norm=use_qk_l2norm, l2norm_eps=l2norm_eps, chunk_size=chunk_size,
                           state_write_interval=state_write_interval, out=out, workspace=workspace)
    for _, launch in launches:
        launch()
    return out


def stages(q, k, v, g, beta, cu_seqlens, state, state_indices, *, scale=None, use_qk_l2norm=True,
           l2norm_eps=1e-6, chunk_size=CHUNK, state_write_interval=None, out=None, workspace=None,
           readout=READOUT, prep=PREP, state_block_v=STATE_BV, state_warps=WARPS, state_stages=STATE_STAGES,
           prep_warps=PREP_WARPS, prep_heads=None, prep_readout=None, prep_norm=PREP_NORM, prep_form=None,
           prep_registers=None, segment_chunks=None, maps_block=MAPS_BC, maps_warps=MAPS_WARPS,
           maps_stages=MAPS_STAGES):
    """``chunked``'s checks and buffers: (out, [(stage name, launch)]), the launches in order (each a
    no-argument callable; a stage can be timed alone once those before it have run): "prep", "readout"
    unless ``prep_readout`` (the prep kernel computes the readout operands), "maps" and "merge" with
    ``segment_chunks``, "state", and "output" unless ``readout`` (the state pass writes the output).
    ``segment_chunks`` (None: the serial state pass) splits each sequence into segments of that many chunks
    (its last segment: the rest) whose state passes run side by side from start states merged from the
    segments' affine maps (module docstring, "Segmented state pass"; the ``bf16-operands-segmented`` rounding
    model); the maps kernel's column tile (a power of two in [16, 256]), warps and pipeline stages are
    ``maps_block``, ``maps_warps``, ``maps_stages``. The state pass's V-tile (a power of two, at least 16),
    warps and software-pipeline stages, the prep kernel's warps, and the "tiles" prep kernel's value heads per
    program (a divisor of the value heads per key head), its solve's form (``PREP_FORM``) and its norms
    (``PREP_NORM``) are tunable; ``prep_registers`` caps the prep kernel's registers a thread (``maxnreg``, 32
    to 255, NVIDIA only; default the compiler's choice). Left at None, the "tiles" kernel runs ``PREP_HEADS``
    value heads a program where they divide the group (else one), computes the readout operands
    (``PREP_READOUT``) when the state pass writes the output, and solves in ``PREP_FORM``; the "blocks"
    kernel runs its one form."""
    import torch

    from reference.gdn.arguments import interval as check_interval

    if isinstance(chunk_size, bool) or chunk_size != CHUNK:
        raise ValueError(f"chunk_size: these kernels run 64-token chunks, got {chunk_size!r}")
    every = check_interval(CHUNK if state_write_interval is None else state_write_interval, CHUNK)
    dev, (T, H, HV, K, V, N), cu, idx, scale, eps, out = _packed(
        q, k, v, g, beta, cu_seqlens, state, state_indices, scale, l2norm_eps, out, workspace)
    if state_block_v not in (16, 32, 64, 128, 256) or state_warps not in (1, 2, 4, 8, 16) \
            or prep_warps not in (1, 2, 4, 8, 16) or state_stages not in (1, 2, 3, 4):
        raise ValueError(f"state_block_v, state_warps, prep_warps, state_stages: expected a power of two in "
                         f"[16, 256], two in [1, 16] and one of 1-4, got {state_block_v!r}, {state_warps!r}, "
                         f"{prep_warps!r}, {state_stages!r}")
    chunk_cu = torch.zeros(N + 1, dtype=torch.int32, device=dev)
    chunk_cu[1:] = torch.cumsum((cu[1:] - cu[:-1] + CHUNK - 1) // CHUNK, 0, dtype=torch.int32)
    bound = T // CHUNK + N                       # at least the chunks of any N sequences of T tokens
    BK, BV = _blocks(K, V)
    bits = interpreting()
    readout = bool(readout)
    f32, bf16 = torch.float32, torch.bfloat16
    G = torch.empty((T, HV), dtype=f32, device=dev)
    W = torch.empty((T, HV, K), dtype=bf16, device=dev)
    Kd = torch.empty((T, HV, K), dtype=bf16, device=dev)
    U = torch.empty((T, HV, V), dtype=bf16, device=dev)
    if readout:     # the output's operands; h and v_new stay in the state pass's registers
        qe = torch.empty((T, HV, K), dtype=bf16, device=dev)
        qkd = torch.empty((T, HV, CHUNK), dtype=bf16, device=dev)
        vn = hs = W                              # not read or written
    else:
        vn = torch.empty((T, HV, V), dtype=bf16, device=dev)
        hs = torch.empty((bound, HV, K, V), dtype=bf16, device=dev)
        qe = qkd = W                             # not read or written
    norm = bool(use_qk_l2norm)
    sbv = BV if bits else min(BV, state_block_v)

    if prep not in PREP_KERNELS:
        raise ValueError(f"prep: expected one of {sorted(PREP_KERNELS)}, got {prep!r}")
    tiles = prep == "tiles"
    if prep_heads is None:
        prep_heads = PREP_HEADS if tiles and (HV // H) % PREP_HEADS == 0 else 1
    if prep_readout is None:
        prep_readout = PREP_READOUT and tiles and readout
    if prep_form is None:
        prep_form = PREP_FORM if tiles else "blocks"
    _check_prep_variant(prep, prep_heads, prep_readout, prep_norm, prep_form, readout, HV // H)
    if prep_registers is not None and (isinstance(prep_registers, bool) or not isinstance(prep_registers, int)
                                       or not 32 <= prep_registers <= 255):
        raise ValueError(f"prep_registers: expected None or an int in [32, 255], got {prep_registers!r}")
    cap = {} if prep_registers is None or bits else {"maxnreg": prep_registers}
    prep_readout = bool(prep_readout)
    segments = _segments(segment_chunks, maps_block, maps_warps, maps_stages, cu, T, N, HV, K, V)

    def prep_pass():
        args = (k, v, g, beta, cu, chunk_cu, idx, G, W, U, Kd, N, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                g.stride(0), beta.stride(0), G.stride(0), W.stride(0), U.stride(0), eps, H, HV)
        if prep == "blocks":
            _prep_kernel[(bound, HV)](*args, K=K, V=V, BK=BK, BV=BV, L2NORM=norm, BITS=bits, num_warps=prep_warps,
                                      **cap)
        else:
            _prep_tiles_kernel[(bound, HV // prep_heads)](
                *args, q, qe, qkd, q.stride(0), q.stride(1), qkd.stride(0), scale, K=K, V=V, BK=BK, BV=BV,
                L2NORM=norm, BITS=bits, HEADS=prep_heads, READOUT=prep_readout,
                RCP=prep_norm == "rcp", FORM=prep_form, num_warps=prep_warps, **cap)

    def readout_operands():
        _readout_kernel[(bound, HV)](
            q, k, cu, chunk_cu, idx, G, qe, qkd, N, q.stride(0), q.stride(1), k.stride(0), k.stride(1), G.stride(0),
            qe.stride(0), qkd.stride(0), scale, eps, H, HV, K=K, BK=BK, L2NORM=norm, BITS=bits, num_warps=WARPS)

    def state_pass():
        if segments is not None:
            seg_cu, seg_bound, _, start = segments
            _segment_state_kernel[(seg_bound * HV * triton.cdiv(V, sbv),)](
                cu, chunk_cu, seg_cu, idx, G, W, U, Kd, state, start, hs, vn, qe, qkd, out, N, segment_chunks,
                G.stride(0), W.stride(0), U.stride(0), qkd.stride(0), out.stride(0), out.stride(1), state.stride(0),
                every, HV, K=K, V=V, BK=BK, BV=sbv, READOUT=readout, STAGES=state_stages, BITS=bits,
                num_warps=state_warps)
            return
        _state_kernel[(N * HV * triton.cdiv(V, sbv),)](
            cu, chunk_cu, idx, G, W, U, Kd, state, hs, vn, qe, qkd, out, G.stride(0), W.stride(0), U.stride(0),
            qkd.stride(0), out.stride(0), out.stride(1), state.stride(0), every, HV, K=K, V=V, BK=BK, BV=sbv,
            READOUT=readout, STAGES=state_stages, BITS=bits, num_warps=state_warps)

    def maps():
        seg_cu, seg_bound, M, _ = segments
        bc = max(BK, BV) if bits else maps_block
        _maps_kernel[(seg_bound * HV * (triton.cdiv(K, bc) + triton.cdiv(V, bc)),)](
            cu, seg_cu, idx, G, W, U, Kd, M, N, G.stride(0), W.stride(0), U.stride(0), segment_chunks, HV, K=K, V=V,
            BK=BK, BC=bc, STAGES=maps_stages, BITS=bits, num_warps=maps_warps)

    def merge():
        seg_cu, _, M, start = segments
        precision = "ieee" if bits or torch.version.hip else MERGE_PRECISION
        mbv = BV if bits else min(BV, MERGE_BV)
        _merge_kernel[(N * HV * triton.cdiv(V, mbv),)](
            seg_cu, idx, state, M, start, state.stride(0), HV, K=K, V=V, BK=BK, BV=mbv, PRECISION=precision,
            STAGES=MERGE_STAGES, num_warps=MERGE_WARPS)

    def output():
        _output_kernel[(bound, HV, 1)](
            q, k, cu, chunk_cu, idx, G, hs, vn, out, N, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            G.stride(0), U.stride(0), out.stride(0), out.stride(1), scale, eps, H, HV, K=K, V=V, BK=BK, BV=BV,
            L2NORM=norm, BITS=bits, num_warps=WARPS)

    passes = [("maps", maps), ("merge", merge), ("state", state_pass)] if segments is not None else \
        [("state", state_pass)]
    if prep_readout:
        return out, [("prep", prep_pass)] + passes
    if readout:
        return out, [("prep", prep_pass), ("readout", readout_operands)] + passes
    return out, [("prep", prep_pass)] + passes + [("output", output)]


def _segments(segment_chunks, block, warps, stages, cu, T: int, N: int, HV: int, K: int, V: int):
    """The segmented state pass's tables and workspaces, None for ``segment_chunks`` None: (seg_cu int32 [N + 1]
    (segments before sequence n), the grid's segment bound cdiv(T // 64 + N, segment_chunks) + N (at least the
    segments of any N sequences of T tokens), the maps M fp32 [bound, HV, K, K + V], the start states fp32
    [bound, HV, K, V]); ValueError naming the argument that is not a positive int, a tile width or warps."""
    import torch

    if segment_chunks is None:
        return None
    if isinstance(segment_chunks, bool) or not isinstance(segment_chunks, int) or segment_chunks < 1:
        raise ValueError(f"segment_chunks: expected None or a positive int (chunks per segment), got "
                         f"{segment_chunks!r}")
    if block not in (16, 32, 64, 128, 256) or warps not in (1, 2, 4, 8, 16) or stages not in (1, 2, 3, 4):
        raise ValueError(f"maps_block, maps_warps, maps_stages: expected a power of two in [16, 256], one in "
                         f"[1, 16] and one of 1-4, got {block!r}, {warps!r}, {stages!r}")
    chunks = (cu[1:] - cu[:-1] + CHUNK - 1) // CHUNK
    seg_cu = torch.zeros(N + 1, dtype=torch.int32, device=cu.device)
    seg_cu[1:] = torch.cumsum((chunks + segment_chunks - 1) // segment_chunks, 0, dtype=torch.int32)
    bound = triton.cdiv(T // CHUNK + N, segment_chunks) + N
    M = torch.empty((bound, HV, K, K + V), dtype=torch.float32, device=cu.device)
    start = torch.empty((bound, HV, K, V), dtype=torch.float32, device=cu.device)
    return seg_cu, bound, M, start


def _check_prep_variant(prep, heads, prep_readout, norm, form, readout, group: int) -> None:
    """ValueError naming the first of ``stages``' prep_* arguments that ``prep`` cannot run (``group``: value
    heads per key head)."""
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1 or group % heads:
        raise ValueError(f"prep_heads: expected a divisor of the value heads per key head ({group}), got {heads!r}")
    if norm not in ("div", "rcp"):
        raise ValueError(f"prep_norm: expected 'div' or 'rcp', got {norm!r}")
    if form not in ("blocks", "batched"):
        raise ValueError(f"prep_form: expected 'blocks' or 'batched', got {form!r}")
    if prep_readout and not readout:
        raise ValueError("prep_readout: the readout operands are read by the state pass only with readout=True")
    if prep == "blocks" and (heads, bool(prep_readout), norm, form) != (1, False, "div", "blocks"):
        raise ValueError("prep: the 'blocks' kernel runs one value head a program, no readout, the solve in "
                         "blocks and divided norms; prep_heads, prep_readout, prep_norm and prep_form are the "
                         "'tiles' kernel's")


PREP_KERNELS = {"blocks": _prep_kernel, "tiles": _prep_tiles_kernel}
ENTRY_POINTS = {"chunked": chunked}


def compile_specs():
    """The stages at Qwen3-Next's heads (H=16, HV=32, K=V=128), bf16 activations and o, with and without the
    readout in the state pass, the state pass for each state dtype (the other stages do not read the pool)
    (``compile_check``)."""
    from optimized.triton.compile_check import CompileSpec

    i32 = "i32"
    common = dict(cu_ptr="*i32", chunk_cu_ptr="*i32", idx_ptr="*i32", G_ptr="*fp32", N=i32, H=i32, HV=i32,
                  eps="fp32")
    strides = {n: i32 for n in ("sk_t", "sk_h", "sg_t", "sb_t", "sG_t", "sD_t", "sv_t", "sv_h", "sW_t", "sU_t",
                                "sq_t", "sq_h", "so_t", "so_h", "s_slot", "interval")}
    act = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", g_ptr="*fp32", beta_ptr="*bf16", W_ptr="*bf16",
               U_ptr="*bf16", Kd_ptr="*bf16", qe_ptr="*bf16", qkd_ptr="*bf16", h_ptr="*bf16", vn_ptr="*bf16",
               o_ptr="*bf16", scale="fp32")
    types = {**common, **strides, **act}
    BK, BV = _blocks(128, 128)
    consts = dict(K=128, V=128, BK=BK, BV=BV, L2NORM=True, BITS=False)
    out = [CompileSpec("gdn chunked output", _output_kernel, types, consts)]
    out.append(CompileSpec("gdn chunked prep", _prep_kernel, types, consts, warps=PREP_WARPS))
    tiles = dict(HEADS=PREP_HEADS, READOUT=PREP_READOUT, RCP=PREP_NORM == "rcp", FORM=PREP_FORM)
    out.append(CompileSpec("gdn chunked prep tiles (defaults)", _prep_tiles_kernel, types, {**consts, **tiles},
                           warps=PREP_WARPS))
    plain = dict(HEADS=1, READOUT=False, RCP=False, FORM="blocks")
    out.append(CompileSpec("gdn chunked prep tiles, plain", _prep_tiles_kernel, types, {**consts, **plain}, warps=4))
    out.append(CompileSpec("gdn chunked readout operands", _readout_kernel, types,
                           dict(K=128, BK=BK, L2NORM=True, BITS=False)))
    for readout in (False, True):
        for state in ("fp32", "bf16", "fp16"):
            out.append(CompileSpec(f"gdn chunked state pass state={state} readout={readout}", _state_kernel,
                                   {**types, "state_ptr": f"*{state}"},
                                   dict(K=128, V=128, BK=BK, BV=STATE_BV, READOUT=readout, STAGES=STATE_STAGES,
                                        BITS=False)))
    seg = {**types, "seg_cu_ptr": "*i32", "M_ptr": "*fp32", "start_ptr": "*fp32", "SEG": i32}
    out.append(CompileSpec("gdn chunked segment maps", _maps_kernel, seg,
                           dict(K=128, V=128, BK=BK, BC=MAPS_BC, STAGES=MAPS_STAGES, BITS=False), warps=MAPS_WARPS))
    for state in ("fp32", "bf16", "fp16"):
        for vendor, precision in (("cuda", MERGE_PRECISION), ("hip", "ieee")):
            out.append(CompileSpec(f"gdn chunked segment merge state={state} {vendor}", _merge_kernel,
                                   {**seg, "state_ptr": f"*{state}"},
                                   dict(K=128, V=128, BK=BK, BV=MERGE_BV, PRECISION=precision, STAGES=MERGE_STAGES),
                                   vendors=(vendor,), warps=MERGE_WARPS))
        for readout in (False, True):
            out.append(CompileSpec(f"gdn chunked segment state pass state={state} readout={readout}",
                                   _segment_state_kernel, {**seg, "state_ptr": f"*{state}"},
                                   dict(K=128, V=128, BK=BK, BV=STATE_BV, READOUT=readout, STAGES=STATE_STAGES,
                                        BITS=False)))
    return out
