// LayerNorm / RMSNorm formulas shared by the CPU and CUDA backends. Backends own the reductions
// (how row sums are formed); the arithmetic on top of them lives here once. All fp32.
//
//   layernorm: mu = mean(x), var = mean((x-mu)^2), rs = 1/sqrt(var+eps), xhat = (x-mu)*rs
//   rmsnorm:   mu = 0,       ms  = mean(x^2),      rs = 1/sqrt(ms+eps),  xhat = x*rs
//   n = xhat * g + beta,  g = gamma (+1 when zero-centered)
//
// Backward, with dxhat = dn*g and the row means m1 = mean(dxhat), m2 = mean(dxhat*xhat):
//   layernorm: dx = rs * (dxhat - m1 - xhat*m2)
//   rmsnorm:   dx = rs * (dxhat - xhat*m2)
//   dgamma = sum_t dn*xhat, dbeta = sum_t dn
#pragma once

#include <cmath>
#include <cstdint>

#include "hd.h"

namespace lnmlp::numerics {

// Values match the public LNMLP_NORM_* constants.
enum class Norm : int32_t { LayerNorm = 0, RmsNorm = 1 };

constexpr const char* norm_name(Norm n) { return n == Norm::LayerNorm ? "layernorm" : "rmsnorm"; }

// 1/sqrt(var + eps), where var is the variance (layernorm) or the mean square (rmsnorm).
LNMLP_HD float norm_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }

// The scale applied to xhat.
LNMLP_HD float norm_gain(float gamma, bool zero_centered) { return zero_centered ? gamma + 1.0f : gamma; }

LNMLP_HD float norm_xhat(float x, float mu, float rs) { return (x - mu) * rs; }

LNMLP_HD float norm_out(float xhat, float gain, float beta) { return xhat * gain + beta; }

// A row's statistics from its sums (the backends own how the sums are formed): the mean of
// `hidden` values from their sum (layernorm; rmsnorm's mean is 0), and rs from the sum of the
// squared deviations from that mean (the squares themselves for rmsnorm).
LNMLP_HD float norm_row_mean(float sum, int64_t hidden) { return sum / static_cast<float>(hidden); }
LNMLP_HD float norm_row_rstd(float sum_sq, int64_t hidden, float eps) {
  return norm_rstd(sum_sq / static_cast<float>(hidden), eps);
}

// dx from dxhat, xhat and the row means m1 = mean(dxhat) (use 0 for rmsnorm), m2 = mean(dxhat*xhat).
LNMLP_HD float norm_dx(float dxhat, float xhat, float rs, float m1, float m2) {
  return rs * (dxhat - m1 - xhat * m2);
}

// Backward's row means from the row sums s1 = sum(dxhat) and s2 = sum(dxhat * xhat).
struct NormBackwardMeans {
  float m1, m2;
};
LNMLP_HD NormBackwardMeans norm_backward_means(float s1, float s2, int64_t hidden, bool layernorm) {
  const float inv_h = 1.0f / static_cast<float>(hidden);
  return {layernorm ? s1 * inv_h : 0.0f, s2 * inv_h};
}

}  // namespace lnmlp::numerics
