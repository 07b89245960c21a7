// The C++ interface between the nanobind module, the runtime (threads, CPU probing) and the
// three ISA builds of the kernels (gdn_isa_scalar.cpp, gdn_isa_avx512.cpp, gdn_isa_amx.cpp).
//
// Shapes follow reference.gdn (varlen, tokens packed along T, state pool [S, HV, K, V],
// "kv" orientation, each slot contiguous with any slot stride). Arguments arrive validated:
// the kernels do no checking of their own.
#pragma once

#include <cstdint>
#include <string>

#include "gdn_dtype.hpp"

namespace gdn {

struct Input {  // a read-only, C-contiguous input tensor
    const void* p = nullptr;
    DType dt = DType::F32;
};

struct StatePool {  // [num_slots, HV, K, V], slot stride in elements
    void* p = nullptr;
    DType dt = DType::F32;
    int64_t slot_stride = 0;
    int64_t num_slots = 0;
};

// What every op shares: the q/k normalisation and scale, the output and the thread count.
struct OpOptions {
    float scale = 1.0f;
    bool l2norm = true;
    float eps = 1e-6f;         // l2norm: x / sqrt(sum x^2 + eps)
    void* out = nullptr;       // [T, HV, V] of out_dt
    DType out_dt = DType::F32;
    int num_threads = 1;
};

// How decode walks the state (every plan computes the same numbers, bit for bit):
//   Pipelined    one pass over state rows updates item i (read in the pass before) and reduces
//                item i + 1;
//   Blocked      per item and block of kDecodeBlock columns, a reduction pass and then the update
//                pass over the block's rows (still in L1);
//   BlockedKeep  Blocked; a 16-bit state's rows are kept widened to fp32 by the reduction pass
//                and the update reads them from there (no second conversion).
enum class DecodePlan : int { Pipelined = 0, Blocked = 1, BlockedKeep = 2 };

// Decode (one token per sequence, T == N) and spec decode (varlen, several tokens per sequence).
struct DecodeArgs : OpOptions {
    DecodePlan plan = DecodePlan::Pipelined;  // decode only
    int64_t T = 0, N = 0, H = 0, HV = 0, K = 0, V = 0;
    Input q, k, v;             // [T, H, K], [T, H, K], [T, HV, V]
    Input a, b;                // [T, HV] raw gate inputs
    Input A_log, dt_bias;      // [HV]
    StatePool state;
    const int32_t* indices = nullptr;        // decode: [N]; spec: [N, index_cols]
    int64_t index_cols = 1;
    const int32_t* cu_seqlens = nullptr;     // spec only: [N + 1]
    const int32_t* num_accepted = nullptr;   // spec only: [N]
};

// Chunked prefill (chunk 64, UT/WY form, state rounded once per chunk and at sequence end).
// Sequences are non-empty (cu_seqlens strictly increasing).
struct ChunkArgs : OpOptions {
    int64_t T = 0, N = 0, H = 0, HV = 0, K = 0, V = 0;
    Input q, k, v;             // [T, H, K], [T, H, K], [T, HV, V]
    Input g, beta;             // [T, HV]; g float32
    StatePool state;
    const int32_t* indices = nullptr;        // [N]
    const int32_t* cu_seqlens = nullptr;     // [N + 1]
};

constexpr int kChunk = 64;
constexpr int64_t kDecodeBlock = 64;  // columns per block of the Blocked decode plans

// One ISA build of the kernels. Each is defined in its own translation unit.
#define GDN_DECLARE_ISA(ns)                                              \
    namespace ns {                                                       \
    void decode(const DecodeArgs& args);                                 \
    void spec_decode(const DecodeArgs& args);                            \
    void chunk_prefill(const ChunkArgs& args);                           \
    /* bf16 GEMM C[M,N] = A[M,Kd] B[Kd,N] on fp32 inputs (test hook) */  \
    void gemm_bf16(int M, int N, int Kd, const float* A, const float* B, \
                   float* C);                                            \
    }
GDN_DECLARE_ISA(scalar)
GDN_DECLARE_ISA(avx512)
GDN_DECLARE_ISA(amx)
#undef GDN_DECLARE_ISA

namespace amx {
// Peak of the AMX bf16 tile unit: tdpbf16ps on register-resident tiles, `iters` rounds of
// four 16x16x32 products per thread on `num_threads` threads. Returns seconds elapsed.
double tile_peak_seconds(int64_t iters, int num_threads);
// The chunk kernel's AMX GEMM C[M,N] = A[M,Kd] B[Kd,N] (bf16 operands packed as the kernel packs
// them, fp32 C, all in cache), `iters` times per thread on `num_threads` threads. Returns seconds.
double gemm_seconds(int M, int N, int Kd, int64_t iters, int num_threads);
}

// Runtime (gdn_runtime.cpp, compiled without ISA flags).
enum class Isa : int { Scalar = 0, Avx512 = 1, Amx = 2 };
// Whether this CPU (and OS) can run `isa`; `reason` says why or why not, in words.
// Probing AMX asks the kernel for tile-data permission once per process.
bool isa_available(Isa isa, std::string* reason);
// Calls dispatched to each ISA build since the module loaded (the module counts each one as it
// dispatches it; gating, which has one portable build, counts as Scalar): the conformance records
// name the build that ran from these counts.
void count_dispatch(Isa isa);
int64_t dispatch_count(Isa isa);
int default_threads();
// Runs body(ctx, item, thread_id) for item in [0, n_items) on num_threads threads (dynamic
// schedule over runs of consecutive items): the calling thread plus workers kept across calls.
using ItemFn = void (*)(void* ctx, int64_t item, int tid);
void parallel_for(int64_t n_items, int num_threads, void* ctx, ItemFn body);
// Copies n bytes with num_threads threads (the memory-bandwidth ceiling of the perf gates).
void parallel_copy(void* dst, const void* src, int64_t n, int num_threads);
// Stage clocks of the chunked prefill, for a build with GDN_STAGE_CLOCKS defined (the CMake option
// of that name; `python -m bench.probes.gdn_prefill_stages`): each task's thread adds the steady-clock
// time since its previous mark to the stage a mark closes (ChunkClock::Begin only starts the count);
// in other builds the kernels mark nothing and the totals stay zero. Nanoseconds summed over threads.
enum class ChunkClock : int {
    StateLoad, StageIn, KeyRows, KeyGemms, Values, Decay, Solve, Packs, WUVn, Out, StateUpdate, StageOut, StateStore,
    Count, Begin = Count
};
extern const char* const kChunkClockNames[int(ChunkClock::Count)];
void chunk_clock_add(ChunkClock stage, int64_t ns);
int64_t chunk_clock_total(ChunkClock stage);
void chunk_clocks_reset();
// Per-thread scratch: one 64-byte aligned block of `bytes` per thread.
struct Scratch {
    Scratch(int num_threads, int64_t bytes);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    char* at(int tid) const { return base_ + int64_t(tid) * stride_; }
 private:
    char* base_;
    int64_t stride_;
};

}  // namespace gdn
