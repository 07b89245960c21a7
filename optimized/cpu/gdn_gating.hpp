// GDN gating of one token and value head, shared by the gating op and the fused decodes.
// Internal linkage (anonymous namespace): see gdn_dtype.hpp.
#pragma once

#include <cmath>
#include <cstdint>

#include "gdn_api.hpp"

namespace gdn {
namespace {

// g = -exp(A_log) softplus(a + dt_bias) (threshold 20), beta = sigmoid(b), for token t and value
// head hv, returned in fp32. The sum and softplus are taken in double: for x = a + dt_bias far
// below zero softplus(x) ~ exp(x), whose relative error is |x| times x's, so an fp32 sum (half an
// ulp) would cost g |x| / 2 ulp (17 ulp at x = -34).
inline void gates(const DecodeArgs& A, int64_t t, int64_t hv, float* g, float* beta) {
    const double x = double(load_scalar(A.a.p, A.a.dt, t * A.HV + hv)) +
                     double(load_scalar(A.dt_bias.p, A.dt_bias.dt, hv));
    const double sp = x > 20.0 ? x : std::log1p(std::exp(x));
    *g = float(-std::exp(double(load_scalar(A.A_log.p, A.A_log.dt, hv))) * sp);
    *beta = 1.0f / (1.0f + std::exp(-load_scalar(A.b.p, A.b.dt, t * A.HV + hv)));
}

}  // namespace
}  // namespace gdn
