// AVX-512 policy of the GDN kernels: vectorised fp32 <-> bf16/fp16 row conversions with scalar
// tails, bf16 packing, and a GEMM on AVX512-BF16 dot products (vdpbf16ps). Included only by
// translation units compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16.
// Note: vcvtneps2bf16 flushes fp32 denormal inputs to zero (the scalar path keeps them); the
// difference is below 1.2e-38 in absolute value.
#pragma once

#include <immintrin.h>

#include "gdn_kernels.hpp"

namespace gdn {
namespace {

struct Avx512Isa {
    static void load_row(const void* src, DType dt, float* dst, int64_t n) {
        if (dt == DType::F32) { std::memcpy(dst, src, size_t(n) * 4); return; }
        const uint16_t* s = static_cast<const uint16_t*>(src);
        int64_t i = 0;
        if (dt == DType::BF16) {
            for (; i + 16 <= n; i += 16) {
                __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
                _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
            }
        } else {
            for (; i + 16 <= n; i += 16)
                _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
        }
        for (; i < n; ++i) dst[i] = load_scalar(src, dt, i);
    }

    static void store_row(const float* src, void* dst, DType dt, int64_t n) {
        if (dt == DType::F32) { std::memcpy(dst, src, size_t(n) * 4); return; }
        uint16_t* d = static_cast<uint16_t*>(dst);
        int64_t i = 0;
        if (dt == DType::BF16) {
            for (; i + 16 <= n; i += 16) {
                __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), reinterpret_cast<__m256i&>(h));
            }
        } else {
            for (; i + 16 <= n; i += 16)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i),
                                    _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        for (; i < n; ++i) store_scalar(dst, dt, i, src[i]);
    }

    // Masks of the NV 16-lane vectors covering w <= 16 NV columns.
    template <int NV>
    static void masks(int64_t w, __mmask16* m) {
        for (int i = 0; i < NV; ++i) {
            const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, w - 16 * i));
            m[i] = __mmask16((1u << n) - 1u);
        }
    }

    // 32 elements of type SD at p[i..] as two fp32 vectors (lanes outside m0, m1 read as zero),
    // and back (RNE). bf16 moves as one 64-byte load or store: a zero-masked word permute widens
    // each half (one instruction per 16 elements) and one vcvtne2ps2bf16 narrows both.
    template <DType SD>
    static void load32(const void* p, int64_t i, __mmask16 m0, __mmask16 m1, __m512& a, __m512& b) {
        if constexpr (SD == DType::F32) {
            a = _mm512_maskz_loadu_ps(m0, static_cast<const float*>(p) + i);
            b = _mm512_maskz_loadu_ps(m1, static_cast<const float*>(p) + i + 16);
        } else if constexpr (SD == DType::BF16) {
            const __m512i lo_idx = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0,
                                                    7, 0, 6, 0, 5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
            const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
            const __mmask32 m = __mmask32(m0) | (__mmask32(m1) << 16);
            const __m512i x = _mm512_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
            a = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, lo_idx, x));
            b = _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(0xAAAAAAAAu, hi_idx, x));
        } else {
            const uint16_t* h = static_cast<const uint16_t*>(p) + i;
            a = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, h));
            b = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, h + 16));
        }
    }

    // For the reductions: 32 elements at p[i..] as two fp32 vectors in any fixed lane order (lanes
    // outside m0, m1 read as zero), undone by natural32 on the sums. bf16: the even elements
    // (a 32-bit word shifted left by 16) and the odd ones (its high half), two shifts or ANDs on
    // either vector port instead of two word permutes on one; otherwise load32's order.
    template <DType SD>
    static void load32_any(const void* p, int64_t i, __mmask16 m0, __mmask16 m1, __m512& a, __m512& b) {
        if constexpr (SD == DType::BF16) {
            const __m512i x = _mm512_maskz_loadu_epi16(__mmask32(m0) | (__mmask32(m1) << 16), static_cast<const uint16_t*>(p) + i);
            a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
            b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(int(0xFFFF0000u))));
        } else {
            load32<SD>(p, i, m0, m1, a, b);
        }
    }

    // Sums of load32_any-ordered vectors a, b back to columns in order (bf16: even and odd columns
    // interleaved), and the inverse, for sums that a pass continues.
    template <DType SD>
    static void natural32(__m512& a, __m512& b) {
        if constexpr (SD == DType::BF16) {
            const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
            const __m512 e = a, o = b;
            a = _mm512_permutex2var_ps(e, lo, o);
            b = _mm512_permutex2var_ps(e, hi, o);
        }
    }

    template <DType SD>
    static void any32(__m512& a, __m512& b) {
        if constexpr (SD == DType::BF16) {
            const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
            const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
            const __m512 lo = a, hi = b;
            a = _mm512_permutex2var_ps(lo, even, hi);
            b = _mm512_permutex2var_ps(lo, odd, hi);
        }
    }

    template <DType SD>
    static void store32(void* p, int64_t i, __mmask16 m0, __mmask16 m1, __m512 a, __m512 b) {
        if constexpr (SD == DType::F32) {
            _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m0, a);
            _mm512_mask_storeu_ps(static_cast<float*>(p) + i + 16, m1, b);
        } else if constexpr (SD == DType::BF16) {
            __m512bh h = _mm512_cvtne2ps_pbh(b, a);  // words 0-15 from a, 16-31 from b
            _mm512_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, __mmask32(m0) | (__mmask32(m1) << 16),
                                     reinterpret_cast<__m512i&>(h));
        } else {
            constexpr int rne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            uint16_t* h = static_cast<uint16_t*>(p) + i;
            _mm256_mask_storeu_epi16(h, m0, _mm512_cvtps_ph(a, rne));
            _mm256_mask_storeu_epi16(h + 16, m1, _mm512_cvtps_ph(b, rne));
        }
    }

    // One pass over the rows j0 <= j < j1 of the segments of K rows of NV 16-column vectors (NV even,
    // w <= 16 NV), in the row order of walk_segment (kRowStreams sequential streams side by side):
    // per row, the update of `up` (UP) and then the reductions of `red` (RED), whose 2 NV
    // accumulators stay in registers (the loops over i are fully unrolled; from zero at j0 = 0, else
    // from red's sums); u is read from a stack copy each row. A 16-bit row is widened and narrowed
    // in the same pass that streams it (load32 / store32). WIDE (one of UP, RED; NV = 4): the
    // reduction stores its widened rows to red->wide, the update reads them from up->wide.
    template <DType SD, int NV, bool UP, bool RED, bool WIDE = false>
    static void stream_rows_n(const RowUpdate* up, const RowReduce* red, int64_t K, int64_t w, const void* next,
                              int64_t j0, int64_t j1) {
        constexpr int eb = SD == DType::F32 ? 4 : 2;
        __mmask16 m[NV];
        masks<NV>(w, m);
        __m512 kv[NV], sq[NV];
#pragma GCC unroll 8
        for (int i = 0; i < NV; ++i) kv[i] = sq[i] = _mm512_setzero_ps();
        if (RED && j0 > 0) {
#pragma GCC unroll 4
            for (int i = 0; i < NV; i += 2) {
                kv[i] = _mm512_maskz_loadu_ps(m[i], red->kv + 16 * i);
                kv[i + 1] = _mm512_maskz_loadu_ps(m[i + 1], red->kv + 16 * i + 16);
                sq[i] = _mm512_maskz_loadu_ps(m[i], red->sq + 16 * i);
                sq[i + 1] = _mm512_maskz_loadu_ps(m[i + 1], red->sq + 16 * i + 16);
                if constexpr (!WIDE) {
                    any32<SD>(kv[i], kv[i + 1]);
                    any32<SD>(sq[i], sq[i + 1]);
                }
            }
        }
        // The fields in locals: the compiler cannot tell that the stores leave *up unchanged.
        static_assert(!WIDE || (NV * 16 == kDecodeBlock && UP != RED), "wide rows: one pass, kDecodeBlock columns");
        const void* us = UP ? up->src : nullptr;
        const float* uw = UP && WIDE ? up->wide : nullptr;
        float* rw = RED && WIDE ? red->wide : nullptr;
        void* ud = UP ? up->dst : nullptr;
        const int64_t uld = UP ? up->ld : 0, rld = RED ? red->ld : 0;
        const float* uk = UP ? up->k : nullptr;
        alignas(64) float uu[16 * NV];  // u on the stack: one base register for its loads
        if constexpr (UP)
#pragma GCC unroll 8
            for (int i = 0; i < NV; ++i) _mm512_store_ps(uu + 16 * i, _mm512_maskz_loadu_ps(m[i], up->u + 16 * i));
        const void* rs = RED ? red->src : nullptr;
        const float *rk = RED ? red->k : nullptr, *rq = RED ? red->q : nullptr;
        const __m512 av = _mm512_set1_ps(UP ? up->alpha : 0.0f);
        const int64_t seg = walk_segment(K);
        for (int64_t j = j0; j < j1; ++j) {
            const Ahead ahead = ahead_of(RED ? rs : nullptr, RED ? next : nullptr, seg, j, rld * eb);
            for (int s = 0; s < kRowStreams; ++s) {
                const int64_t r = s * seg + j;
                if (r >= K) break;
                if constexpr (RED) prefetch_ahead(ahead, s, seg, K, rld * eb, w * eb);
                if constexpr (UP) {
                    const __m512 kr = _mm512_set1_ps(uk[r]);
#pragma GCC unroll 4
                    for (int i = 0; i < NV; i += 2) {
                        __m512 s0, s1;
                        if constexpr (WIDE) {
                            s0 = _mm512_loadu_ps(uw + r * kDecodeBlock + 16 * i);
                            s1 = _mm512_loadu_ps(uw + r * kDecodeBlock + 16 * i + 16);
                        } else {
                            load32<SD>(us, r * uld + 16 * i, m[i], m[i + 1], s0, s1);
                        }
                        const __m512 n0 = _mm512_fmadd_ps(av, s0, _mm512_mul_ps(kr, _mm512_load_ps(uu + 16 * i)));
                        const __m512 n1 = _mm512_fmadd_ps(av, s1, _mm512_mul_ps(kr, _mm512_load_ps(uu + 16 * i + 16)));
                        store32<SD>(ud, r * uld + 16 * i, m[i], m[i + 1], n0, n1);
                    }
                }
                if constexpr (RED) {
                    const __m512 kr = _mm512_set1_ps(rk[r]), qr = _mm512_set1_ps(rq[r]);
#pragma GCC unroll 4
                    for (int i = 0; i < NV; i += 2) {
                        __m512 s0, s1;
                        if constexpr (WIDE) load32<SD>(rs, r * rld + 16 * i, m[i], m[i + 1], s0, s1);
                        else load32_any<SD>(rs, r * rld + 16 * i, m[i], m[i + 1], s0, s1);
                        if constexpr (WIDE) {
                            _mm512_storeu_ps(rw + r * kDecodeBlock + 16 * i, s0);
                            _mm512_storeu_ps(rw + r * kDecodeBlock + 16 * i + 16, s1);
                        }
                        kv[i] = _mm512_fmadd_ps(s0, kr, kv[i]);
                        kv[i + 1] = _mm512_fmadd_ps(s1, kr, kv[i + 1]);
                        sq[i] = _mm512_fmadd_ps(s0, qr, sq[i]);
                        sq[i + 1] = _mm512_fmadd_ps(s1, qr, sq[i + 1]);
                    }
                }
            }
        }
        if constexpr (RED && !WIDE)
#pragma GCC unroll 4
            for (int i = 0; i < NV; i += 2) {
                natural32<SD>(kv[i], kv[i + 1]);
                natural32<SD>(sq[i], sq[i + 1]);
            }
        if constexpr (RED) {
#pragma GCC unroll 8
            for (int i = 0; i < NV; ++i) {
                _mm512_mask_storeu_ps(red->kv + 16 * i, m[i], kv[i]);
                _mm512_mask_storeu_ps(red->sq + 16 * i, m[i], sq[i]);
            }
        }
    }

    template <DType SD, int NV>
    static void stream_rows_w(const RowUpdate* up, const RowReduce* red, int64_t K, int64_t w, const void* next,
                              int64_t j0, int64_t j1) {
        if (up && red) stream_rows_n<SD, NV, true, true>(up, red, K, w, next, j0, j1);
        else if (up) stream_rows_n<SD, NV, true, false>(up, red, K, w, next, j0, j1);
        else stream_rows_n<SD, NV, false, true>(up, red, K, w, next, j0, j1);
    }

    template <DType SD>
    static void stream_rows(const RowUpdate* up, const RowReduce* red, int64_t K, int64_t w, const void* next,
                            int64_t j0, int64_t j1) {
        if (up && !red && up->wide) stream_rows_n<SD, 4, true, false, true>(up, red, K, w, next, j0, j1);
        else if (red && !up && red->wide) stream_rows_n<SD, 4, false, true, true>(up, red, K, w, next, j0, j1);
        else if (w <= 64) stream_rows_w<SD, 4>(up, red, K, w, next, j0, j1);
        else stream_rows_w<SD, 8>(up, red, K, w, next, j0, j1);
    }

    // 32-bit word transpose in 16 x 16 blocks held in registers (unpack 32, unpack 64, two
    // 128-bit lane shuffles); R and C2 / 2 multiples of 16, else word by word.
    static void transpose_pairs(const uint16_t* src, int64_t R, int64_t C2, uint16_t* dst) {
        const int64_t P2 = C2 / 2;
        const uint32_t* s = reinterpret_cast<const uint32_t*>(src);
        uint32_t* d = reinterpret_cast<uint32_t*>(dst);
        if (R % 16 || P2 % 16) {
            for (int64_t p = 0; p < P2; ++p)
                for (int64_t r = 0; r < R; ++r) d[p * R + r] = s[r * P2 + p];
            return;
        }
        for (int64_t r0 = 0; r0 < R; r0 += 16)
            for (int64_t p0 = 0; p0 < P2; p0 += 16) {
                __m512i x[16], y[16];
                for (int i = 0; i < 16; ++i) x[i] = _mm512_loadu_si512(s + (r0 + i) * P2 + p0);
                for (int i = 0; i < 16; i += 2) {
                    y[i] = _mm512_unpacklo_epi32(x[i], x[i + 1]);
                    y[i + 1] = _mm512_unpackhi_epi32(x[i], x[i + 1]);
                }
                for (int i = 0; i < 16; i += 4) {
                    x[i] = _mm512_unpacklo_epi64(y[i], y[i + 2]);
                    x[i + 1] = _mm512_unpackhi_epi64(y[i], y[i + 2]);
                    x[i + 2] = _mm512_unpacklo_epi64(y[i + 1], y[i + 3]);
                    x[i + 3] = _mm512_unpackhi_epi64(y[i + 1], y[i + 3]);
                }
                // x[4a + b] holds, in 128-bit lane l, rows 4a .. 4a + 3 of column 4l + b; gather
                // lane l of x[b], x[4 + b], x[8 + b], x[12 + b] into y[4l + b] = column 4l + b.
                for (int b = 0; b < 4; ++b) {
                    const __m512i t0 = _mm512_shuffle_i32x4(x[b], x[4 + b], 0x88);  // lanes 0, 2
                    const __m512i t1 = _mm512_shuffle_i32x4(x[b], x[4 + b], 0xDD);  // lanes 1, 3
                    const __m512i t2 = _mm512_shuffle_i32x4(x[8 + b], x[12 + b], 0x88);
                    const __m512i t3 = _mm512_shuffle_i32x4(x[8 + b], x[12 + b], 0xDD);
                    y[b] = _mm512_shuffle_i32x4(t0, t2, 0x88);
                    y[4 + b] = _mm512_shuffle_i32x4(t1, t3, 0x88);
                    y[8 + b] = _mm512_shuffle_i32x4(t0, t2, 0xDD);
                    y[12 + b] = _mm512_shuffle_i32x4(t1, t3, 0xDD);
                }
                for (int c = 0; c < 16; ++c) _mm512_storeu_si512(d + (p0 + c) * R + r0, y[c]);
            }
    }

    // exp(x) = 2^n exp(r), n = round(x log2 e), r = x - n ln 2 (two-part ln 2), exp(r) by the
    // degree-7 Cephes polynomial; x clamped above at 88.7, and results below the normal range
    // (x < -87.33) are 0: a denormal result costs a microcode assist on Intel cores, and the
    // decay mask asks for exp(-200) on every entry above the diagonal.
    static __m512 exp16(__m512 x) {
        const __mmask16 normal = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33f), _CMP_GE_OQ);
        x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.7f)), _mm512_set1_ps(-87.33f));
        const __m512 n = _mm512_maskz_roundscale_ps(0xFFFF, _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
        r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
        __m512 p = _mm512_set1_ps(1.9875691500e-4f);
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
        p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
        return _mm512_maskz_scalef_ps(normal, p, n);
    }

    static void exp_row(const float* x, float* y, int64_t n) {
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - i)) - 1u);
            _mm512_mask_storeu_ps(y + i, m, exp16(_mm512_maskz_loadu_ps(m, x + i)));
        }
    }

    // dst <- x rounded to dt (nearest even), x <- the stored values, in one pass.
    static void round_store(float* x, void* dst, DType dt, int64_t n) {
        if (dt == DType::F32) { std::memcpy(dst, x, size_t(n) * 4); return; }
        uint16_t* d = static_cast<uint16_t*>(dst);
        int64_t i = 0;
        if (dt == DType::BF16) {
            for (; i + 16 <= n; i += 16) {
                __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
                const __m256i w = reinterpret_cast<__m256i&>(h);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), w);
                _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w), 16)));
            }
        } else {
            for (; i + 16 <= n; i += 16) {
                const __m256i w = _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), w);
                _mm512_storeu_ps(x + i, _mm512_cvtph_ps(w));
            }
        }
        for (; i < n; ++i) {
            store_scalar(dst, dt, i, x[i]);
            x[i] = load_scalar(dst, dt, i);
        }
    }

    static void round_bf16(float* x, int64_t n) {
        int64_t i = 0;
        for (; i + 16 <= n; i += 16) {
            __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
            const __m512i w = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(h));
            _mm512_storeu_ps(x + i, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
        for (; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    }

    // dst[i][k] = rd(scale[i] src[i][k]) (scale null: 1), dst rows ldd apart (0: Kd).
    static void pack_a(const float* src, int64_t lds, int M, int Kd, uint16_t* dst, const float* scale = nullptr,
                       int64_t ldd = 0) {
        for (int i = 0; i < M; ++i) {
            const float* r = src + i * lds;
            uint16_t* d = dst + i * (ldd ? ldd : Kd);
            const __m512 sv = _mm512_set1_ps(scale ? scale[i] : 1.0f);
            int k = 0;
            for (; k + 32 <= Kd; k += 32) {
                __m512bh h = _mm512_cvtne2ps_pbh(_mm512_mul_ps(sv, _mm512_loadu_ps(r + k + 16)),
                                                 _mm512_mul_ps(sv, _mm512_loadu_ps(r + k)));
                _mm512_storeu_si512(d + k, reinterpret_cast<__m512i&>(h));
            }
            for (; k < Kd; ++k) d[k] = f32_to_bf16((scale ? scale[i] : 1.0f) * r[k]);
        }
    }

    // x rounded to R (nearest even) and back to fp32; R = F32: x.
    template <DType R>
    static __m512 round16(__m512 x) {
        if constexpr (R == DType::BF16) {
            __m256bh h = _mm512_cvtneps_pbh(x);
            return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(h)), 16));
        } else if constexpr (R == DType::F16) {
            return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else {
            return x;
        }
    }

    // Rows k, k+1 of src (first rounded to R unless F32, then times scale[k], scale[k + 1]; null: 1)
    // become interleaved pairs: one vcvtne2ps2bf16 and one word permute per 16 columns; with
    // rescale, or with R not F32, src <- (rounded) src times rescale (null: 1) in the same pass.
    // Kd is even; dst pair-rows ldd columns apart.
    template <DType R>
    static void pack_b_r(float* src, int64_t lds, int Kd, int N, uint16_t* dst, const float* scale,
                         const float* rescale, int64_t ldd) {
        const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                               23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        const bool write_back = rescale || R != DType::F32;
        const float rs = rescale ? *rescale : 1.0f;
        const __m512 rv = _mm512_set1_ps(rs);
        for (int k = 0; k < Kd; k += 2) {
            float* r0 = src + k * lds;
            float* r1 = r0 + lds;
            const float s0 = scale ? scale[k] : 1.0f, s1 = scale ? scale[k + 1] : 1.0f;
            const __m512 sv0 = _mm512_set1_ps(s0), sv1 = _mm512_set1_ps(s1);
            uint16_t* d = dst + int64_t(k / 2) * ldd * 2;
            int j = 0;
            for (; j + 16 <= N; j += 16) {
                const __m512 a = round16<R>(_mm512_loadu_ps(r0 + j)), b = round16<R>(_mm512_loadu_ps(r1 + j));
                __m512bh both = _mm512_cvtne2ps_pbh(_mm512_mul_ps(sv1, b), _mm512_mul_ps(sv0, a));
                _mm512_storeu_si512(d + j * 2, _mm512_permutexvar_epi16(inter, reinterpret_cast<__m512i&>(both)));
                if (write_back) {
                    _mm512_storeu_ps(r0 + j, _mm512_mul_ps(rv, a));
                    _mm512_storeu_ps(r1 + j, _mm512_mul_ps(rv, b));
                }
            }
            for (; j < N; ++j) {
                const float a = round_to(r0[j], R), b = round_to(r1[j], R);
                d[j * 2] = f32_to_bf16(s0 * a);
                d[j * 2 + 1] = f32_to_bf16(s1 * b);
                if (write_back) {
                    r0[j] = rs * a;
                    r1[j] = rs * b;
                }
            }
        }
    }

    static void pack_b(float* src, int64_t lds, int Kd, int N, uint16_t* dst, const float* scale = nullptr,
                       const float* rescale = nullptr, DType round = DType::F32, int64_t ldd = 0) {
        switch (round) {
            case DType::F32: pack_b_r<DType::F32>(src, lds, Kd, N, dst, scale, rescale, ldd ? ldd : N); break;
            case DType::BF16: pack_b_r<DType::BF16>(src, lds, Kd, N, dst, scale, rescale, ldd ? ldd : N); break;
            case DType::F16: pack_b_r<DType::F16>(src, lds, Kd, N, dst, scale, rescale, ldd ? ldd : N); break;
        }
    }

    // Rows of n bytes, src rows lds bytes apart, to dst rows ldd bytes apart: the whole 64-byte
    // lines of dst with non-temporal stores (a written-once output: no read for ownership, no
    // cache lines taken), the ends with ordinary ones; then a store fence.
    static void stream_out(void* dst, int64_t ldd, const void* src, int64_t lds, int64_t rows, int64_t n) {
        for (int64_t r = 0; r < rows; ++r) {
            char* d = static_cast<char*>(dst) + r * ldd;
            const char* s = static_cast<const char*>(src) + r * lds;
            const int64_t head = std::min<int64_t>(n, int64_t((64 - reinterpret_cast<uintptr_t>(d) % 64) % 64));
            std::memcpy(d, s, size_t(head));
            int64_t i = head;
            for (; i + 64 <= n; i += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(d + i), _mm512_loadu_si512(s + i));
            std::memcpy(d + i, s + i, size_t(n - i));
        }
        _mm_sfence();
    }

    static void tiles_begin() {}
    static void tiles_end() {}

    // decay_rows_portable in registers: per row i and 16-column vector up to the diagonal, the
    // exponent G_i - G_j (-200 right of the diagonal, exp16 gives 0 there), exp16, then M and P
    // masked to j < i and j <= i; M rounded to bf16 values.
    static void decay_rows(ChunkBuffers& B) {
        constexpr int C = kChunk;
        static_assert(C % 16 == 0, "decay_rows: whole vectors");
        for (int i = 0; i < C; ++i) {
            const __m512 gi = _mm512_set1_ps(B.G[i]), bi = _mm512_set1_ps(B.beta[i]);
            for (int j0 = 0; j0 < C; j0 += 16) {
                float* m = B.M + i * C + j0;
                float* p = B.P + i * C + j0;
                if (j0 > i) {
                    _mm512_storeu_ps(m, _mm512_setzero_ps());
                    _mm512_storeu_ps(p, _mm512_setzero_ps());
                    continue;
                }
                const int on = i - j0;  // lanes l <= on are j <= i
                const __mmask16 le = on >= 15 ? __mmask16(0xFFFF) : __mmask16((2u << on) - 1u);
                const __mmask16 lt = __mmask16(le >> 1 | (on >= 16 ? 0x8000u : 0u));
                const __m512 d = exp16(_mm512_mask_sub_ps(_mm512_set1_ps(-200.0f), le, gi, _mm512_loadu_ps(B.G + j0)));
                const __m512 mv = _mm512_maskz_mul_ps(lt, _mm512_mul_ps(bi, _mm512_loadu_ps(B.KK + i * C + j0)), d);
                _mm512_storeu_ps(m, round16<DType::BF16>(mv));
                _mm512_storeu_ps(p, _mm512_maskz_mul_ps(le, _mm512_loadu_ps(B.QK + i * C + j0), d));
            }
        }
    }

    // solve_unit_lower_portable with the accumulators in registers and two rows at a time (i even
    // and i + 1: both sum m < i, then row i + 1 adds m = i once row i is stored); the same FMAs in
    // the same order per accumulator.
    template <int NV>
    static void solve_rows(const float* M, float* T) {
        constexpr int C = kChunk, N = 16 * NV;
        const __m512i sign = _mm512_set1_epi32(int32_t(0x80000000u));
        auto finish = [&](int i, const __m512* a0, const __m512* a1) {
            float* Ti = T + i * C;
            for (int v = 0; v < NV; ++v)
                _mm512_storeu_ps(Ti + 16 * v, _mm512_castsi512_ps(_mm512_xor_si512(
                                                  _mm512_castps_si512(_mm512_add_ps(a0[v], a1[v])), sign)));
            for (int j = N; j < C; j += 16) _mm512_storeu_ps(Ti + j, _mm512_setzero_ps());
            Ti[i] = 1.0f;
        };
        for (int i = N - 16; i < N; i += 2) {
            __m512 a0[NV], a1[NV], b0[NV], b1[NV];
            for (int v = 0; v < NV; ++v) a0[v] = a1[v] = b0[v] = b1[v] = _mm512_setzero_ps();
            const float* Ma = M + i * C;
            const float* Mb = Ma + C;
            for (int m = 0; m < i; m += 2) {
                const __m512 xa0 = _mm512_set1_ps(Ma[m]), xa1 = _mm512_set1_ps(Ma[m + 1]);
                const __m512 xb0 = _mm512_set1_ps(Mb[m]), xb1 = _mm512_set1_ps(Mb[m + 1]);
                const float* T0 = T + m * C;
                const float* T1 = T0 + C;
                for (int v = 0; v < NV; ++v) {
                    const __m512 t0 = _mm512_loadu_ps(T0 + 16 * v), t1 = _mm512_loadu_ps(T1 + 16 * v);
                    a0[v] = _mm512_fmadd_ps(xa0, t0, a0[v]);
                    a1[v] = _mm512_fmadd_ps(xa1, t1, a1[v]);
                    b0[v] = _mm512_fmadd_ps(xb0, t0, b0[v]);
                    b1[v] = _mm512_fmadd_ps(xb1, t1, b1[v]);
                }
            }
            finish(i, a0, a1);
            const __m512 xb = _mm512_set1_ps(Mb[i]);
            for (int v = 0; v < NV; ++v) b0[v] = _mm512_fmadd_ps(xb, _mm512_loadu_ps(T + i * C + 16 * v), b0[v]);
            finish(i + 1, b0, b1);
        }
    }

    // sum_squares of 16 rows at a time: each row's 16 partial sums in one vector (the same FMAs in
    // the same order), the 16 vectors transposed, then the partial sums added in order 0..15 for
    // the 16 rows at once. Rows left over, or n not a multiple of 16: sum_squares.
    static void sum_squares_rows(const float* x, int64_t rows, int64_t n, float* out) {
        int64_t r0 = 0;
        if (n % 16 == 0)
            for (; r0 + 16 <= rows; r0 += 16) {
                alignas(64) float part[16][16], col[16][16];
                for (int r = 0; r < 16; ++r) {
                    const float* xr = x + (r0 + r) * n;
                    __m512 a = _mm512_setzero_ps();
                    for (int64_t i = 0; i < n; i += 16) {
                        const __m512 v = _mm512_loadu_ps(xr + i);
                        a = _mm512_fmadd_ps(v, v, a);
                    }
                    _mm512_store_ps(part[r], a);
                }
                transpose_pairs(reinterpret_cast<const uint16_t*>(part), 16, 32, reinterpret_cast<uint16_t*>(col));
                __m512 ss = _mm512_setzero_ps();
                for (int j = 0; j < 16; ++j) ss = _mm512_add_ps(ss, _mm512_load_ps(col[j]));
                _mm512_storeu_ps(out + r0, ss);
            }
        for (int64_t r = r0; r < rows; ++r) out[r] = sum_squares(x + r * n, n);
    }

    static void solve_unit_lower(const float* M, float* T) {
        static_assert(kChunk == 64, "solve_unit_lower: four blocks of 16 rows");
        solve_rows<1>(M, T);
        solve_rows<2>(M, T);
        solve_rows<3>(M, T);
        solve_rows<4>(M, T);
    }

    // C[M,N] (+)= A B; 4 rows x 32 columns of accumulators; M % 4 == 0, N % 32 == 0, Kd even.
    static void gemm(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, float* C,
                     int64_t ldc, bool accumulate) {
        gemm_ld(M, N, Kd, A, B, N, C, ldc, accumulate);
    }

    static void gemm_block(int Kd, const uint16_t* A, const uint16_t* B, int64_t ldb, const float* cin,
                           int64_t ldin, float* blk, int64_t ldblk) {
        gemm_block_portable<Avx512Isa>(Kd, A, B, ldb, cin, ldin, blk, ldblk);
    }

    // Per 16 columns of a pair-row: the low halves shifted up, the high halves masked.
    static void unpack_b_block(const uint16_t* B, int64_t ldb, int64_t k0, int64_t j0, float scale, float* blk) {
        const __m512 sv = _mm512_set1_ps(scale);
        const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
        for (int p = 0; p < 16; ++p) {
            const uint16_t* w = B + ((k0 / 2 + p) * ldb + j0) * 2;
            for (int h = 0; h < 2; ++h) {
                const __m512i x = _mm512_loadu_si512(w + 32 * h);
                _mm512_storeu_ps(blk + 2 * p * 32 + 16 * h, _mm512_mul_ps(sv, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16))));
                _mm512_storeu_ps(blk + (2 * p + 1) * 32 + 16 * h,
                                 _mm512_mul_ps(sv, _mm512_castsi512_ps(_mm512_and_si512(x, high))));
            }
        }
    }

    // gemm with B's pair-rows ldb columns apart.
    static void gemm_ld(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, int64_t ldb, float* C,
                        int64_t ldc, bool accumulate) {
        for (int i0 = 0; i0 < M; i0 += 4) {
            for (int j0 = 0; j0 < N; j0 += 32) {
                __m512 c[4][2];
                for (int r = 0; r < 4; ++r)
                    for (int h = 0; h < 2; ++h)
                        c[r][h] = accumulate ? _mm512_loadu_ps(C + (i0 + r) * ldc + j0 + 16 * h) : _mm512_setzero_ps();
                for (int p = 0; p < Kd / 2; ++p) {
                    __m512i b0 = _mm512_loadu_si512(B + (p * ldb + j0) * 2);
                    __m512i b1 = _mm512_loadu_si512(B + (p * ldb + j0 + 16) * 2);
                    for (int r = 0; r < 4; ++r) {
                        int32_t pair;
                        std::memcpy(&pair, A + int64_t(i0 + r) * Kd + 2 * p, 4);
                        __m512i a = _mm512_set1_epi32(pair);
                        c[r][0] = _mm512_dpbf16_ps(c[r][0], reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b0));
                        c[r][1] = _mm512_dpbf16_ps(c[r][1], reinterpret_cast<__m512bh&>(a), reinterpret_cast<__m512bh&>(b1));
                    }
                }
                for (int r = 0; r < 4; ++r)
                    for (int h = 0; h < 2; ++h) _mm512_storeu_ps(C + (i0 + r) * ldc + j0 + 16 * h, c[r][h]);
            }
        }
    }
};

}  // namespace
}  // namespace gdn
