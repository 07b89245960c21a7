// The memory ceiling of the CPU perf gates: an in-place read-modify-write stream, the access
// pattern of a recurrent-state update (each line read once and written back once, no
// read-for-ownership), run on the kernels' own thread pool (parallel_for), so that no other
// runtime's spinning threads share the cores while it is timed.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "gdn_api.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace gdn {
namespace {

constexpr int64_t kItemWords = 1 << 15;  // 256 KiB per work item, scheduled dynamically

// x[i] += c over n 64-bit words; c arrives at run time, so the pass cannot be elided.
__attribute__((target_clones("avx512f", "avx2", "default")))
void add_words(uint64_t* x, int64_t n, uint64_t c) {
    for (int64_t i = 0; i < n; ++i) x[i] += c;
}

struct RmwCtx {
    uint64_t* x;
    int64_t n;
    uint64_t c;
};

void rmw_item(void* p, int64_t item, int) {
    auto* ctx = static_cast<RmwCtx*>(p);
    const int64_t lo = item * kItemWords;
    const int64_t hi = lo + kItemWords < ctx->n ? lo + kItemWords : ctx->n;
    add_words(ctx->x + lo, hi - lo, ctx->c);
}

using Words = nb::ndarray<uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

void rmw_stream(const Words& buf, uint64_t addend, int num_threads) {
    if (num_threads < 1)
        throw std::invalid_argument(("num_threads: expected >= 1, got " + std::to_string(num_threads)).c_str());
    if (buf.shape(0) == 0) throw std::invalid_argument("buf: empty; nothing to stream");
    RmwCtx ctx{buf.data(), int64_t(buf.shape(0)), addend};
    nb::gil_scoped_release release;
    parallel_for((ctx.n + kItemWords - 1) / kItemWords, num_threads, &ctx, rmw_item);
}

}  // namespace

void bind_ceilings(nb::module_& m) {
    m.def("rmw_stream", &rmw_stream, "buf"_a.noconvert(), "addend"_a, "num_threads"_a,
          "buf (uint64 words, 1-D, contiguous) += addend in place on num_threads threads of the kernels' pool.");
}

}  // namespace gdn
