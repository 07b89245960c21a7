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

    // 16 elements of type SD at p[i..] (lanes outside m read as zero) as fp32, and back (RNE).
    template <DType SD>
    static __m512 load16(const void* p, int64_t i, __mmask16 m) {
        if constexpr (SD == DType::F32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
        const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
        if constexpr (SD == DType::BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        else return _mm512_cvtph_ps(h);
    }

    template <DType SD>
    static void store16(void* p, int64_t i, __mmask16 m, __m512 x) {
        if constexpr (SD == DType::F32) {
            _mm512_mask_storeu_ps(static_cast<float*>(p) + i, m, x);
        } else if constexpr (SD == DType::BF16) {
            __m256bh h = _mm512_cvtneps_pbh(x);
            _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m, reinterpret_cast<__m256i&>(h));
        } else {
            _mm256_mask_storeu_epi16(static_cast<uint16_t*>(p) + i, m,
                                     _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
    }

    // One accumulator per 16-column vector (NV of them, in registers: the loops over i are fully
    // unrolled); a block of up to 128 columns covers a whole state row, so rows stream in order.
    template <DType SD, int NV>
    static void block_kv_n(const void* src, int64_t lds, int64_t K, const float* k, int64_t w, float* kv) {
        __mmask16 m[NV];
        masks<NV>(w, m);
        __m512 acc[NV];
#pragma GCC unroll 8
        for (int i = 0; i < NV; ++i) acc[i] = _mm512_setzero_ps();
        for (int64_t r = 0; r < K; ++r) {
            const __m512 kr = _mm512_set1_ps(k[r]);
#pragma GCC unroll 8
            for (int i = 0; i < NV; ++i) acc[i] = _mm512_fmadd_ps(load16<SD>(src, r * lds + 16 * i, m[i]), kr, acc[i]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < NV; ++i) _mm512_mask_storeu_ps(kv + 16 * i, m[i], acc[i]);
    }

    template <DType SD, int NV>
    static void block_update_n(const void* src, int64_t lds, void* dst, int64_t ldd, int64_t K, float alpha,
                               const float* k, const float* u, const float* q, int64_t w, float* o,
                               const void* next) {
        constexpr int eb = SD == DType::F32 ? 4 : 2;
        __mmask16 m[NV];
        masks<NV>(w, m);
        __m512 uv[NV], acc[NV];
        const __m512 av = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
        for (int i = 0; i < NV; ++i) {
            uv[i] = _mm512_maskz_loadu_ps(m[i], u + 16 * i);
            acc[i] = _mm512_setzero_ps();
        }
        for (int64_t r = 0; r < K; ++r) {
            if (next)
                for (int64_t b = 0; b < w * eb; b += 64)
                    _mm_prefetch(static_cast<const char*>(next) + r * lds * eb + b, _MM_HINT_T1);  // to L2: L1 holds this item
            const __m512 kr = _mm512_set1_ps(k[r]), qr = _mm512_set1_ps(q[r]);
#pragma GCC unroll 8
            for (int i = 0; i < NV; ++i) {
                const __m512 n = _mm512_fmadd_ps(av, load16<SD>(src, r * lds + 16 * i, m[i]), _mm512_mul_ps(kr, uv[i]));
                store16<SD>(dst, r * ldd + 16 * i, m[i], n);
                acc[i] = _mm512_fmadd_ps(n, qr, acc[i]);
            }
        }
#pragma GCC unroll 8
        for (int i = 0; i < NV; ++i) _mm512_mask_storeu_ps(o + 16 * i, m[i], acc[i]);
    }

    template <DType SD>
    static void block_kv(const void* src, int64_t lds, int64_t K, const float* k, int64_t w, float* kv) {
        if (w <= 64) block_kv_n<SD, 4>(src, lds, K, k, w, kv);
        else block_kv_n<SD, 8>(src, lds, K, k, w, kv);
    }

    template <DType SD>
    static void block_update(const void* src, int64_t lds, void* dst, int64_t ldd, int64_t K, float alpha,
                             const float* k, const float* u, const float* q, int64_t w, float* o,
                             const void* next) {
        if (w <= 64) block_update_n<SD, 4>(src, lds, dst, ldd, K, alpha, k, u, q, w, o, next);
        else block_update_n<SD, 8>(src, lds, dst, ldd, K, alpha, k, u, q, w, o, next);
    }

    static void pack_a(const float* src, int64_t lds, int M, int Kd, uint16_t* dst) {
        for (int i = 0; i < M; ++i) store_row(src + i * lds, dst + int64_t(i) * Kd, DType::BF16, Kd);
    }

    // Rows k, k+1 of src become interleaved pairs: one vcvtne2ps2bf16 and one word permute
    // per 16 columns. Kd is even.
    static void pack_b(const float* src, int64_t lds, int Kd, int N, uint16_t* dst) {
        const __m512i inter = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                               23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        for (int k = 0; k < Kd; k += 2) {
            const float* r0 = src + k * lds;
            const float* r1 = r0 + lds;
            uint16_t* d = dst + int64_t(k / 2) * N * 2;
            int j = 0;
            for (; j + 16 <= N; j += 16) {
                __m512bh both = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(r1 + j), _mm512_loadu_ps(r0 + j));
                _mm512_storeu_si512(d + j * 2, _mm512_permutexvar_epi16(inter, reinterpret_cast<__m512i&>(both)));
            }
            for (; j < N; ++j) {
                d[j * 2] = f32_to_bf16(r0[j]);
                d[j * 2 + 1] = f32_to_bf16(r1[j]);
            }
        }
    }

    // C[M,N] (+)= A B; 4 rows x 32 columns of accumulators; M % 4 == 0, N % 32 == 0, Kd even.
    static void gemm(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, float* C,
                     int64_t ldc, bool accumulate) {
        for (int i0 = 0; i0 < M; i0 += 4) {
            for (int j0 = 0; j0 < N; j0 += 32) {
                __m512 c[4][2];
                for (int r = 0; r < 4; ++r)
                    for (int h = 0; h < 2; ++h)
                        c[r][h] = accumulate ? _mm512_loadu_ps(C + (i0 + r) * ldc + j0 + 16 * h) : _mm512_setzero_ps();
                for (int p = 0; p < Kd / 2; ++p) {
                    __m512i b0 = _mm512_loadu_si512(B + (int64_t(p) * N + j0) * 2);
                    __m512i b1 = _mm512_loadu_si512(B + (int64_t(p) * N + j0 + 16) * 2);
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
