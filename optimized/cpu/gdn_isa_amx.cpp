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

struct AmxIsa : Avx512Isa {
    // Tile configuration for the GEMMs of one task (a chunk prefill item, a test GEMM): loaded
    // once before them and released after, so no tile state outlives a task.
    static void tiles_begin() {
        static const TileConfig config;
        _tile_loadconfig(&config);
    }
    static void tiles_end() { _tile_release(); }

    // One 32x32 block (2x2 C tiles): cout = cin + A B (cin null: 0) with A's 32 rows sa bytes
    // apart, B pair-interleaved with its pair-rows sb bytes apart, C rows ldin / ldout floats
    // apart; each element sums its k-steps in increasing k.
    static void block(int Kd, const uint16_t* A, int64_t sa, const uint16_t* B, int64_t sb,
                      const float* cin, int64_t ldin, float* cout, int64_t ldout) {
        if (cin) {
            _tile_loadd(0, cin, ldin * 4);
            _tile_loadd(1, cin + 16, ldin * 4);
            _tile_loadd(2, cin + 16 * ldin, ldin * 4);
            _tile_loadd(3, cin + 16 * ldin + 16, ldin * 4);
        } else {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int k0 = 0; k0 < Kd; k0 += 32) {
            _tile_loadd(4, A + k0, sa);
            _tile_loadd(5, A + 16 * (sa / 2) + k0, sa);
            _tile_loadd(6, B + int64_t(k0 / 2) * (sb / 2), sb);
            _tile_loadd(7, B + int64_t(k0 / 2) * (sb / 2) + 32, sb);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        _tile_stored(0, cout, ldout * 4);
        _tile_stored(1, cout + 16, ldout * 4);
        _tile_stored(2, cout + 16 * ldout, ldout * 4);
        _tile_stored(3, cout + 16 * ldout + 16, ldout * 4);
    }

    // C[M,N] (+)= A B in 32x32 blocks; M, N, Kd multiples of 32; between tiles_begin() and
    // tiles_end().
    static void gemm(int M, int N, int Kd, const uint16_t* A, const uint16_t* B, float* C,
                     int64_t ldc, bool accumulate) {
        for (int i0 = 0; i0 < M; i0 += 32)
            for (int j0 = 0; j0 < N; j0 += 32) {
                float* c = C + i0 * ldc + j0;
                block(Kd, A + int64_t(i0) * Kd, int64_t(Kd) * 2, B + int64_t(j0) * 2, int64_t(N) * 4,
                      accumulate ? c : nullptr, ldc, c, ldc);
            }
    }

    // blk[32][32] (rows ldblk apart) = cin + A B (cin null: 0), A [32, Kd] row-major, B
    // pair-interleaved with rows of ldb columns, cin rows ldin apart.
    static void gemm_block(int Kd, const uint16_t* A, const uint16_t* B, int64_t ldb, const float* cin,
                           int64_t ldin, float* blk, int64_t ldblk) {
        block(Kd, A, int64_t(Kd) * 2, B, ldb * 4, cin, ldin, blk, ldblk);
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

// The chunk kernel's own GEMM (AmxIsa::gemm) at one shape, `iters` times per thread on operands
// that stay in cache (each thread's own, packed once, values irrelevant to the timing).
struct GemmCtx {
    int M, N, Kd;
    int64_t iters;
};

void gemm_run(void* ctx, int64_t, int) {
    const auto& c = *static_cast<GemmCtx*>(ctx);
    const int64_t na = int64_t(c.M) * c.Kd, nb = int64_t(c.Kd) * c.N;
    Scratch s(1, (na + nb) * 2 + int64_t(c.M) * c.N * 4);
    uint16_t* a = reinterpret_cast<uint16_t*>(s.at(0));
    uint16_t* b = a + na;
    float* out = reinterpret_cast<float*>(b + nb);
    std::fill(a, b + nb, uint16_t(0x3c00));  // bf16 1/128
    AmxIsa::tiles_begin();
    for (int64_t i = 0; i < c.iters; ++i) AmxIsa::gemm(c.M, c.N, c.Kd, a, b, out, c.N, false);
    AmxIsa::tiles_end();
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

double gemm_seconds(int M, int N, int Kd, int64_t iters, int num_threads) {
    GemmCtx ctx{M, N, Kd, iters};
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(num_threads, num_threads, &ctx, gemm_run);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace amx
}  // namespace gdn
