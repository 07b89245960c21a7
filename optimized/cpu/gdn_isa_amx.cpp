// AMX build of the GDN kernels: the chunk GEMMs run on AMX bf16 tiles, everything else is the
// AVX-512 policy. Compiled with the AVX-512 flags plus -mamx-tile -mamx-bf16; only called after
// isa_available(Isa::Amx) has granted tile-data permission.
#include <chrono>

#include "gdn_isa_avx512.hpp"

namespace gdn {
namespace {

// Palette 1, tiles 0-7 all 16 rows x 64 bytes: C tiles 0-3 (16x16 fp32), A tiles 4-5
// (16x32 bf16), B tiles 6-7 (16 pairs x 16 columns, pair-interleaved bf16).
struct alignas(64) TileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// The tile decode's configuration: C tiles 0-3 (12 x 16 fp32: rows 2p + parity for the parts p
// of k and q), A tile 4 (12 rows of 16 bf16 pairs), B tiles 5-6 (16 state rows x 32 bf16).
struct alignas(64) DecodeTileConfig {
    uint8_t palette = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64};
    uint8_t rows[16] = {12, 12, 12, 12, 12, 16, 16};
};

struct AmxIsa : Avx512Isa {
    static constexpr bool kTileDecode = true;

    // The A tiles of tile_kv_qs for k, q [K] (K % 16 == 0): k and q each split into three bf16
    // parts (hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid); their sum is x exactly,
    // bar fp32 values below ~1e-30, which the bf16 conversion and the tiles flush to zero). Tile
    // rb, row 2p + t (p: k parts 0-2, q parts 3-5; t: parity), word 2i + t holds part p of element
    // 16 rb + i and word 2i + 1 - t is zero, so a tile product with 16 state rows as B sums the
    // even (t = 0) or odd (t = 1) state columns.
    static void tile_a(const float* q, const float* k, int64_t K, uint16_t* tiles) {
        for (int64_t rb = 0; rb < K / 16; ++rb) {
            uint16_t* tile = tiles + rb * 12 * 32;
            for (int x = 0; x < 2; ++x) {
                __m512 rest = _mm512_loadu_ps((x ? q : k) + 16 * rb);
                for (int part = 0; part < 3; ++part) {
                    __m256bh h = _mm512_cvtneps_pbh(rest);
                    const __m512i wide = _mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(h));
                    rest = _mm512_sub_ps(rest, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
                    uint16_t* row = tile + (2 * (3 * x + part)) * 32;
                    _mm512_store_si512(row, wide);                             // t = 0
                    _mm512_store_si512(row + 32, _mm512_slli_epi32(wide, 16));  // t = 1
                }
            }
        }
    }

    // kv[j] = sum_r src[r, j] k[r] and qs[j] = sum_r src[r, j] q[r] for j < w (w % 32 == 0,
    // w <= 128), src bf16 [K, w] with row stride lds, from tile_a's tiles; prefetches the first
    // half of next's rows like block_kv.
    static void tile_kv_qs(const void* src, int64_t lds, int64_t K, const uint16_t* tiles, int64_t w, float* kv,
                           float* qs, const void* next) {
        static const DecodeTileConfig config;
        alignas(64) float c[4][12][16];
        const int64_t nc = w / 32, stride = lds * 2;
        _tile_loadconfig(&config);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t rb = 0; rb < K / 16; ++rb) {
            for (int64_t r = 16 * rb; r < 16 * rb + 16; ++r) prefetch_half(next, r, stride, w * 2, 0);
            const char* b = static_cast<const char*>(src) + 16 * rb * stride;
            _tile_loadd(4, tiles + rb * 12 * 32, 64);
            _tile_loadd(5, b, stride);
            _tile_dpbf16ps(0, 4, 5);
            if (nc > 1) {
                _tile_loadd(6, b + 64, stride);
                _tile_dpbf16ps(1, 4, 6);
            }
            if (nc > 2) {
                _tile_loadd(5, b + 128, stride);
                _tile_dpbf16ps(2, 4, 5);
            }
            if (nc > 3) {
                _tile_loadd(6, b + 192, stride);
                _tile_dpbf16ps(3, 4, 6);
            }
        }
        _tile_stored(0, c[0], 64);
        _tile_stored(1, c[1], 64);
        _tile_stored(2, c[2], 64);
        _tile_stored(3, c[3], 64);
        _tile_release();
        for (int64_t cb = 0; cb < nc; ++cb)
            for (int t = 0; t < 2; ++t)
                for (int n = 0; n < 16; ++n) {
                    const float(*m)[16] = c[cb];
                    kv[32 * cb + 2 * n + t] = m[4 + t][n] + m[2 + t][n] + m[t][n];
                    qs[32 * cb + 2 * n + t] = m[10 + t][n] + m[8 + t][n] + m[6 + t][n];
                }
    }

    // C[M,N] (+)= A B in 32x32 blocks (2x2 C tiles); M, N, Kd multiples of 32. Configures the
    // tiles on entry and releases them on exit, so no tile state outlives a call.
    static void gemm(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, float* C,
                     int64_t ldc, bool accumulate) {
        static const TileConfig config;
        _tile_loadconfig(&config);
        const int64_t sa = int64_t(Kd) * 2, sb = int64_t(N) * 4, sc = ldc * 4;
        for (int i0 = 0; i0 < M; i0 += 32) {
            for (int j0 = 0; j0 < N; j0 += 32) {
                float* c00 = C + i0 * ldc + j0;
                float* c10 = c00 + 16 * ldc;
                if (accumulate) {
                    _tile_loadd(0, c00, sc);
                    _tile_loadd(1, c00 + 16, sc);
                    _tile_loadd(2, c10, sc);
                    _tile_loadd(3, c10 + 16, sc);
                } else {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                }
                for (int k0 = 0; k0 < Kd; k0 += 32) {
                    _tile_loadd(4, A + int64_t(i0) * Kd + k0, sa);
                    _tile_loadd(5, A + int64_t(i0 + 16) * Kd + k0, sa);
                    _tile_loadd(6, B + (int64_t(k0 / 2) * N + j0) * 2, sb);
                    _tile_loadd(7, B + (int64_t(k0 / 2) * N + j0 + 16) * 2, sb);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
                _tile_stored(0, c00, sc);
                _tile_stored(1, c00 + 16, sc);
                _tile_stored(2, c10, sc);
                _tile_stored(3, c10 + 16, sc);
            }
        }
        _tile_release();
    }
};

struct PeakCtx { int64_t iters; };

void peak_run(void* ctx, int64_t, int) {
    static const TileConfig config;
    alignas(64) static thread_local uint8_t buf[1024] = {};
    const int64_t iters = static_cast<PeakCtx*>(ctx)->iters;
    _tile_loadconfig(&config);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf, 64);
    _tile_loadd(6, buf, 64);
    _tile_loadd(7, buf, 64);
    for (int64_t i = 0; i < iters; ++i) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, buf, 64);
    _tile_release();
}

}  // namespace
}  // namespace gdn

GDN_DEFINE_ISA(amx, AmxIsa)

namespace gdn {
namespace amx {

double tile_peak_seconds(int64_t iters, int num_threads) {
    PeakCtx ctx{iters};
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(num_threads, num_threads, &ctx, peak_run);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace amx
}  // namespace gdn
