// GDN kernel bodies, written once and instantiated per ISA policy P and per state type SD.
//
// P (defined by each gdn_isa_*.cpp before including this file) provides:
//   load_row(src, dt, float* dst, n)            n elements of type dt -> fp32
//   store_row(const float* src, dst, dt, n)     fp32 -> dt, round to nearest even
//   stream_rows<SD>(up, red, K, w, next, j0, j1)
//                                               one pass over the rows j0 <= j < j1 of the segments of K
//                                               state rows of w <= 128 columns (type SD), in the order of
//                                               walk_segment / ahead_of: row r of `up` (RowUpdate, may be
//                                               null) is updated, then row r of `red` (RowReduce, may be
//                                               null) is reduced (from zero at j0 = 0, else continuing
//                                               red's sums); red's rows and the first rows of `next` (the
//                                               state the next pass reduces, null: none) are prefetched
//                                               ahead; with
//                                               `wide` set (w <= kDecodeBlock, one of up, red), the
//                                               reduction also stores its rows widened to fp32 there
//                                               and the update reads them from there
//   pack_a(src, lds, M, Kd, uint16_t* dst, scale, ldd)
//                                               fp32 [M, Kd] -> bf16 row-major [M][Kd] (dst rows ldd
//                                               apart, 0: Kd); row i times scale[i] first (in fp32)
//                                               unless scale is null
//   pack_b(src, lds, Kd, N, uint16_t* dst, scale, rescale, round, ldd)
//                                               fp32 [Kd, N] -> bf16 pair-interleaved [Kd/2][N][2]
//                                               (dst pair-rows ldd columns apart, 0: N),
//                                               src first rounded to `round` (RNE; F32: not), row
//                                               scales as pack_a; then src <- (rounded) src times
//                                               *rescale (null: 1) when rescale or round
//   gemm(M, N, Kd, A, B, float* C, ldc, acc)    C (+)= A B with bf16 A, B and fp32 accumulation;
//                                               M, N, Kd multiples of 32; only between
//   tiles_begin(), tiles_end()                  (the AMX tile configuration of one task)
//   gemm_block(Kd, A, B, ldb, cin, ldin, blk, ldblk)
//                                               one 32x32 block of gemm: blk [32][32] (rows ldblk
//                                               apart) = cin + A B (cin rows ldin apart, null: 0), A [32, Kd], B
//                                               pair-interleaved with pair-rows ldb columns apart;
//                                               each element the same sum as gemm's (same bits)
//   unpack_b_block(B, ldb, k0, j0, scale, blk)  blk [32][32] = scale times the fp32 values of the
//                                               32x32 block at (row k0, column j0) of a bf16
//                                               pair-interleaved B (pair-rows ldb columns apart)
//   transpose_pairs(src, R, C2, dst)            bf16 pairs as 32-bit words: src [R][C2/2] words ->
//                                               dst [C2/2][R] words (the pair-interleaved layout
//                                               of the transpose, as a B operand wants it)
//   exp_row(x, y, n)                            y = exp(x) in fp32 (y may be x), within 2 ulp (may
//                                               give 0 for results below the normal range)
//   round_store(x, dst, dt, n)                  dst <- x rounded to dt (RNE), x <- the stored values
//   round_bf16(x, n)                            x <- rd(x): rounded to bf16 (nearest even), kept fp32
//   stream_out(dst, ldd, src, lds, rows, n)     rows of n bytes, src rows lds bytes apart, to dst rows
//                                               ldd apart, visible to other threads once it returns
//                                               (AVX-512: non-temporal stores and a store fence)
//   decay_rows(B)                               B.M, B.P from B.G, B.beta, B.KK, B.QK: the numbers of
//                                               decay_rows_portable
//   solve_unit_lower(M, T)                      T = (I + M)^-1: the numbers of solve_unit_lower_portable
//   sum_squares_rows(x, rows, n, out)           out[i] = sum_squares(x + i n, n) for i < rows, the same
//                                               numbers
//
// Rounding model. Decode and spec decode compute in fp32 and round the state to SD after
// every token (the output uses the unrounded fp32 state). Chunked prefill computes in fp32,
// rounds every GEMM operand to bf16 (written rd() below) and accumulates in fp32; the state is
// rounded to SD at every chunk end (chunks of 64 tokens from each sequence start in this call),
// which is also the sequence end: at the start of the next chunk, in the pass that packs rd(S)
// (a bf16 state: at the end of the state update, into its pack, which is then the state), and into
// the pool after the last. This is reference.gdn.numpy_ref.chunked(operand_dtype=
// "bfloat16"). Per chunk, with kn = rd(l2norm(k)), qn = rd(scale l2norm(q)), G the chunk-local
// cumulative sum of g and D[i,j] = exp(G_i - G_j) for j <= i:
//   M  = rd(strict_lower(beta_i (kn kn^T) D)),   T = (I + M)^-1 (fp32 forward substitution)
//   W  = rd(rd(T) rd(beta exp(G) kn)),   U = rd(rd(T) rd(beta v))
//   Vn = rd(U - W rd(S))
//   O  = rd(qn exp(G)) rd(S) + rd(lower(qn kn^T D)) Vn
//   S  = exp(G_last) S + rd((kn exp(G_last - G))^T) Vn
// Internal linkage (anonymous namespace): see gdn_dtype.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gdn_api.hpp"
#include "gdn_gating.hpp"

namespace gdn {
namespace {

// Stage clocks (gdn_api.hpp, ChunkClock): GDN_STAGE(s) closes stage s on this thread.
#ifdef GDN_STAGE_CLOCKS
inline void stage_mark(ChunkClock s) {
    thread_local std::chrono::steady_clock::time_point last;
    const auto now = std::chrono::steady_clock::now();
    if (s != ChunkClock::Begin) chunk_clock_add(s, std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count());
    last = now;
}
#define GDN_STAGE(s) stage_mark(ChunkClock::s)
#else
#define GDN_STAGE(s) ((void)0)
#endif

inline const void* elem(const Input& x, int64_t offset) {
    return static_cast<const char*>(x.p) + offset * dtype_bytes(x.dt);
}

inline void* state_row(const StatePool& s, int64_t slot, int64_t offset) {
    return static_cast<char*>(s.p) + (slot * s.slot_stride + offset) * dtype_bytes(s.dt);
}

// The order in which a pass walks K state rows: kRowStreams segments of walk_segment(K) rows side
// by side (row i of each segment, then row i + 1 of each), so that the hardware prefetchers follow
// kRowStreams sequential streams at once (one stream, walked at the pace of the pass's arithmetic,
// keeps too few lines in flight to reach the memory's rate); the reductions sum the rows in this order.
constexpr int kRowStreams = 4;
// Each row visited prefetches (to L1) the row kPrefetchAhead rows further down its segment of the
// state the pass streams from memory, and near the segment's end the row as far into the same
// segment of the state the next pass streams, so the next pass starts on lines already in flight.
constexpr int64_t kPrefetchAhead = 4;

inline int64_t walk_segment(int64_t K) { return (K + kRowStreams - 1) / kRowStreams; }

// What the visits of row j of the segments prefetch: the rows kPrefetchAhead further down the
// segments of `cur` (null: none), or past their end, as far into the same segments of `next` (null:
// none): the address of the one in segment 0 (null: none) and the index within their segments.
struct Ahead {
    const char* p;
    int64_t i;
};

inline Ahead ahead_of(const void* cur, const void* next, int64_t seg, int64_t j, int64_t stride) {
    const int64_t a = j + kPrefetchAhead;
    const char* base = static_cast<const char*>(a < seg ? cur : next);
    const int64_t i = a < seg ? a : a - seg;
    return {base ? base + i * stride : nullptr, i};
}

// Prefetch (to L1) of the `width` bytes of the row `t` names in segment s (of seg rows; K rows in
// all, rows `stride` bytes apart).
inline void prefetch_ahead(const Ahead& t, int s, int64_t seg, int64_t K, int64_t stride, int64_t width) {
    if (!t.p || s * seg + t.i >= K) return;
    const char* row = t.p + s * seg * stride;
    for (int64_t l = 0; l < width; l += 64) __builtin_prefetch(row + l, 0, 3);
}

// The two halves of one pass over state rows (stream_rows): the update of one token's state and
// the reductions of the next token's, so that a thread streams each state from memory once, in a
// pass that also writes back the state before it. Pointers are at the block's first column.
struct RowUpdate {  // dst[r, j] = alpha src[r, j] + k[r] u[j] in fp32, rounded to the state type (dst may be src)
    const void* src;
    void* dst;
    int64_t ld;     // row stride in elements
    float alpha;
    const float *k, *u;
    const float* wide = nullptr;  // non-null: src's rows as fp32, kDecodeBlock floats apart (read instead of src)
};

struct RowReduce {  // kv[j] = sum_r src[r, j] k[r], sq[j] = sum_r src[r, j] q[r] (fp32, r in walk order)
    const void* src;
    int64_t ld;
    const float *k, *q;
    float *kv, *sq;
    float* wide = nullptr;  // non-null: src's rows are also stored there as fp32, kDecodeBlock floats apart
};

// sum x[i]^2 over n elements, on 16 partial sums so the reduction vectorises.
inline float sum_squares(const float* x, int64_t n) {
    float part[16] = {};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; ++j) part[j] += x[i + j] * x[i + j];
    for (; i < n; ++i) part[0] += x[i] * x[i];
    float ss = 0.0f;
    for (int j = 0; j < 16; ++j) ss += part[j];
    return ss;
}

// dst = x[offset : offset + n] in fp32, divided by sqrt(sum x^2 + eps) when l2norm, times mul.
template <class P>
void load_normalized(const Input& x, int64_t offset, int64_t n, bool l2norm, float eps, float mul,
                     float* dst) {
    P::load_row(elem(x, offset), x.dt, dst, n);
    const float s = l2norm ? mul / std::sqrt(sum_squares(dst, n) + eps) : mul;
    for (int64_t i = 0; i < n; ++i) dst[i] *= s;
}

// ---------------------------------------------------------------------------------------------
// Decode and spec decode: one delta-rule step per token and value head on a [K, V] state,
//   S' = alpha S + k u^T,  u = beta (v - alpha S^T k),  o = S'^T q = alpha S^T q + (k . q) u,
// in fp32 (o from the unrounded S'); S' is stored rounded to nearest even. S^T k and S^T q are
// reduced in the pass that reads S; the update is a second pass over rows that are in cache.

// One token of one value head: its vectors (q, k [K]; v, kv, sq, o [V], u in kv), gates and state.
struct Token {
    float *q, *k, *v, *kv, *sq, *o;
    float alpha = 0.0f, beta = 0.0f;
    const void* src = nullptr;  // the state it reads
    void* dst = nullptr;        // where its updated state goes (decode: src)
    static int64_t floats(int64_t K, int64_t V) { return 2 * K + 4 * V; }
    Token(float* base, int64_t K, int64_t V) : q(base), k(q + K), v(k + K), kv(v + V), sq(kv + V), o(sq + V) {}
};

template <class P>
void load_token(const DecodeArgs& A, Token& tk, int64_t t, int64_t hv) {
    const int64_t h = hv / (A.HV / A.H);
    load_normalized<P>(A.q, (t * A.H + h) * A.K, A.K, A.l2norm, A.eps, A.scale, tk.q);
    load_normalized<P>(A.k, (t * A.H + h) * A.K, A.K, A.l2norm, A.eps, 1.0f, tk.k);
    P::load_row(elem(A.v, (t * A.HV + hv) * A.V), A.v.dt, tk.v, A.V);
    float g;
    gates(A, t, hv, &g, &tk.beta);
    tk.alpha = std::exp(g);
}

// k . q on 16 partial sums.
inline float token_kq(const Token& tk, int64_t K) {
    float part[16] = {};
    int64_t i = 0;
    for (; i + 16 <= K; i += 16)
        for (int j = 0; j < 16; ++j) part[j] += tk.k[i + j] * tk.q[i + j];
    for (; i < K; ++i) part[0] += tk.k[i] * tk.q[i];
    float kq = 0.0f;
    for (int j = 0; j < 16; ++j) kq += part[j];
    return kq;
}

// After the reductions of columns [j0, j1): u = beta (v - alpha kv) (into kv) and
// o = alpha sq + kq u; each column needs only its own reductions.
inline void finish_columns(Token& tk, float kq, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
        tk.kv[j] = tk.beta * (tk.v[j] - tk.alpha * tk.kv[j]);
        tk.o[j] = tk.alpha * tk.sq[j] + kq * tk.kv[j];
    }
}

template <class P>
void store_output(const DecodeArgs& A, const Token& tk, int64_t t, int64_t hv) {
    P::store_row(tk.o, static_cast<char*>(A.out) + (t * A.HV + hv) * A.V * dtype_bytes(A.out_dt), A.out_dt, A.V);
}

// After the reductions of all columns: u, o, and o stored to output row t, value head hv.
template <class P>
void finish_token(const DecodeArgs& A, Token& tk, int64_t t, int64_t hv) {
    finish_columns(tk, token_kq(tk, A.K), 0, A.V);
    store_output<P>(A, tk, t, hv);
}

// One pass over the [K, V] states: `up`'s update (null: none), then `red`'s reductions (null:
// none), row by row in column blocks of up to 128 (whole rows at V <= 128, so slots stream in
// order); `next` (null: none) is the state the pass after this one reduces. Row r of up is written
// before row r of red is read, so red may read the state up writes. `midway()` runs once, halfway
// through the rows of the first block: work done there overlaps the memory streams in flight,
// which at the end of a pass would have run dry.
template <class P, DType SD, class Midway>
void state_pass(int64_t K, int64_t V, Token* up, Token* red, const void* next, Midway&& midway) {
    constexpr int64_t kBlock = 128;
    const int eb = dtype_bytes(SD);
    const int64_t seg = walk_segment(K), half = seg / 2;
    auto at = [eb](const void* p, int64_t j0) { return static_cast<const char*>(p) + j0 * eb; };
    for (int64_t j0 = 0; j0 < V; j0 += kBlock) {
        const int64_t w = std::min(kBlock, V - j0);
        RowUpdate U{};
        RowReduce R{};
        if (up) U = RowUpdate{at(up->src, j0), static_cast<char*>(up->dst) + j0 * eb, V, up->alpha, up->k, up->kv + j0};
        if (red) R = RowReduce{at(red->src, j0), V, red->k, red->q, red->kv + j0, red->sq + j0};
        const void* then = next ? at(next, j0) : nullptr;
        if (j0 == 0) {
            P::template stream_rows<SD>(up ? &U : nullptr, red ? &R : nullptr, K, w, then, 0, half);
            midway();
            P::template stream_rows<SD>(up ? &U : nullptr, red ? &R : nullptr, K, w, then, half, seg);
        } else {
            P::template stream_rows<SD>(up ? &U : nullptr, red ? &R : nullptr, K, w, then, 0, seg);
        }
    }
}

template <class P, DType SD>
void state_pass(int64_t K, int64_t V, Token* up, Token* red, const void* next) {
    state_pass<P, SD>(K, V, up, red, next, [] {});
}

struct DecodeCtx {
    const DecodeArgs* args;
    const Scratch* scratch;
    int64_t run;  // decode: items per run
};

inline int64_t decode_slot(const DecodeArgs& A, int64_t item) { return A.indices[item / A.HV]; }

inline void* decode_state(const DecodeArgs& A, int64_t item) {
    return state_row(A.state, decode_slot(A, item), (item % A.HV) * A.K * A.V);
}

// A run of consecutive decode items (sequence, value head) on one thread, software-pipelined: the
// pass that updates item i's state (read in the pass before, now in cache) reduces item i + 1's
// (read from memory, its rows prefetched a few rows ahead), loads item i + 2's token halfway through
// and starts the prefetch of item i + 2's first rows; between passes only u and o of item i + 1.
// Padding sequences are skipped.
template <class P, DType SD>
void decode_run(void* ctx, int64_t run, int tid) {
    const auto& c = *static_cast<DecodeCtx*>(ctx);
    const DecodeArgs& A = *c.args;
    const int64_t end = std::min(A.N * A.HV, (run + 1) * c.run);
    float* base = reinterpret_cast<float*>(c.scratch->at(tid));
    const int64_t tf = Token::floats(A.K, A.V);
    Token slots[3] = {Token(base, A.K, A.V), Token(base + tf, A.K, A.V), Token(base + 2 * tf, A.K, A.V)};
    auto valid_from = [&](int64_t i) {
        while (i < end && decode_slot(A, i) < 0) ++i;
        return i;
    };
    auto load = [&](Token& tk, int64_t item) {
        load_token<P>(A, tk, item / A.HV, item % A.HV);
        tk.src = tk.dst = decode_state(A, item);
    };
    Token *cur = nullptr, *nx = &slots[0], *ahead = &slots[1];  // updated, reduced, loaded in this pass
    int64_t item = valid_from(run * c.run);
    if (item < end) load(*nx, item);
    while (item < end) {
        const int64_t after = valid_from(item + 1);
        state_pass<P, SD>(A.K, A.V, cur, nx, after < end ? decode_state(A, after) : nullptr, [&] {
            if (after < end) load(*ahead, after);
        });
        finish_token<P>(A, *nx, item / A.HV, item % A.HV);
        Token* spare = cur ? cur : &slots[2];
        cur = nx;
        nx = ahead;
        ahead = spare;
        item = after;
    }
    if (cur) state_pass<P, SD>(A.K, A.V, cur, nullptr, nullptr);
}

// One decode item in blocks of kDecodeBlock columns: per block, the reductions stream its rows, then
// u and o of its columns, then the update pass over the block's rows, now in L1; `next` (null: none)
// is the state of the item after this one. `wide` (null: none; 16-bit states): the block's rows
// widened to fp32 by the reduction pass, read back by the update pass.
template <class P, DType SD>
void blocked_item(const DecodeArgs& A, Token& tk, const void* next, float* wide, int64_t t, int64_t hv) {
    const int eb = dtype_bytes(SD);
    const float kq = token_kq(tk, A.K);
    float* keep = SD == DType::F32 ? nullptr : wide;
    for (int64_t j0 = 0; j0 < A.V; j0 += kDecodeBlock) {
        const int64_t w = std::min(kDecodeBlock, A.V - j0);
        const char* src = static_cast<const char*>(tk.src) + j0 * eb;
        const RowReduce R{src, A.V, tk.k, tk.q, tk.kv + j0, tk.sq + j0, keep};
        const void* then = j0 + w < A.V ? src + w * eb : next;  // what the next reduction streams
        P::template stream_rows<SD>(nullptr, &R, A.K, w, then, 0, walk_segment(A.K));
        finish_columns(tk, kq, j0, j0 + w);
        const RowUpdate U{src, static_cast<char*>(tk.dst) + j0 * eb, A.V, tk.alpha, tk.k, tk.kv + j0, keep};
        P::template stream_rows<SD>(&U, nullptr, A.K, w, nullptr, 0, walk_segment(A.K));
    }
    store_output<P>(A, tk, t, hv);
}

// A run of consecutive decode items, one at a time (blocked_item). Padding sequences are skipped.
template <class P, DType SD>
void decode_run_blocked(void* ctx, int64_t run, int tid) {
    const auto& c = *static_cast<DecodeCtx*>(ctx);
    const DecodeArgs& A = *c.args;
    const int64_t end = std::min(A.N * A.HV, (run + 1) * c.run);
    float* wide = reinterpret_cast<float*>(c.scratch->at(tid));
    Token tk(wide + A.K * kDecodeBlock, A.K, A.V);
    auto valid_from = [&](int64_t i) {
        while (i < end && decode_slot(A, i) < 0) ++i;
        return i;
    };
    for (int64_t item = valid_from(run * c.run); item < end;) {
        const int64_t after = valid_from(item + 1);
        load_token<P>(A, tk, item / A.HV, item % A.HV);
        tk.src = tk.dst = decode_state(A, item);
        blocked_item<P, SD>(A, tk, after < end ? decode_state(A, after) : nullptr,
                            A.plan == DecodePlan::BlockedKeep ? wide : nullptr, item / A.HV, item % A.HV);
        item = after;
    }
}

// Spec decode: resume from slot indices[n, max(accepted-1, 0)] (negative: padding sequence),
// token t's state is stored to indices[n, t] and the next token continues from the stored value:
// per token, one pass reduces the state it reads and a second stores its update.
template <class P, DType SD>
void spec_item(void* ctx, int64_t item, int tid) {
    const auto& c = *static_cast<DecodeCtx*>(ctx);
    const DecodeArgs& A = *c.args;
    const int64_t n = item / A.HV, hv = item % A.HV;
    const int32_t* idx = A.indices + n * A.index_cols;
    const int64_t src_slot = idx[std::max<int64_t>(A.num_accepted[n] - 1, 0)];
    const int64_t t0 = A.cu_seqlens[n], t1 = A.cu_seqlens[n + 1];
    if (src_slot < 0) return;
    Token tk(reinterpret_cast<float*>(c.scratch->at(tid)), A.K, A.V);
    tk.src = state_row(A.state, src_slot, hv * A.K * A.V);
    for (int64_t t = t0; t < t1; ++t) {
        load_token<P>(A, tk, t, hv);
        tk.dst = state_row(A.state, idx[t - t0], hv * A.K * A.V);
        state_pass<P, SD>(A.K, A.V, nullptr, &tk, nullptr);
        finish_token<P>(A, tk, t, hv);
        state_pass<P, SD>(A.K, A.V, &tk, nullptr, nullptr);
        tk.src = tk.dst;
    }
}

template <class P, template <class, DType> class Item>
void run_decode_like(const DecodeArgs& A, int64_t n_work, int64_t run) {
    // Three tokens (Pipelined) or the widened block and one token (Blocked plans).
    Scratch scratch(A.num_threads, std::max(3 * Token::floats(A.K, A.V), A.K * kDecodeBlock + Token::floats(A.K, A.V)) * 4);
    DecodeCtx ctx{&A, &scratch, run};
    switch (A.state.dt) {
        case DType::F32: parallel_for(n_work, A.num_threads, &ctx, Item<P, DType::F32>::fn); break;
        case DType::BF16: parallel_for(n_work, A.num_threads, &ctx, Item<P, DType::BF16>::fn); break;
        case DType::F16: parallel_for(n_work, A.num_threads, &ctx, Item<P, DType::F16>::fn); break;
    }
}

template <class P, DType SD> struct DecodeRun { static constexpr ItemFn fn = decode_run<P, SD>; };
template <class P, DType SD> struct DecodeRunBlocked { static constexpr ItemFn fn = decode_run_blocked<P, SD>; };
template <class P, DType SD> struct SpecItem { static constexpr ItemFn fn = spec_item<P, SD>; };

// Decode items go out in runs of consecutive items, about 8 runs per thread (the dynamic schedule
// balances them); each run pays one unpipelined pass at either end.
template <class P> void decode(const DecodeArgs& A) {
    const int64_t items = A.N * A.HV;
    const int64_t run = std::max<int64_t>(1, items / (int64_t(std::max(1, A.num_threads)) * 8));
    if (A.plan == DecodePlan::Pipelined) run_decode_like<P, DecodeRun>(A, (items + run - 1) / run, run);
    else run_decode_like<P, DecodeRunBlocked>(A, (items + run - 1) / run, run);
}
template <class P> void spec_decode(const DecodeArgs& A) { run_decode_like<P, SpecItem>(A, A.N * A.HV, 1); }

// ---------------------------------------------------------------------------------------------
// Chunked prefill.

// P::gemm_block through the policy's gemm_ld(M, N, Kd, A, B, ldb, C, ldc, acc) (gemm with B's
// pair-rows ldb columns apart): the portable policies' block.
template <class P>
void gemm_block_portable(int Kd, const uint16_t* A, const uint16_t* B, int64_t ldb, const float* cin, int64_t ldin,
                         float* blk, int64_t ldblk) {
    for (int i = 0; i < 32; ++i) {
        if (cin) std::memcpy(blk + i * ldblk, cin + i * ldin, 32 * 4);
        else std::fill(blk + i * ldblk, blk + i * ldblk + 32, 0.0f);
    }
    P::gemm_ld(32, 32, Kd, A, B, ldb, blk, ldblk, true);
}

// x [K][V] = the fp32 values of a pair-interleaved bf16 B operand [K/2][V][2] (K even).
inline void unpack_b_portable(const uint16_t* B, int64_t K, int64_t V, float* x) {
    for (int64_t k = 0; k < K; ++k)
        for (int64_t v = 0; v < V; ++v) x[k * V + v] = bf16_to_f32(B[((k / 2) * V + v) * 2 + k % 2]);
}

// The portable form of P::unpack_b_block: each 32-bit word of the pair-interleaved operand holds
// row 2p's element in its low half and row 2p + 1's in its high half.
inline void unpack_b_block_portable(const uint16_t* B, int64_t ldb, int64_t k0, int64_t j0, float scale, float* blk) {
    for (int p = 0; p < 16; ++p) {
        const uint16_t* w = B + ((k0 / 2 + p) * ldb + j0) * 2;
        float* __restrict r0 = blk + 2 * p * 32;
        float* __restrict r1 = r0 + 32;
        for (int c = 0; c < 32; ++c) {
            r0[c] = scale * bf16_to_f32(w[2 * c]);
            r1[c] = scale * bf16_to_f32(w[2 * c + 1]);
        }
    }
}

// C = cin + A B (cin rows ldin apart, null: 0) for bf16 A [M, Kd] and pair-interleaved B [Kd, N],
// never stored whole: each 32x32 block goes to a 4 KiB buffer that stays in L1 and
// epi(i0, j0, blk) (blk [32][32], rows 32 apart) takes it from there to where it is used (rounded,
// packed, converted) before the next block. The same numbers as P::gemm. M, N, Kd multiples of 32.
template <class P, class Epi>
void gemm_epilogue(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, const float* cin, int64_t ldin,
                   Epi&& epi) {
    alignas(64) float blk[32 * 32];
    for (int i0 = 0; i0 < M; i0 += 32)
        for (int j0 = 0; j0 < N; j0 += 32) {
            P::gemm_block(Kd, A + int64_t(i0) * Kd, B + int64_t(j0) * 2, N, cin ? cin + i0 * ldin + j0 : nullptr, ldin,
                          blk, 32);
            epi(i0, j0, blk);
        }
}

// Buffers of one task (a sequence and a block of adjacent key heads, whose `states` value heads'
// fp32 states stay in S across the chunks); C = kChunk rows, fp32 unless named *_bf. Per key head
// and chunk (reused in turn): q, k, KK, QK and their bf16 packs; per value head: the rest.
struct ChunkBuffers {
    float *q, *k, *KK, *QK, *v, *G, *eG, *eL, *beta, *x, *M, *P, *T, *S;
    uint16_t *Ka_bf, *KbT_bf, *Qa_bf, *Ta_bf, *XYb_bf, *SVb_bf, *Wa_bf, *QPa_bf, *Kd_bf, *KdT_bf;

    static int64_t floats(int64_t K, int64_t V, int64_t states) {
        const int64_t C = kChunk;
        return states * K * V + 2 * C * K + 2 * C * V + 5 * C * C + 5 * C;  // S; q k; v x; KK QK M P T; G eG eL beta, x tail
    }
    static int64_t halves(int64_t K, int64_t V, int64_t states) {
        const int64_t C = kChunk;
        // Ka Qa KbT Wa Kd KdT and XYb's, QPa's C K; XYb's C V; Ta, QPa's C C; per state Sb, Vb
        return 8 * C * K + C * V + 2 * C * C + states * (K * V + C * V);
    }
    static int64_t bytes(int64_t K, int64_t V, int64_t states) {
        return floats(K, V, states) * 4 + halves(K, V, states) * 2;
    }
    // Value head j's [rd(S); rd(Vn)], one B operand of K + C pair-interleaved rows: rd(S) kept
    // across the chunks for a bf16 state (its rounded value is its pack); other states' steps all
    // use j = 0's, rewritten per chunk.
    uint16_t* svb(int64_t j, int64_t K, int64_t V) const { return SVb_bf + j * (K + kChunk) * V; }

    ChunkBuffers(char* base, int64_t K, int64_t V, int64_t states) {
        const int64_t C = kChunk;
        float* f = reinterpret_cast<float*>(base);
        auto take = [&f](int64_t n) { float* p = f; f += n; return p; };
        q = take(C * K); k = take(C * K); KK = take(C * C); QK = take(C * C); v = take(C * V);  // QK follows KK
        G = take(C); eG = take(C); eL = take(C); beta = take(C); x = take(C * V + C);
        M = take(C * C); P = take(C * C); T = take(C * C);
        S = take(states * K * V);
        uint16_t* h = reinterpret_cast<uint16_t*>(f);
        auto half = [&h](int64_t n) { uint16_t* p = h; h += n; return p; };
        Ka_bf = half(C * K); Qa_bf = half(C * K); KbT_bf = half(K * C); Ta_bf = half(C * C);  // Qa follows Ka
        XYb_bf = half(C * (K + V));
        Wa_bf = half(C * K); QPa_bf = half(C * (K + C)); Kd_bf = half(C * K); KdT_bf = half(K * C);
        SVb_bf = half(states * (K + C) * V);
    }
};

// Prefetch (to L2) of the 64-byte lines that hold bytes [p, p + n).
inline void prefetch_lines(const void* p, int64_t n) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    for (uintptr_t l = a & ~uintptr_t(63); l < a + uintptr_t(n); l += 64) __builtin_prefetch(reinterpret_cast<const void*>(l), 0, 2);
}

// One chunk's rows of a task's key heads [h0, h0 + heads) and their value heads [hv0, hv0 +
// states): q, k, v, g and beta copied in token by token, and the output rows written back after the
// chunk (P::stream_out). Within a token a task's heads are adjacent, so each copy is one contiguous
// run per tensor (a head's rows alone are a few lines a page or more apart, which the hardware
// prefetchers do not follow and whose lines for all tokens of a chunk fall in a few cache sets).
// Staged rows are `*_row` bytes apart (64-byte multiples); row i is chunk row i.
struct ChunkStage {
    int64_t h0, hv0, heads, states;
    int64_t q_run, k_run, v_run, g_run, b_run, o_run;  // bytes of a token's run of each tensor
    int64_t qk_row, v_row, g_row, b_row, o_row;
    char *q, *k, *v, *g, *beta, *o;

    static int64_t row(int64_t run) { return (run + 63) / 64 * 64; }
    ChunkStage(const ChunkArgs& A, int64_t h0_, int64_t heads_, char* base)
        : h0(h0_), hv0(h0_ * (A.HV / A.H)), heads(heads_), states(heads_ * (A.HV / A.H)),
          q_run(heads * A.K * dtype_bytes(A.q.dt)), k_run(heads * A.K * dtype_bytes(A.k.dt)),
          v_run(states * A.V * dtype_bytes(A.v.dt)),
          g_run(states * dtype_bytes(A.g.dt)), b_run(states * dtype_bytes(A.beta.dt)),
          o_run(states * A.V * dtype_bytes(A.out_dt)),
          qk_row(row(std::max(q_run, k_run))), v_row(row(v_run)), g_row(row(g_run)),
          b_row(row(b_run)), o_row(row(o_run)) {
        q = base; k = q + kChunk * qk_row; v = k + kChunk * qk_row; g = v + kChunk * v_row;
        beta = g + kChunk * g_row; o = beta + kChunk * b_row;
    }
    // Where a task's stage starts in its scratch: after its ChunkBuffers, 64-byte aligned.
    static int64_t offset(int64_t K, int64_t V, int64_t states) { return row(ChunkBuffers::bytes(K, V, states)); }
    static int64_t bytes(const ChunkArgs& A, int64_t heads) {
        const ChunkStage s(A, 0, heads, nullptr);
        return kChunk * (2 * s.qk_row + s.v_row + s.g_row + s.b_row + s.o_row);
    }
    // Input rows [c0, c0 + L) in.
    void copy_in(const ChunkArgs& A, int64_t c0, int64_t L) const {
        for (int64_t i = 0; i < L; ++i) {
            const int64_t t = c0 + i;
            std::memcpy(q + i * qk_row, elem(A.q, (t * A.H + h0) * A.K), size_t(q_run));
            std::memcpy(k + i * qk_row, elem(A.k, (t * A.H + h0) * A.K), size_t(k_run));
            std::memcpy(v + i * v_row, elem(A.v, (t * A.HV + hv0) * A.V), size_t(v_run));
            std::memcpy(g + i * g_row, elem(A.g, t * A.HV + hv0), size_t(g_run));
            std::memcpy(beta + i * b_row, elem(A.beta, t * A.HV + hv0), size_t(b_run));
        }
    }
    // Prefetch (to L2) of input rows [c0 + i0, c0 + i1) (those before t1).
    void prefetch_in(const ChunkArgs& A, int64_t c0, int64_t i0, int64_t i1, int64_t t1) const {
        for (int64_t t = c0 + i0; t < std::min(c0 + i1, t1); ++t) {
            prefetch_lines(elem(A.q, (t * A.H + h0) * A.K), q_run);
            prefetch_lines(elem(A.k, (t * A.H + h0) * A.K), k_run);
            prefetch_lines(elem(A.v, (t * A.HV + hv0) * A.V), v_run);
            prefetch_lines(elem(A.g, t * A.HV + hv0), g_run);
            prefetch_lines(elem(A.beta, t * A.HV + hv0), b_run);
        }
    }
    // Output rows [c0, c0 + L) out.
    template <class P>
    void copy_out(const ChunkArgs& A, int64_t c0, int64_t L) const {
        const int64_t eo = dtype_bytes(A.out_dt);
        P::stream_out(static_cast<char*>(A.out) + (c0 * A.HV + hv0) * A.V * eo, A.HV * A.V * eo, o, o_row, L, o_run);
    }
};

struct ChunkCtx {
    const ChunkArgs* args;
    const Scratch* scratch;
    int64_t heads;  // key heads per task
};

// Staged rows [0, L) of key head hb of the task (q or k: x, of type dt) to dst [C][K] in fp32 and
// its bf16 pack dst_bf [C][K] (rows L..C-1 zero): divided by sqrt(sum x^2 + eps) when l2norm, times
// mul, rounded to bf16 values. Sixteen rows at a time, so that a group's passes (load, sums of
// squares, scale, round, pack) stay in L1.
template <class P>
void load_key_rows(const ChunkArgs& A, const char* x, int64_t row, DType dt, int64_t L, int64_t hb, float mul,
                   float* dst, uint16_t* dst_bf, float* scale) {
    const int64_t C = kChunk, K = A.K;
    for (int64_t r0 = 0; r0 < L; r0 += 16) {
        const int64_t n = std::min<int64_t>(16, L - r0);
        float* d = dst + r0 * K;
        for (int64_t i = 0; i < n; ++i) P::load_row(x + (r0 + i) * row + hb * K * dtype_bytes(dt), dt, d + i * K, K);
        if (A.l2norm) P::sum_squares_rows(d, n, K, scale);
        for (int64_t i = 0; i < n; ++i) scale[i] = A.l2norm ? mul / std::sqrt(scale[i] + A.eps) : mul;
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < K; ++j) d[i * K + j] *= scale[i];
        P::round_bf16(d, n * K);
        P::pack_a(d, K, int(n), int(K), dst_bf + r0 * K);
    }
    std::fill(dst + L * K, dst + C * K, 0.0f);
    std::fill(dst_bf + L * K, dst_bf + C * K, uint16_t(0));
}

// Key-head part of the staged chunk rows [0, L) (rows L..C-1 zero) of the task's key head hb: q,
// k normalised and rounded to bf16 values, their packs, KK = kn kn^T and QK = qn kn^T.
template <class P>
void load_keys(const ChunkArgs& A, ChunkBuffers& B, const ChunkStage& st, int64_t L, int64_t hb) {
    const int C = kChunk, K = int(A.K);
    load_key_rows<P>(A, st.q, st.qk_row, A.q.dt, L, hb, A.scale, B.q, B.Qa_bf, B.x);
    load_key_rows<P>(A, st.k, st.qk_row, A.k.dt, L, hb, 1.0f, B.k, B.Ka_bf, B.x);
    GDN_STAGE(KeyRows);
    P::transpose_pairs(B.Ka_bf, C, K, B.KbT_bf);
    // [KK; QK] = [kn; qn] kn^T: one GEMM of 2C rows (Qa follows Ka, QK follows KK).
    P::gemm(2 * C, C, K, B.Ka_bf, B.KbT_bf, B.KK, C, false);
    GDN_STAGE(KeyGemms);
}

// Value-head part (the task's value head j, staged rows): v rows, beta, the chunk-local cumulative
// decay G (padded rows repeat G[L-1]), eG = exp(G) and eL = exp(G[L-1] - G) (zero on padded rows).
template <class P>
void load_values(const ChunkArgs& A, ChunkBuffers& B, const ChunkStage& st, int64_t L, int64_t j) {
    const int64_t C = kChunk, V = A.V;
    float cum = 0.0f;
    for (int64_t i = 0; i < C; ++i) {
        if (i < L) {
            P::load_row(st.v + i * st.v_row + j * V * dtype_bytes(A.v.dt), A.v.dt, B.v + i * V, V);
            cum += load_scalar(st.g + i * st.g_row, A.g.dt, j);
            B.beta[i] = load_scalar(st.beta + i * st.b_row, A.beta.dt, j);
        } else {
            std::fill(B.v + i * V, B.v + (i + 1) * V, 0.0f);
            B.beta[i] = 0.0f;
        }
        B.G[i] = cum;
    }
    P::exp_row(B.G, B.eG, C);
    for (int64_t i = 0; i < C; ++i) B.x[i] = B.G[L - 1] - B.G[i];
    P::exp_row(B.x, B.eL, C);
    for (int64_t i = L; i < C; ++i) B.eL[i] = 0.0f;
}

// Decay mask rows: M[i, j] = rd((beta_i KK[i, j]) D[i, j]) for j < i and P[i, j] = QK[i, j] D[i, j]
// for j <= i, zero above, with D[i, j] = P::exp_row(G_i - G_j) (computed directly, never as a ratio
// of exponentials). The portable form of P::decay_rows (x: scratch).
template <class P>
void decay_rows_portable(ChunkBuffers& B) {
    constexpr int C = kChunk;
    float* d = B.x;
    for (int i = 0; i < C; ++i) {
        const int n = std::min(C, (i / 16 + 1) * 16);  // columns up to the diagonal, whole vectors
        for (int j = 0; j < n; ++j) d[j] = j <= i ? B.G[i] - B.G[j] : -200.0f;
        P::exp_row(d, d, n);
        const float* __restrict kk = B.KK + i * C;
        const float* __restrict qk = B.QK + i * C;
        float* __restrict m = B.M + i * C;
        float* __restrict p = B.P + i * C;
        const float bi = B.beta[i];
        for (int j = 0; j < n; ++j) {
            m[j] = j < i ? bi * kk[j] * d[j] : 0.0f;
            p[j] = j <= i ? qk[j] * d[j] : 0.0f;
        }
        std::fill(m + n, m + C, 0.0f);
        std::fill(p + n, p + C, 0.0f);
        P::round_bf16(m, n);
    }
}

// Rows [16 (NV - 1), 16 NV) of T = (I + M)^-1 by forward substitution in fp32, M strictly lower:
// row i is e_i - sum_{m<i} M[i, m] T[m, :]. Rows of T are zero right of the diagonal, so the sums
// run over the NV 16-column vectors left of column 16 NV, on two accumulators per column: even m
// into a0, odd m into a1, each in increasing m (a0 += M[i, m] T[m, :], fused where the ISA has
// FMA), then T[i, :] = -(a0 + a1); the columns right of them are zero.
template <int NV>
void solve_rows(const float* M, float* T) {
    constexpr int C = kChunk, N = 16 * NV;
    for (int i = N - 16; i < N; ++i) {
        float a0[N] = {}, a1[N] = {};
        const float* __restrict Mi = M + i * C;
        int m = 0;
        for (; m + 1 < i; m += 2) {
            const float x0 = Mi[m], x1 = Mi[m + 1];
            const float* __restrict T0 = T + m * C;
            const float* __restrict T1 = T0 + C;
            for (int j = 0; j < N; ++j) {
                a0[j] += x0 * T0[j];
                a1[j] += x1 * T1[j];
            }
        }
        if (m < i) {
            const float x0 = Mi[m];
            const float* __restrict T0 = T + m * C;
            for (int j = 0; j < N; ++j) a0[j] += x0 * T0[j];
        }
        float* __restrict Ti = T + i * C;
        for (int j = 0; j < N; ++j) Ti[j] = -(a0[j] + a1[j]);
        std::fill(Ti + N, Ti + C, 0.0f);
        Ti[i] = 1.0f;
    }
}

// The portable form of P::solve_unit_lower.
inline void solve_unit_lower_portable(const float* M, float* T) {
    static_assert(kChunk == 64, "solve_unit_lower: four blocks of 16 rows");
    solve_rows<1>(M, T);
    solve_rows<2>(M, T);
    solve_rows<3>(M, T);
    solve_rows<4>(M, T);
}

// One chunk of the task's value head j (load_keys done for its key head): rounds the fp32 state S
// to `round` (the state type: the previous chunk's write-back), reads and updates it, writes its
// staged O rows. A bf16 state is not in S but in its pack (B.svb(j)), rounded where it is updated.
template <class P>
void chunk_step(const ChunkArgs& A, ChunkBuffers& B, const ChunkStage& st, float* S, int64_t L, int64_t j,
                DType round) {
    const int C = kChunk, K = int(A.K), V = int(A.V);
    load_values<P>(A, B, st, L, j);
    GDN_STAGE(Values);  // with the prefetch of the next chunk's rows before the step
    P::decay_rows(B);
    GDN_STAGE(Decay);
    P::solve_unit_lower(B.M, B.T);
    GDN_STAGE(Solve);
    for (int i = 0; i < C; ++i) B.x[i] = B.beta[i] * B.eG[i];
    P::pack_a(B.T, C, C, C, B.Ta_bf);
    // B = [rd(beta exp(G) kn) | rd(beta v)] (K + V columns): W and U are one product with rd(T).
    P::pack_b(B.k, K, C, K, B.XYb_bf, B.x, nullptr, DType::F32, K + V);
    P::pack_b(B.v, V, C, V, B.XYb_bf + 2 * K, B.beta, nullptr, DType::F32, K + V);
    // A bf16 state is kept as its pack rd(S) (the state update's write-back); any other state
    // is rounded to its type, packed and decayed by exp(G_last) (for the state update) in one
    // pass over S.
    const float el = B.eG[L - 1];
    const bool kept_packed = round == DType::BF16;
    uint16_t* Sb = B.svb(kept_packed ? j : 0, K, V);  // other states share the first
    uint16_t* Vb = Sb + int64_t(K) * V;
    if (!kept_packed) P::pack_b(S, V, K, V, Sb, nullptr, &el, round);
    GDN_STAGE(Packs);
    // W, U and Vn = U - rd(W) rd(S) (U a bf16 value) per 32 rows, each 32x32 block of C handed
    // from an L1 buffer to its use: W's blocks rounded and packed as rd(-W) (Vn's A operand; the
    // strip's K columns first), each U block rounded to rd(U) and at once the initial C of its Vn
    // block (-rd(W) rd(S) accumulated onto it), which goes out rounded and packed as rd(Vn), the B
    // operand of the output and the state update. No fp32 W, U or Vn is stored whole.
    float minus[32];
    std::fill(minus, minus + 32, -1.0f);
    alignas(64) float blk[32 * 32], vn[32 * 32];
    for (int i0 = 0; i0 < C; i0 += 32) {
        const uint16_t* t = B.Ta_bf + i0 * C;
        for (int j0 = 0; j0 < K; j0 += 32) {
            P::gemm_block(C, t, B.XYb_bf + j0 * 2, K + V, nullptr, 0, blk, 32);
            P::pack_a(blk, 32, 32, 32, B.Wa_bf + i0 * K + j0, minus, K);
        }
        for (int j0 = 0; j0 < V; j0 += 32) {
            P::gemm_block(C, t, B.XYb_bf + (K + j0) * 2, K + V, nullptr, 0, blk, 32);
            for (int r = 0; r < 32; ++r) P::round_bf16(blk + r * 32, 32);
            P::gemm_block(K, B.Wa_bf + i0 * K, Sb + j0 * 2, V, blk, 32, vn, 32);
            P::pack_b(vn, 32, 32, 32, Vb + (int64_t(i0 / 2) * V + j0) * 2, nullptr, nullptr, DType::F32, V);
        }
    }
    GDN_STAGE(WUVn);
    // O = rd(qn exp(G)) rd(S) + rd(lower(qn kn^T D)) rd(Vn), its blocks converted straight into
    // the staged output rows [0, L).
    // One GEMM over K + C: A = [rd(qn exp(G)) | rd(P)], B = [rd(S); rd(Vn)] (Vb follows Sb).
    P::pack_a(B.q, K, C, K, B.QPa_bf, B.eG, K + C);
    P::pack_a(B.P, C, C, C, B.QPa_bf + K, nullptr, K + C);
    const int eo = dtype_bytes(A.out_dt);
    gemm_epilogue<P>(C, V, K + C, B.QPa_bf, Sb, nullptr, 0, [&](int i0, int j0, float* blk) {
        for (int r = 0; r < 32 && i0 + r < L; ++r)
            P::store_row(blk + r * 32, st.o + (i0 + r) * st.o_row + (j * V + j0) * eo, A.out_dt, 32);
    });
    GDN_STAGE(Out);
    // State: S = exp(G_last) rd(S) + rd((kn exp(G_last - G))^T) rd(Vn); the A operand is the
    // pair transpose of the pair-interleaved rows kn exp(G_last - G). A bf16 state's update per
    // 32x32 block, in L1: exp(G_last) rd(S) from its pack is the initial C, the result goes back
    // rounded into the pack (the fp32 S is not stored); any other state's S was decayed by its
    // pack and is updated in place.
    P::pack_b(B.k, K, C, K, B.Kd_bf, B.eL);
    P::transpose_pairs(B.Kd_bf, C / 2, 2 * K, B.KdT_bf);
    if (kept_packed) {
        for (int k0 = 0; k0 < K; k0 += 32)
            for (int j0 = 0; j0 < V; j0 += 32) {
                uint16_t* sb = Sb + (int64_t(k0 / 2) * V + j0) * 2;
                P::unpack_b_block(Sb, V, k0, j0, el, blk);
                P::gemm_block(C, B.KdT_bf + k0 * C, Vb + j0 * 2, V, blk, 32, vn, 32);
                P::pack_b(vn, 32, 32, 32, sb, nullptr, nullptr, DType::F32, V);
            }
    } else {
        P::gemm(K, V, C, B.KdT_bf, Vb, S, V, true);
    }
    GDN_STAGE(StateUpdate);
}

// One task, sequence n = item / (H / heads) and key heads [h0, h0 + heads): its value heads'
// states stay in B.S (fp32; a bf16 state: packed in B.svb, B.S only on the way in and out) across
// the chunks; per chunk, the rows are staged, then each key head
// and its value heads in turn (each value head's step first prefetches its share of the next
// chunk's input rows), then the output rows are written back.
template <class P, DType SD>
void chunk_item(void* ctx, int64_t item, int tid) {
    const auto& c = *static_cast<ChunkCtx*>(ctx);
    const ChunkArgs& A = *c.args;
    const int64_t group = A.HV / A.H, blocks = A.H / c.heads, n = item / blocks, h0 = item % blocks * c.heads;
    const int64_t slot = A.indices[n];
    const int64_t t0 = A.cu_seqlens[n], t1 = A.cu_seqlens[n + 1];
    if (slot < 0) return;
    const int64_t states = c.heads * group, KV = A.K * A.V;
    ChunkBuffers B(c.scratch->at(tid), A.K, A.V, states);
    const ChunkStage st(A, h0, c.heads, c.scratch->at(tid) + ChunkStage::offset(A.K, A.V, states));
    auto state = [&](int64_t j) { return state_row(A.state, slot, (st.hv0 + j) * KV); };
    GDN_STAGE(Begin);
    for (int64_t j = 0; j < states; ++j) {
        P::load_row(state(j), SD, B.S + j * KV, KV);
        if (SD == DType::BF16) P::pack_b(B.S + j * KV, A.V, int(A.K), int(A.V), B.svb(j, A.K, A.V));
    }
    P::tiles_begin();
    GDN_STAGE(StateLoad);
    for (int64_t c0 = t0; c0 < t1; c0 += kChunk) {
        const int64_t L = std::min<int64_t>(kChunk, t1 - c0);
        st.copy_in(A, c0, L);
        GDN_STAGE(StageIn);
        for (int64_t hb = 0; hb < c.heads; ++hb) {
            load_keys<P>(A, B, st, L, hb);
            for (int64_t j = hb * group; j < (hb + 1) * group; ++j) {
                st.prefetch_in(A, c0 + kChunk, j * kChunk / states, (j + 1) * kChunk / states, t1);
                chunk_step<P>(A, B, st, B.S + j * KV, L, j, SD);
            }
        }
        st.copy_out<P>(A, c0, L);
        GDN_STAGE(StageOut);
    }
    P::tiles_end();
    for (int64_t j = 0; j < states; ++j) {
        if (SD == DType::BF16) unpack_b_portable(B.svb(j, A.K, A.V), A.K, A.V, B.S + j * KV);
        P::round_store(B.S + j * KV, state(j), SD, KV);
    }
    GDN_STAGE(StateStore);
}

// Key heads per task: the most (a divisor of H) whose value heads' fp32 states take at most
// kChunkStateBytes, while the tasks still number at least two per thread.
constexpr int64_t kChunkStateBytes = 512 * 1024;
inline int64_t chunk_heads(const ChunkArgs& A) {
    int64_t best = 1;
    for (int64_t d = 2; d <= A.H; ++d)
        if (A.H % d == 0 && d * (A.HV / A.H) * A.K * A.V * 4 <= kChunkStateBytes &&
            A.N * (A.H / d) >= 2 * int64_t(std::max(1, A.num_threads)))
            best = d;
    return best;
}

template <class P>
void chunk_prefill(const ChunkArgs& A) {
    const int64_t heads = chunk_heads(A);
    Scratch scratch(A.num_threads, ChunkStage::offset(A.K, A.V, heads * (A.HV / A.H)) + ChunkStage::bytes(A, heads));
    ChunkCtx ctx{&A, &scratch, heads};
    const int64_t items = A.N * (A.H / heads);
    switch (A.state.dt) {
        case DType::F32: parallel_for(items, A.num_threads, &ctx, chunk_item<P, DType::F32>); break;
        case DType::BF16: parallel_for(items, A.num_threads, &ctx, chunk_item<P, DType::BF16>); break;
        case DType::F16: parallel_for(items, A.num_threads, &ctx, chunk_item<P, DType::F16>); break;
    }
}

// Test hook: C[M,N] = rd(A[M,Kd]) rd(B[Kd,N]) through the policy's packing and GEMM.
template <class P>
void gemm_bf16(int M, int N, int Kd, const float* A, const float* Bm, float* C) {
    Scratch s(1, (int64_t(M) * Kd + int64_t(Kd) * N) * 2);
    uint16_t* a = reinterpret_cast<uint16_t*>(s.at(0));
    uint16_t* b = a + int64_t(M) * Kd;
    P::pack_a(A, Kd, M, Kd, a);
    P::pack_b(const_cast<float*>(Bm), N, Kd, N, b);  // no rescale: Bm is only read
    P::tiles_begin();
    P::gemm(M, N, Kd, a, b, C, N, false);
    P::tiles_end();
}

}  // namespace
}  // namespace gdn

// Defines the ISA entry points of gdn_api.hpp in namespace gdn::NS for policy POLICY.
#define GDN_DEFINE_ISA(NS, POLICY)                                                          \
    namespace gdn { namespace NS {                                                          \
    void decode(const DecodeArgs& a) { gdn::decode<POLICY>(a); }                            \
    void spec_decode(const DecodeArgs& a) { gdn::spec_decode<POLICY>(a); }                  \
    void chunk_prefill(const ChunkArgs& a) { gdn::chunk_prefill<POLICY>(a); }               \
    void gemm_bf16(int M, int N, int Kd, const float* A, const float* B, float* C) {        \
        gdn::gemm_bf16<POLICY>(M, N, Kd, A, B, C);                                          \
    }                                                                                       \
    } }
