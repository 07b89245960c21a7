// Runtime support: CPU feature probing, AMX permission, threads, scratch. Compiled for the
// baseline x86-64 (or any) target: nothing here may execute an ISA extension.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "gdn_api.hpp"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace gdn {

namespace {

#if defined(__x86_64__) || defined(__i386__)
bool cpu_has(const char* what) {
    __builtin_cpu_init();
    // __builtin_cpu_supports needs a string literal, hence the explicit list.
    if (!std::strcmp(what, "avx512f")) return __builtin_cpu_supports("avx512f");
    if (!std::strcmp(what, "avx512bw")) return __builtin_cpu_supports("avx512bw");
    if (!std::strcmp(what, "avx512vl")) return __builtin_cpu_supports("avx512vl");
    if (!std::strcmp(what, "avx512bf16")) return __builtin_cpu_supports("avx512bf16");
    if (!std::strcmp(what, "amx-tile")) return __builtin_cpu_supports("amx-tile");
    if (!std::strcmp(what, "amx-bf16")) return __builtin_cpu_supports("amx-bf16");
    return false;
}
#else
bool cpu_has(const char*) { return false; }
#endif

bool missing_flags(const char* const* flags, int n, std::string* reason) {
    std::string missing;
    for (int i = 0; i < n; ++i)
        if (!cpu_has(flags[i])) missing += std::string(missing.empty() ? "" : ", ") + flags[i];
    if (missing.empty()) return false;
    *reason = "this CPU lacks " + missing;
    return true;
}

// Linux refuses AMX tile data until the process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM).
bool request_amx_permission(std::string* why_not) {
    static std::once_flag once;
    static bool granted = false;
    static std::string message;
    std::call_once(once, [] {
#if defined(__linux__) && defined(__x86_64__)
        constexpr long kReqXcompPerm = 0x1023, kGetXcompPerm = 0x1022, kXtileData = 18;
        if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0) {
            message = "the kernel refused AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM failed)";
            return;
        }
        unsigned long mask = 0;
        if (syscall(SYS_arch_prctl, kGetXcompPerm, &mask) != 0 || !(mask & (1ul << kXtileData))) {
            message = "AMX tile data permission not reported after arch_prctl";
            return;
        }
        granted = true;
#else
        message = "AMX needs Linux on x86-64 (arch_prctl)";
#endif
    });
    if (!granted) *why_not = message;
    return granted;
}

}  // namespace

bool isa_available(Isa isa, std::string* reason) {
    static const char* const avx512[] = {"avx512f", "avx512bw", "avx512vl", "avx512bf16"};
    static const char* const amx[] = {"avx512f", "avx512bw", "avx512vl", "avx512bf16",
                                      "amx-tile", "amx-bf16"};
    switch (isa) {
        case Isa::Scalar:
            *reason = "portable C++, runs everywhere";
            return true;
        case Isa::Avx512:
            if (missing_flags(avx512, 4, reason)) return false;
            *reason = "AVX-512 F/BW/VL/BF16 present";
            return true;
        case Isa::Amx:
            if (missing_flags(amx, 6, reason)) return false;
            if (!request_amx_permission(reason)) return false;
            *reason = "AMX tile + bf16 present, tile-data permission granted";
            return true;
    }
    *reason = "unknown ISA";
    return false;
}

namespace {
std::atomic<int64_t> dispatches[3];  // indexed by Isa
}  // namespace

const char* const kChunkClockNames[int(ChunkClock::Count)] = {
    "state load", "stage in", "key rows", "key gemms", "values", "decay", "solve", "W U Vn packs", "W U Vn", "out",
    "state update", "stage out", "state store"};

namespace {
std::atomic<int64_t> chunk_clocks[int(ChunkClock::Count)];
}

void chunk_clock_add(ChunkClock stage, int64_t ns) { chunk_clocks[int(stage)].fetch_add(ns, std::memory_order_relaxed); }
int64_t chunk_clock_total(ChunkClock stage) { return chunk_clocks[int(stage)].load(std::memory_order_relaxed); }
void chunk_clocks_reset() {
    for (auto& c : chunk_clocks) c.store(0, std::memory_order_relaxed);
}

void count_dispatch(Isa isa) { dispatches[int(isa)].fetch_add(1, std::memory_order_relaxed); }

int64_t dispatch_count(Isa isa) { return dispatches[int(isa)].load(std::memory_order_relaxed); }

int default_threads() {
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
#endif
    unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

namespace {

// Worker threads kept across calls (spawning and joining them cost about 20 us per thread per
// call, a large share of a small decode). One job at a time: a call holds `call` while its job
// runs, so concurrent callers (the module releases the GIL) take turns. The pool is never
// destroyed (threads blocked on its condition variable end with the process); a forked child
// starts a fresh pool, since the parent's workers do not exist there.
class Pool {
  public:
    void run(int64_t n_items, int nt, void* ctx, ItemFn body) {
        std::lock_guard<std::mutex> call(call_);
        // Items go out in runs of `grain` consecutive items (about 16 runs per thread), so a thread
        // usually knows its next item (the decode kernels prefetch its state).
        const int64_t grain = std::max<int64_t>(1, n_items / (int64_t(nt) * 16));
        {
            std::lock_guard<std::mutex> lock(m_);
            while (int(workers_.size()) < nt - 1) {
                const int tid = int(workers_.size()) + 1;
                workers_.emplace_back([this, tid] { loop(tid); });
                workers_.back().detach();
            }
            job_ = Job{n_items, grain, ctx, body, nt};
            next_.store(0);
            pending_ = nt - 1;
            ++generation_;
        }
        start_.notify_all();
        work(0);
        std::unique_lock<std::mutex> lock(m_);
        done_.wait(lock, [this] { return pending_ == 0; });
    }

  private:
    struct Job {
        int64_t n_items, grain;
        void* ctx;
        ItemFn body;
        int nt;
    };

    void work(int tid) {
        const Job j = job_;
        for (int64_t i0 = next_.fetch_add(j.grain); i0 < j.n_items; i0 = next_.fetch_add(j.grain))
            for (int64_t i = i0; i < std::min(i0 + j.grain, j.n_items); ++i) j.body(j.ctx, i, tid);
    }

    void loop(int tid) {
        uint64_t seen = 0;
        for (;;) {
            {
                std::unique_lock<std::mutex> lock(m_);
                start_.wait(lock, [&] { return generation_ != seen; });
                seen = generation_;
                if (tid >= job_.nt) continue;  // this job wants fewer threads
            }
            work(tid);
            std::lock_guard<std::mutex> lock(m_);
            if (--pending_ == 0) done_.notify_one();
        }
    }

    std::mutex call_, m_;
    std::condition_variable start_, done_;
    std::vector<std::thread> workers_;
    Job job_{};
    std::atomic<int64_t> next_{0};
    int pending_ = 0;
    uint64_t generation_ = 0;
};

Pool* pool_ = nullptr;
std::once_flag pool_once_;

Pool& pool() {
    std::call_once(pool_once_, [] {
        pool_ = new Pool();
#if defined(__linux__)
        pthread_atfork(nullptr, nullptr, [] { pool_ = new Pool(); });
#endif
    });
    return *pool_;
}

}  // namespace

void parallel_for(int64_t n_items, int num_threads, void* ctx, ItemFn body) {
    if (n_items <= 0) return;
    int nt = num_threads < 1 ? 1 : num_threads;
    if (nt > n_items) nt = int(n_items);
    if (nt == 1) {
        for (int64_t i = 0; i < n_items; ++i) body(ctx, i, 0);
        return;
    }
    pool().run(n_items, nt, ctx, body);
}

void parallel_copy(void* dst, const void* src, int64_t n, int num_threads) {
    int nt = num_threads < 1 ? 1 : num_threads;
    const int64_t piece = (n + nt - 1) / nt;
    struct Ctx { char* d; const char* s; int64_t n, piece; } c{static_cast<char*>(dst),
                                                               static_cast<const char*>(src), n, piece};
    parallel_for(nt, nt, &c, [](void* p, int64_t i, int) {
        auto* c = static_cast<Ctx*>(p);
        int64_t lo = i * c->piece, hi = lo + c->piece < c->n ? lo + c->piece : c->n;
        if (hi > lo) std::memcpy(c->d + lo, c->s + lo, size_t(hi - lo));
    });
}

Scratch::Scratch(int num_threads, int64_t bytes) {
    stride_ = (bytes + 63) / 64 * 64;
    if (stride_ == 0) stride_ = 64;
    base_ = static_cast<char*>(std::aligned_alloc(64, size_t(stride_) * size_t(num_threads < 1 ? 1 : num_threads)));
    if (!base_) throw std::bad_alloc();
}

Scratch::~Scratch() { std::free(base_); }

}  // namespace gdn
