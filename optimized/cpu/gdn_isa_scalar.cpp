// Portable C++ build of the GDN kernels: no ISA extension; bf16 operands are rounded in
// software and multiplied in fp32, so the numbers follow the same rounding model as the
// AVX-512 and AMX builds (only the fp32 summation order differs).
#include "gdn_kernels.hpp"

namespace gdn {
namespace {

struct ScalarIsa {
    // The conversion loops test the type once, outside the loop, so the compiler vectorizes them
    // (the conversions in gdn_dtype.hpp are branch-free).
    static void load_row(const void* src, DType dt, float* dst, int64_t n) {
        const uint16_t* s = static_cast<const uint16_t*>(src);
        if (dt == DType::F32) std::memcpy(dst, src, size_t(n) * 4);
        else if (dt == DType::BF16) for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
        else for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
    }

    static void store_row(const float* src, void* dst, DType dt, int64_t n) {
        uint16_t* d = static_cast<uint16_t*>(dst);
        if (dt == DType::F32) std::memcpy(dst, src, size_t(n) * 4);
        else if (dt == DType::BF16) for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
        else for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
    }

    // bf16/fp16 rows are converted to fp32 into a stack buffer (w <= 128); fp32 rows are used in place.
    template <DType SD>
    static const float* row_f32(const void* src, int64_t w, float* buf) {
        if constexpr (SD == DType::F32) return static_cast<const float*>(src);
        load_row(src, SD, buf, w);
        return buf;
    }

    template <DType SD>
    static void stream_rows(const RowUpdate* up, const RowReduce* red, int64_t K, int64_t w, const void* next,
                            int64_t j0, int64_t j1) {
        const int eb = dtype_bytes(SD);
        float buf[128], n[128];
        float* __restrict kv = red ? red->kv : nullptr;
        float* __restrict sq = red ? red->sq : nullptr;
        const float* __restrict u = up ? up->u : nullptr;
        if (red && j0 == 0) {
            std::fill(kv, kv + w, 0.0f);
            std::fill(sq, sq + w, 0.0f);
        }
        const int64_t seg = walk_segment(K);
        for (int64_t i = j0; i < j1; ++i) {
            const Ahead ahead = ahead_of(red ? red->src : nullptr, red ? next : nullptr, seg, i, (red ? red->ld : 0) * eb);
            for (int s = 0; s < kRowStreams; ++s) {
                const int64_t r = s * seg + i;
                if (r >= K) break;
                prefetch_ahead(ahead, s, seg, K, (red ? red->ld : 0) * eb, w * eb);
                if (up) {
                    const float* __restrict row = up->wide ? up->wide + r * kDecodeBlock
                                                           : row_f32<SD>(static_cast<const char*>(up->src) + r * up->ld * eb, w, buf);
                    const float alpha = up->alpha, kr = up->k[r];
                    for (int64_t j = 0; j < w; ++j) n[j] = alpha * row[j] + kr * u[j];
                    store_row(n, static_cast<char*>(up->dst) + r * up->ld * eb, SD, w);
                }
                if (red) {
                    const float* __restrict row = row_f32<SD>(static_cast<const char*>(red->src) + r * red->ld * eb, w, buf);
                    if (red->wide) std::memcpy(red->wide + r * kDecodeBlock, row, size_t(w) * 4);
                    const float kr = red->k[r], qr = red->q[r];
                    for (int64_t j = 0; j < w; ++j) {
                        kv[j] += row[j] * kr;
                        sq[j] += row[j] * qr;
                    }
                }
            }
        }
    }

    static void transpose_pairs(const uint16_t* src, int64_t R, int64_t C2, uint16_t* dst) {
        const int64_t P2 = C2 / 2;
        for (int64_t p = 0; p < P2; ++p)
            for (int64_t r = 0; r < R; ++r) std::memcpy(dst + (p * R + r) * 2, src + (r * P2 + p) * 2, 4);
    }

    static void exp_row(const float* x, float* y, int64_t n) {
        for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
    }

    static void round_store(float* x, void* dst, DType dt, int64_t n) {
        store_row(x, dst, dt, n);
        load_row(dst, dt, x, n);
    }

    static void round_bf16(float* x, int64_t n) {
        for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    }

    static void pack_a(const float* src, int64_t lds, int M, int Kd, uint16_t* dst, const float* scale = nullptr,
                       int64_t ldd = 0) {
        for (int i = 0; i < M; ++i) {
            const float si = scale ? scale[i] : 1.0f;
            for (int k = 0; k < Kd; ++k) dst[i * (ldd ? ldd : Kd) + k] = f32_to_bf16(si * src[i * lds + k]);
        }
    }

    static void pack_b(float* src, int64_t lds, int Kd, int N, uint16_t* dst, const float* scale = nullptr,
                       const float* rescale = nullptr, DType round = DType::F32, int64_t ldd = 0) {
        const bool write_back = rescale || round != DType::F32;
        for (int k = 0; k < Kd; ++k) {
            const float sk = scale ? scale[k] : 1.0f;
            for (int j = 0; j < N; ++j) {
                const float x = round_to(src[k * lds + j], round);
                dst[(int64_t(k / 2) * (ldd ? ldd : N) + j) * 2 + (k & 1)] = f32_to_bf16(sk * x);
                if (write_back) src[k * lds + j] = rescale ? x * *rescale : x;
            }
        }
    }

    static void stream_out(void* dst, int64_t ldd, const void* src, int64_t lds, int64_t rows, int64_t n) {
        for (int64_t r = 0; r < rows; ++r)
            std::memcpy(static_cast<char*>(dst) + r * ldd, static_cast<const char*>(src) + r * lds, size_t(n));
    }

    static void tiles_begin() {}
    static void tiles_end() {}

    static void decay_rows(ChunkBuffers& B) { decay_rows_portable<ScalarIsa>(B); }
    static void solve_unit_lower(const float* M, float* T) { solve_unit_lower_portable(M, T); }
    static void sum_squares_rows(const float* x, int64_t rows, int64_t n, float* out) {
        for (int64_t i = 0; i < rows; ++i) out[i] = sum_squares(x + i * n, n);
    }

    static void gemm(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, float* C,
                     int64_t ldc, bool accumulate) {
        gemm_ld(M, N, Kd, A, B, N, C, ldc, accumulate);
    }

    static void gemm_block(int Kd, const uint16_t* A, const uint16_t* B, int64_t ldb, const float* cin,
                           int64_t ldin, float* blk, int64_t ldblk) {
        gemm_block_portable<ScalarIsa>(Kd, A, B, ldb, cin, ldin, blk, ldblk);
    }

    static void unpack_b_block(const uint16_t* B, int64_t ldb, int64_t k0, int64_t j0, float scale, float* blk) {
        unpack_b_block_portable(B, ldb, k0, j0, scale, blk);
    }

    // gemm with B's pair-rows ldb columns apart.
    static void gemm_ld(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, int64_t ldb, float* C,
                        int64_t ldc, bool accumulate) {
        float brow[2 * 256];
        for (int i = 0; i < M; ++i) {
            float* c = C + i * ldc;
            if (!accumulate) std::fill(c, c + N, 0.0f);
        }
        for (int p = 0; p < Kd / 2; ++p) {
            for (int j0 = 0; j0 < N; j0 += 256) {
                const int nb = std::min(256, N - j0);
                for (int j = 0; j < 2 * nb; ++j) brow[j] = bf16_to_f32(B[(p * ldb + j0) * 2 + j]);
                for (int i = 0; i < M; ++i) {
                    const float a0 = bf16_to_f32(A[int64_t(i) * Kd + 2 * p]);
                    const float a1 = bf16_to_f32(A[int64_t(i) * Kd + 2 * p + 1]);
                    float* c = C + i * ldc + j0;
                    for (int j = 0; j < nb; ++j) c[j] += a0 * brow[2 * j] + a1 * brow[2 * j + 1];
                }
            }
        }
    }
};

}  // namespace
}  // namespace gdn

GDN_DEFINE_ISA(scalar, ScalarIsa)
