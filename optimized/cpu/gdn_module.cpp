// nanobind module optimized.cpu._gdn: argument checking and ISA dispatch of the GDN kernels.
//
// Every check happens here, before any kernel code runs: dtype (TypeError), shape, strides,
// finiteness, index ranges and head sizes (ValueError, thrown as std::invalid_argument, which
// nanobind translates), each message naming the argument.
// Arrays arrive through DLPack or the buffer protocol (NumPy, torch, JAX); bf16 may be a
// torch/JAX bfloat16 array or a NumPy uint16 view of the bits. Outputs are never converted.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gdn_api.hpp"
#include "gdn_gating.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace gdn {
namespace {

using InArray = nb::ndarray<nb::ro, nb::device::cpu>;
using OutArray = nb::ndarray<nb::device::cpu>;

// Python-style tuple text. (std::to_string, not iostreams: an ostringstream crashed this module
// on a machine whose Python process had loaded another libstdc++.)
std::string shape_str(const std::vector<int64_t>& s) {
    std::string o = "(";
    for (size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
    return o + (s.size() == 1 ? ",)" : ")");
}

template <class A>
std::vector<int64_t> shape_of(const A& a) {
    std::vector<int64_t> s(a.ndim());
    for (size_t i = 0; i < a.ndim(); ++i) s[i] = int64_t(a.shape(i));
    return s;
}

template <class A>
std::string dtype_str(const A& a) {
    auto d = a.dtype();
    const char* kind = d.code == uint8_t(nb::dlpack::dtype_code::Float) ? "float"
                     : d.code == uint8_t(nb::dlpack::dtype_code::Bfloat) ? "bfloat"
                     : d.code == uint8_t(nb::dlpack::dtype_code::Int) ? "int"
                     : d.code == uint8_t(nb::dlpack::dtype_code::UInt) ? "uint"
                     : "other";
    return std::string(kind) + std::to_string(int(d.bits));
}

// float32, bfloat16 (or its uint16 view), float16.
template <class A>
DType float_dtype(const char* name, const A& a, bool allow_16bit = true) {
    auto d = a.dtype();
    if (d.lanes == 1) {
        if (d.code == uint8_t(nb::dlpack::dtype_code::Float) && d.bits == 32) return DType::F32;
        if (allow_16bit && d.bits == 16) {
            if (d.code == uint8_t(nb::dlpack::dtype_code::Bfloat)) return DType::BF16;
            if (d.code == uint8_t(nb::dlpack::dtype_code::UInt)) return DType::BF16;
            if (d.code == uint8_t(nb::dlpack::dtype_code::Float)) return DType::F16;
        }
    }
    throw nb::type_error((std::string(name) + ": expected " +
                          (allow_16bit ? "float32, bfloat16 (or a uint16 view of bf16 bits) or float16"
                                       : "float32") +
                          ", got " + dtype_str(a)).c_str());
}

template <class A>
void check_shape(const char* name, const A& a, const std::vector<int64_t>& want, const char* dims) {
    if (shape_of(a) != want)
        throw std::invalid_argument((std::string(name) + ": expected shape " + dims + " = " + shape_str(want) +
                               ", got " + shape_str(shape_of(a))).c_str());
}

template <class A>
void check_ndim(const char* name, const A& a, size_t ndim, const char* dims) {
    if (a.ndim() != ndim)
        throw std::invalid_argument((std::string(name) + ": expected " + std::to_string(ndim) + " dimensions " +
                               dims + ", got shape " + shape_str(shape_of(a))).c_str());
}

template <class A>
void check_contiguous(const char* name, const A& a) {
    int64_t expect = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
        if (a.shape(i) != 1 && a.stride(i) != expect)
            throw std::invalid_argument((std::string(name) + ": expected a C-contiguous array, got strides " +
                                   [&] { std::vector<int64_t> s(a.ndim());
                                         for (size_t j = 0; j < a.ndim(); ++j) s[j] = a.stride(j);
                                         return shape_str(s); }() + " (in elements) for shape " +
                                   shape_str(shape_of(a))).c_str());
        expect *= int64_t(a.shape(i));
    }
}

// NaN/Inf check by bit pattern (exponent all ones): a branch-free OR over the elements, which
// vectorises in the element's width; the count for the message only when one is found.
template <class U>
int64_t count_nonfinite(const U* u, int64_t n, U m) {
    U any = 0;
    for (int64_t i = 0; i < n; ++i) any |= U((u[i] & m) == m);
    if (!any) return 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += (u[i] & m) == m;
    return bad;
}

void check_finite(const char* name, const void* p, DType dt, int64_t n) {
    const int64_t bad = dt == DType::F32 ? count_nonfinite(static_cast<const uint32_t*>(p), n, uint32_t(0x7f800000u))
                                         : count_nonfinite(static_cast<const uint16_t*>(p), n,
                                                           uint16_t(dt == DType::BF16 ? 0x7f80u : 0x7c00u));
    if (bad)
        throw std::invalid_argument((std::string(name) + ": " + std::to_string(bad) +
                               " NaN or Inf values; inputs must be finite").c_str());
}

// A float input: dtype, shape, contiguity and finiteness checked.
Input float_input(const char* name, const InArray& a, const std::vector<int64_t>& shape, const char* dims,
                  bool allow_16bit = true) {
    Input in;
    in.dt = float_dtype(name, a, allow_16bit);
    check_shape(name, a, shape, dims);
    check_contiguous(name, a);
    in.p = a.data();
    check_finite(name, in.p, in.dt, int64_t(a.size()));
    return in;
}

const int32_t* int32_input(const char* name, const InArray& a, const std::vector<int64_t>& shape, const char* dims) {
    auto d = a.dtype();
    if (!(d.code == uint8_t(nb::dlpack::dtype_code::Int) && d.bits == 32 && d.lanes == 1))
        throw nb::type_error((std::string(name) + ": expected int32, got " + dtype_str(a)).c_str());
    check_shape(name, a, shape, dims);
    check_contiguous(name, a);
    return static_cast<const int32_t*>(a.data());
}

// cu_seqlens: starts at 0, strictly increasing (no empty sequence), ends at T.
void check_cu_seqlens(const int32_t* cu, int64_t N, int64_t T) {
    if (cu[0] != 0) throw std::invalid_argument(("cu_seqlens: must start at 0, got " + std::to_string(cu[0])).c_str());
    for (int64_t n = 0; n < N; ++n)
        if (cu[n + 1] <= cu[n])
            throw std::invalid_argument(("cu_seqlens: must be strictly increasing (no empty sequence), but cu_seqlens[" +
                                   std::to_string(n + 1) + "] = " + std::to_string(cu[n + 1]) + " <= cu_seqlens[" +
                                   std::to_string(n) + "] = " + std::to_string(cu[n])).c_str());
    if (cu[N] != T)
        throw std::invalid_argument(("cu_seqlens: must end at the token count " + std::to_string(T) + ", got " +
                               std::to_string(cu[N])).c_str());
}

// Slot indices: each in [0, num_slots) or -1, no slot twice (two writers would race).
void check_slots(const char* name, const int32_t* idx, int64_t count, int64_t num_slots) {
    std::vector<int64_t> seen(size_t(num_slots), -1);
    for (int64_t i = 0; i < count; ++i) {
        const int64_t s = idx[i];
        if (s == -1) continue;
        if (s < -1 || s >= num_slots)
            throw std::invalid_argument((std::string(name) + ": entry " + std::to_string(i) + " is " + std::to_string(s) +
                                   ", expected -1 or a slot in [0, " + std::to_string(num_slots) + ")").c_str());
        if (seen[size_t(s)] != -1)
            throw std::invalid_argument((std::string(name) + ": slot " + std::to_string(s) + " appears twice (entries " +
                                   std::to_string(seen[size_t(s)]) + " and " + std::to_string(i) + ")").c_str());
        seen[size_t(s)] = i;
    }
}

// State pool [S, HV, K, V]: float dtype, each slot contiguous, slots not overlapping.
StatePool state_pool(const OutArray& st, int64_t HV, int64_t K, int64_t V) {
    StatePool pool;
    pool.dt = float_dtype("state", st);
    check_ndim("state", st, 4, "[S, HV, K, V]");
    std::vector<int64_t> want = {int64_t(st.shape(0)), HV, K, V};
    check_shape("state", st, want, "[S, HV, K, V]");
    if (st.shape(0) == 0) throw std::invalid_argument("state: the pool has no slots");
    if (st.stride(3) != 1 || st.stride(2) != V || st.stride(1) != K * V ||
        (st.shape(0) > 1 && st.stride(0) < HV * K * V))
        throw std::invalid_argument(("state: each slot must be contiguous [HV, K, V] with strides (>= " +
                               std::to_string(HV * K * V) + ", " + std::to_string(K * V) + ", " + std::to_string(V) +
                               ", 1) in elements, got (" + std::to_string(st.stride(0)) + ", " +
                               std::to_string(st.stride(1)) + ", " + std::to_string(st.stride(2)) + ", " +
                               std::to_string(st.stride(3)) + ")").c_str());
    pool.p = st.data();
    pool.slot_stride = st.stride(0);
    pool.num_slots = int64_t(st.shape(0));
    return pool;
}

// Bytes [lo, hi) an argument occupies, by name (for the overlap check of the output).
struct Extent {
    const char* name;
    const char* lo;
    const char* hi;
};

template <class A>
Extent extent(const char* name, const A& a) {  // a C-contiguous array
    const char* lo = static_cast<const char*>(a.data());
    return {name, lo, lo + a.nbytes()};
}

Extent extent(const StatePool& pool, int64_t HV, int64_t K, int64_t V) {
    const char* lo = static_cast<const char*>(pool.p);
    const int64_t elems = (pool.num_slots - 1) * pool.slot_stride + HV * K * V;
    return {"state", lo, lo + elems * dtype_bytes(pool.dt)};
}

// An output shares no byte with the other arguments the kernel reads or writes meanwhile.
void check_disjoint(const Extent& written, std::initializer_list<Extent> others) {
    for (const Extent& e : others)
        if (written.lo < e.hi && e.lo < written.hi)
            throw std::invalid_argument((std::string(written.name) + ": overlaps " + e.name + " in memory").c_str());
}

// out [T, HV, V]: float dtype, shape, C-contiguous, disjoint from ``others`` (the inputs and state).
void* output(const OutArray& out, const std::vector<int64_t>& shape, DType* dt, std::initializer_list<Extent> others) {
    *dt = float_dtype("out", out);
    check_shape("out", out, shape, "[T, HV, V]");
    check_contiguous("out", out);
    check_disjoint(extent("out", out), others);
    return out.data();
}

// The kernels skip padding sequences; their rows of o are zero (the caller's out may hold anything).
void zero_rows(void* out, DType dt, int64_t row_elems, int64_t t0, int64_t t1) {
    const int64_t row_bytes = row_elems * dtype_bytes(dt);
    std::memset(static_cast<char*>(out) + t0 * row_bytes, 0, size_t((t1 - t0) * row_bytes));
}

// q, k [T, H, K] and v [T, HV, V]: sets T, H, HV, K, V.
void token_inputs(const InArray& q, const InArray& k, const InArray& v, int64_t* T, int64_t* H,
                  int64_t* HV, int64_t* K, int64_t* V, Input* qi, Input* ki, Input* vi) {
    check_ndim("q", q, 3, "[T, H, K]");
    check_ndim("v", v, 3, "[T, HV, V]");
    *T = int64_t(q.shape(0)); *H = int64_t(q.shape(1)); *K = int64_t(q.shape(2));
    *HV = int64_t(v.shape(1)); *V = int64_t(v.shape(2));
    if (*T == 0) throw std::invalid_argument("q: zero tokens; nothing to compute");
    if (*H == 0 || *K == 0) throw std::invalid_argument(("q: empty head axis, shape " + shape_str(shape_of(q))).c_str());
    if (*HV == 0 || *V == 0) throw std::invalid_argument(("v: empty head axis, shape " + shape_str(shape_of(v))).c_str());
    if (*HV % *H != 0)
        throw std::invalid_argument(("v: value heads HV = " + std::to_string(*HV) + " must be a multiple of the key heads H = " +
                               std::to_string(*H)).c_str());
    *qi = float_input("q", q, {*T, *H, *K}, "[T, H, K]");
    *ki = float_input("k", k, {*T, *H, *K}, "[T, H, K]");
    *vi = float_input("v", v, {*T, *HV, *V}, "[T, HV, V]");
}

Isa parse_isa(const std::string& isa) {
    Isa which;
    if (isa == "amx") which = Isa::Amx;
    else if (isa == "avx512") which = Isa::Avx512;
    else if (isa == "scalar") which = Isa::Scalar;
    else if (isa == "auto") {
        std::string why;
        which = isa_available(Isa::Amx, &why) ? Isa::Amx : isa_available(Isa::Avx512, &why) ? Isa::Avx512 : Isa::Scalar;
        return which;
    } else {
        throw std::invalid_argument(("isa: expected 'auto', 'amx', 'avx512' or 'scalar', got '" + isa + "'").c_str());
    }
    std::string why;
    if (!isa_available(which, &why))
        throw std::invalid_argument(("isa: '" + isa + "' cannot run here: " + why).c_str());
    return which;
}

DecodePlan parse_plan(const std::string& plan) {
    if (plan == "pipelined") return DecodePlan::Pipelined;
    if (plan == "blocked") return DecodePlan::Blocked;
    if (plan == "blocked-keep") return DecodePlan::BlockedKeep;
    throw std::invalid_argument(("plan: expected 'pipelined', 'blocked' or 'blocked-keep', got '" + plan +
                                 "'").c_str());
}

// Each thread gets its own scratch; more threads than this is a mistake, not a machine.
constexpr int kMaxThreads = 1024;

int thread_count(int num_threads) {
    if (num_threads < 1 || num_threads > kMaxThreads)
        throw std::invalid_argument(("num_threads: expected an integer in [1, " + std::to_string(kMaxThreads) +
                                     "], got " + std::to_string(num_threads)).c_str());
    return num_threads;
}

void check_scalars(float scale, float eps) {
    if (!(std::isfinite(scale) && scale > 0))
        throw std::invalid_argument(("scale: expected a positive finite number, got " + std::to_string(scale)).c_str());
    if (!(std::isfinite(eps) && eps >= 0))
        throw std::invalid_argument(("l2norm_eps: expected a finite number >= 0, got " + std::to_string(eps)).c_str());
}

// Head sizes the kernels take (exported to Python as DECODE_MAX_HEAD, CHUNK_HEAD_STEP, CHUNK_MAX_HEAD).
constexpr int kDecodeMaxHead = 1024;
constexpr int kChunkHeadStep = 32;
constexpr int kChunkMaxHead = 256;

void check_decode_heads(int64_t K, int64_t V) {
    if (K > kDecodeMaxHead || V > kDecodeMaxHead)
        throw std::invalid_argument(("q/v: decode supports head sizes K, V up to " + std::to_string(kDecodeMaxHead) +
                                     ", got K = " + std::to_string(K) +
                               ", V = " + std::to_string(V)).c_str());
}

// Decode-style gate inputs: A_log, dt_bias [HV]; a, b [rows, HV].
void gate_inputs(DecodeArgs& A, const InArray& A_log, const InArray& a, const InArray& b, const InArray& dt_bias,
                 int64_t rows) {
    A.A_log = float_input("A_log", A_log, {A.HV}, "[HV]");
    A.dt_bias = float_input("dt_bias", dt_bias, {A.HV}, "[HV]");
    A.a = float_input("a", a, {rows, A.HV}, "[T, HV]");
    A.b = float_input("b", b, {rows, A.HV}, "[T, HV]");
}

// The options every op shares: validated scalars and the thread count.
void set_options(OpOptions& A, float scale, bool use_qk_l2norm, float l2norm_eps, int num_threads) {
    check_scalars(scale, l2norm_eps);
    A.scale = scale;
    A.l2norm = use_qk_l2norm;
    A.eps = l2norm_eps;
    A.num_threads = thread_count(num_threads);
}

// The decode ops' last checks: out [T, HV, V] and the state pool each disjoint from the inputs, the options,
// then the code path (parse_isa). Nothing is written before it returns.
Isa decode_output_and_options(DecodeArgs& A, const InArray& q, const InArray& k, const InArray& v,
                              const InArray& A_log, const InArray& a, const InArray& b, const InArray& dt_bias,
                              const OutArray& out, float scale, bool use_qk_l2norm, float l2norm_eps,
                              int num_threads, const std::string& isa) {
    A.out = output(out, {A.T, A.HV, A.V}, &A.out_dt,
                   {extent("q", q), extent("k", k), extent("v", v), extent("A_log", A_log), extent("a", a),
                    extent("b", b), extent("dt_bias", dt_bias), extent(A.state, A.HV, A.K, A.V)});
    check_disjoint(extent(A.state, A.HV, A.K, A.V), {extent("q", q), extent("k", k), extent("v", v),
                   extent("A_log", A_log), extent("a", a), extent("b", b), extent("dt_bias", dt_bias)});
    set_options(A, scale, use_qk_l2norm, l2norm_eps, num_threads);
    return parse_isa(isa);
}

// Runs the code path `which` (from parse_isa, which refuses one this CPU lacks), GIL released.
template <class Args>
void run_path(Isa which, const Args& A, void (*on_amx)(const Args&), void (*on_avx512)(const Args&),
              void (*on_scalar)(const Args&)) {
    count_dispatch(which);
    nb::gil_scoped_release release;
    (which == Isa::Amx ? on_amx : which == Isa::Avx512 ? on_avx512 : on_scalar)(A);
}

void gdn_decode(const InArray& q, const InArray& k, const InArray& v, const InArray& A_log, const InArray& a,
                const InArray& b, const InArray& dt_bias, const OutArray& state, const InArray& state_indices,
                const OutArray& out, float scale, bool use_qk_l2norm, float l2norm_eps, const std::string& isa, int num_threads,
                const std::string& plan) {
    DecodeArgs A;
    A.plan = parse_plan(plan);
    token_inputs(q, k, v, &A.T, &A.H, &A.HV, &A.K, &A.V, &A.q, &A.k, &A.v);
    check_decode_heads(A.K, A.V);
    A.N = A.T;
    gate_inputs(A, A_log, a, b, dt_bias, A.N);
    A.state = state_pool(state, A.HV, A.K, A.V);
    A.indices = int32_input("state_indices", state_indices, {A.N}, "[N]");
    check_slots("state_indices", A.indices, A.N, A.state.num_slots);
    const Isa which = decode_output_and_options(A, q, k, v, A_log, a, b, dt_bias, out, scale, use_qk_l2norm,
                                                l2norm_eps, num_threads, isa);  // nothing is written before it
    for (int64_t n = 0; n < A.N; ++n)
        if (A.indices[n] < 0) zero_rows(A.out, A.out_dt, A.HV * A.V, n, n + 1);
    run_path(which, A, amx::decode, avx512::decode, scalar::decode);
}

void gdn_spec_decode(const InArray& q, const InArray& k, const InArray& v, const InArray& A_log, const InArray& a,
                     const InArray& b, const InArray& dt_bias, const OutArray& state,
                     const InArray& spec_state_indices, const InArray& num_accepted_tokens,
                     const InArray& cu_seqlens, const OutArray& out, float scale, bool use_qk_l2norm,
                     float l2norm_eps, const std::string& isa, int num_threads) {
    DecodeArgs A;
    token_inputs(q, k, v, &A.T, &A.H, &A.HV, &A.K, &A.V, &A.q, &A.k, &A.v);
    check_decode_heads(A.K, A.V);
    gate_inputs(A, A_log, a, b, dt_bias, A.T);
    A.state = state_pool(state, A.HV, A.K, A.V);
    check_ndim("spec_state_indices", spec_state_indices, 2, "[N, S]");
    A.N = int64_t(spec_state_indices.shape(0));
    A.index_cols = int64_t(spec_state_indices.shape(1));
    if (A.N == 0 || A.index_cols == 0) throw std::invalid_argument("spec_state_indices: empty [N, S]");
    A.indices = int32_input("spec_state_indices", spec_state_indices, {A.N, A.index_cols}, "[N, S]");
    check_slots("spec_state_indices", A.indices, A.N * A.index_cols, A.state.num_slots);
    A.num_accepted = int32_input("num_accepted_tokens", num_accepted_tokens, {A.N}, "[N]");
    A.cu_seqlens = int32_input("cu_seqlens", cu_seqlens, {A.N + 1}, "[N + 1]");
    check_cu_seqlens(A.cu_seqlens, A.N, A.T);
    for (int64_t n = 0; n < A.N; ++n) {
        const int64_t len = A.cu_seqlens[n + 1] - A.cu_seqlens[n], acc = A.num_accepted[n];
        if (len > A.index_cols)
            throw std::invalid_argument(("cu_seqlens: sequence " + std::to_string(n) + " has " + std::to_string(len) +
                                   " tokens but spec_state_indices has only " + std::to_string(A.index_cols) +
                                   " columns").c_str());
        if (acc < 0 || acc > A.index_cols)
            throw std::invalid_argument(("num_accepted_tokens: entry " + std::to_string(n) + " is " + std::to_string(acc) +
                                   ", expected 0.." + std::to_string(A.index_cols)).c_str());
        const int32_t* row = A.indices + n * A.index_cols;
        if (row[acc > 0 ? acc - 1 : 0] < 0) continue;  // padding sequence
        for (int64_t t = 0; t < len; ++t)
            if (row[t] < 0)
                throw std::invalid_argument(("spec_state_indices: sequence " + std::to_string(n) +
                                       " has a padding slot (-1) among the columns of its " + std::to_string(len) +
                                       " tokens").c_str());
    }
    const Isa which = decode_output_and_options(A, q, k, v, A_log, a, b, dt_bias, out, scale, use_qk_l2norm,
                                                l2norm_eps, num_threads, isa);  // nothing is written before it
    for (int64_t n = 0; n < A.N; ++n) {
        const int64_t acc = A.num_accepted[n];
        if (A.indices[n * A.index_cols + (acc > 0 ? acc - 1 : 0)] < 0)
            zero_rows(A.out, A.out_dt, A.HV * A.V, A.cu_seqlens[n], A.cu_seqlens[n + 1]);
    }
    run_path(which, A, amx::spec_decode, avx512::spec_decode, scalar::spec_decode);
}

void gdn_chunk_prefill(const InArray& q, const InArray& k, const InArray& v, const InArray& g, const InArray& beta,
                       const InArray& cu_seqlens, const OutArray& state, const InArray& state_indices,
                       const OutArray& out, float scale, bool use_qk_l2norm, float l2norm_eps, const std::string& isa,
                       int num_threads) {
    ChunkArgs A;
    token_inputs(q, k, v, &A.T, &A.H, &A.HV, &A.K, &A.V, &A.q, &A.k, &A.v);
    if (A.K % kChunkHeadStep || A.V % kChunkHeadStep || A.K > kChunkMaxHead || A.V > kChunkMaxHead)
        throw std::invalid_argument(("q/v: chunk prefill supports head sizes K, V in {" + std::to_string(kChunkHeadStep) +
                                     ", " + std::to_string(2 * kChunkHeadStep) + ", ..., " + std::to_string(kChunkMaxHead) +
                                     "}, got K = " + std::to_string(A.K) + ", V = " + std::to_string(A.V)).c_str());
    A.g = float_input("g", g, {A.T, A.HV}, "[T, HV]", false);
    A.beta = float_input("beta", beta, {A.T, A.HV}, "[T, HV]");
    A.state = state_pool(state, A.HV, A.K, A.V);
    check_ndim("state_indices", state_indices, 1, "[N]");
    A.N = int64_t(state_indices.shape(0));
    if (A.N == 0) throw std::invalid_argument("state_indices: no sequences");
    A.indices = int32_input("state_indices", state_indices, {A.N}, "[N]");
    check_slots("state_indices", A.indices, A.N, A.state.num_slots);
    A.cu_seqlens = int32_input("cu_seqlens", cu_seqlens, {A.N + 1}, "[N + 1]");
    check_cu_seqlens(A.cu_seqlens, A.N, A.T);
    A.out = output(out, {A.T, A.HV, A.V}, &A.out_dt,
                   {extent("q", q), extent("k", k), extent("v", v), extent("g", g), extent("beta", beta),
                    extent(A.state, A.HV, A.K, A.V)});
    check_disjoint(extent(A.state, A.HV, A.K, A.V),
                   {extent("q", q), extent("k", k), extent("v", v), extent("g", g), extent("beta", beta)});
    set_options(A, scale, use_qk_l2norm, l2norm_eps, num_threads);
    const Isa which = parse_isa(isa);  // the last check: nothing is written before it
    for (int64_t n = 0; n < A.N; ++n)
        if (A.indices[n] < 0) zero_rows(A.out, A.out_dt, A.HV * A.V, A.cu_seqlens[n], A.cu_seqlens[n + 1]);
    run_path(which, A, amx::chunk_prefill, avx512::chunk_prefill, scalar::chunk_prefill);
}

// g = -exp(A_log) softplus(a + dt_bias) (threshold 20), beta = sigmoid(b), both fp32 [T, HV].
void gdn_gating(const InArray& A_log, const InArray& a, const InArray& b, const InArray& dt_bias,
                const OutArray& g, const OutArray& beta) {
    check_ndim("a", a, 2, "[T, HV]");
    const int64_t T = int64_t(a.shape(0)), HV = int64_t(a.shape(1));
    if (T == 0 || HV == 0) throw std::invalid_argument(("a: empty, shape " + shape_str(shape_of(a))).c_str());
    DecodeArgs A;
    A.HV = HV;
    gate_inputs(A, A_log, a, b, dt_bias, T);
    for (auto [name, arr] : {std::pair<const char*, const OutArray*>{"g", &g}, {"beta", &beta}}) {
        float_dtype(name, *arr, false);
        check_shape(name, *arr, {T, HV}, "[T, HV]");
        check_contiguous(name, *arr);
    }
    float* gp = static_cast<float*>(g.data());
    float* bp = static_cast<float*>(beta.data());
    count_dispatch(Isa::Scalar);  // one portable build
    for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < HV; ++h) gates(A, t, h, gp + t * HV + h, bp + t * HV + h);
}

void gemm_bf16(const std::string& isa, const InArray& a, const InArray& b, const OutArray& c) {
    check_ndim("a", a, 2, "[M, Kd]");
    check_ndim("b", b, 2, "[Kd, N]");
    const int64_t M = int64_t(a.shape(0)), Kd = int64_t(a.shape(1)), N = int64_t(b.shape(1));
    if (M % 32 || N % 32 || Kd % 32 || M == 0 || N == 0 || Kd == 0 || M > 4096 || N > 4096 || Kd > 4096)
        throw std::invalid_argument("a/b: M, N, Kd must be positive multiples of 32 up to 4096");
    float_input("a", a, {M, Kd}, "[M, Kd]", false);
    float_input("b", b, {Kd, N}, "[Kd, N]", false);
    float_dtype("c", c, false);
    check_shape("c", c, {M, N}, "[M, N]");
    check_contiguous("c", c);
    const Isa which = parse_isa(isa);
    const float* ap = static_cast<const float*>(a.data());
    const float* bp = static_cast<const float*>(b.data());
    float* cp = static_cast<float*>(c.data());
    count_dispatch(which);
    nb::gil_scoped_release release;
    if (which == Isa::Amx) amx::gemm_bf16(int(M), int(N), int(Kd), ap, bp, cp);
    else if (which == Isa::Avx512) avx512::gemm_bf16(int(M), int(N), int(Kd), ap, bp, cp);
    else scalar::gemm_bf16(int(M), int(N), int(Kd), ap, bp, cp);
}

double amx_tile_peak_seconds(int64_t iters, int num_threads) {
    if (iters < 1) throw std::invalid_argument("iters: expected >= 1");
    thread_count(num_threads);
    parse_isa("amx");
    nb::gil_scoped_release release;
    return amx::tile_peak_seconds(iters, num_threads);
}

double amx_gemm_seconds(int M, int N, int Kd, int64_t iters, int num_threads) {
    if (M % 32 || N % 32 || Kd % 32 || M <= 0 || N <= 0 || Kd <= 0 || M > 4096 || N > 4096 || Kd > 4096)
        throw std::invalid_argument(("M, N, Kd: expected positive multiples of 32 up to 4096, got " + std::to_string(M) +
                                     ", " + std::to_string(N) + ", " + std::to_string(Kd)).c_str());
    if (iters < 1) throw std::invalid_argument("iters: expected >= 1");
    thread_count(num_threads);
    parse_isa("amx");
    nb::gil_scoped_release release;
    return amx::gemm_seconds(M, N, Kd, iters, num_threads);
}

void copy_bytes(const OutArray& dst, const InArray& src, int num_threads) {
    if (dst.nbytes() != src.nbytes())
        throw std::invalid_argument(("dst/src: sizes differ, " + std::to_string(dst.nbytes()) + " and " +
                               std::to_string(src.nbytes()) + " bytes").c_str());
    check_contiguous("dst", dst);
    check_contiguous("src", src);
    thread_count(num_threads);
    nb::gil_scoped_release release;
    parallel_copy(dst.data(), src.data(), int64_t(src.nbytes()), num_threads);
}

nb::dict isa_status() {
    nb::dict d;
    const std::pair<const char*, Isa> all[] = {{"amx", Isa::Amx}, {"avx512", Isa::Avx512}, {"scalar", Isa::Scalar}};
    for (const auto& [name, which] : all) {
        std::string why;
        const bool ok = isa_available(which, &why);
        d[name] = nb::make_tuple(ok, why);
    }
    return d;
}

nb::dict dispatch_counts() {
    nb::dict d;
    d["amx"] = dispatch_count(Isa::Amx);
    d["avx512"] = dispatch_count(Isa::Avx512);
    d["scalar"] = dispatch_count(Isa::Scalar);
    return d;
}

// {stage: seconds summed over threads} of the chunked prefill's stage clocks; reset: zero them after.
nb::dict chunk_stage_clocks(bool reset) {
    nb::dict d;
    for (int s = 0; s < int(ChunkClock::Count); ++s) d[kChunkClockNames[s]] = chunk_clock_total(ChunkClock(s)) * 1e-9;
    if (reset) chunk_clocks_reset();
    return d;
}

}  // namespace
void bind_ceilings(nb::module_& m);  // ceilings.cpp
}  // namespace gdn

NB_MODULE(_gdn, m) {
    using namespace gdn;
    m.doc() = "GDN CPU kernels (AMX / AVX-512 / scalar); use the wrappers in optimized.cpu.";
    m.attr("MAX_THREADS") = kMaxThreads;
    m.attr("DECODE_MAX_HEAD") = kDecodeMaxHead;
    m.attr("CHUNK_HEAD_STEP") = kChunkHeadStep;
    m.attr("CHUNK_MAX_HEAD") = kChunkMaxHead;
    m.def("isa_status", &isa_status, "{isa: (available, reason)} for 'amx', 'avx512', 'scalar'.");
    m.def("dispatch_counts", &dispatch_counts,
          "{isa: calls dispatched to that ISA build since the module loaded} (gating counts as 'scalar').");
    m.def("default_threads", &default_threads, "CPUs this process may run on.");
#ifdef GDN_STAGE_CLOCKS
    m.attr("STAGE_CLOCKS") = true;
#else
    m.attr("STAGE_CLOCKS") = false;
#endif
    m.def("chunk_stage_clocks", &chunk_stage_clocks, "reset"_a,
          "{stage: seconds summed over threads} of the chunked prefill since the last reset (a build with "
          "GDN_STAGE_CLOCKS; zero otherwise); reset: zero them after reading.");
    m.def("gdn_decode", &gdn_decode, "q"_a, "k"_a, "v"_a, "A_log"_a, "a"_a, "b"_a, "dt_bias"_a,
          "state"_a.noconvert(), "state_indices"_a, "out"_a.noconvert(), "scale"_a, "use_qk_l2norm"_a, "l2norm_eps"_a, "isa"_a,
          "num_threads"_a, "plan"_a);
    m.def("gdn_spec_decode", &gdn_spec_decode, "q"_a, "k"_a, "v"_a, "A_log"_a, "a"_a, "b"_a, "dt_bias"_a,
          "state"_a.noconvert(), "spec_state_indices"_a, "num_accepted_tokens"_a, "cu_seqlens"_a,
          "out"_a.noconvert(), "scale"_a, "use_qk_l2norm"_a, "l2norm_eps"_a, "isa"_a, "num_threads"_a);
    m.def("gdn_chunk_prefill", &gdn_chunk_prefill, "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "cu_seqlens"_a,
          "state"_a.noconvert(), "state_indices"_a, "out"_a.noconvert(), "scale"_a, "use_qk_l2norm"_a, "l2norm_eps"_a, "isa"_a,
          "num_threads"_a);
    m.def("gdn_gating", &gdn_gating, "A_log"_a, "a"_a, "b"_a, "dt_bias"_a, "g"_a.noconvert(), "beta"_a.noconvert());
    m.def("gemm_bf16", &gemm_bf16, "isa"_a, "a"_a, "b"_a, "c"_a.noconvert(),
          "c = bf16(a) @ bf16(b) with fp32 accumulation through one ISA's packing and GEMM (test hook).");
    m.def("amx_tile_peak_seconds", &amx_tile_peak_seconds, "iters"_a, "num_threads"_a,
          "Seconds for iters x 4 tdpbf16ps (16x16x32 each) per thread on register tiles.");
    m.def("amx_gemm_seconds", &amx_gemm_seconds, "M"_a, "N"_a, "Kd"_a, "iters"_a, "num_threads"_a,
          "Seconds for iters GEMMs C[M,N] = A[M,Kd] B[Kd,N] per thread through the chunk kernel's AMX GEMM, operands in cache.");
    m.def("copy_bytes", &copy_bytes, "dst"_a.noconvert(), "src"_a, "num_threads"_a,
          "memcpy on num_threads threads (bandwidth ceiling).");
    bind_ceilings(m);
}
