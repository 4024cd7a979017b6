// The activation functions of the block and their derivatives: one definition shared by the CPU
// and CUDA backends. Everything computes in fp32.
#pragma once

#include <cmath>
#include <cstdint>

#include "hd.h"

namespace lnmlp::numerics {

// Values match the public LNMLP_ACT_* constants.
enum class Act : int32_t {
  Linear = 0,
  Relu = 1,
  Gelu = 2,
  Silu = 3,
  QuickGelu = 4,
  SquaredRelu = 5,
  Sigmoid = 6,
  ClampedSilu = 7,
  ClampedLinear = 8,
};
constexpr int32_t kNumActs = 9;

constexpr const char* act_name(Act a) {
  switch (a) {
    case Act::Linear: return "linear";
    case Act::Relu: return "relu";
    case Act::Gelu: return "gelu";
    case Act::Silu: return "silu";
    case Act::QuickGelu: return "quick_gelu";
    case Act::SquaredRelu: return "squared_relu";
    case Act::Sigmoid: return "sigmoid";
    case Act::ClampedSilu: return "clamped_silu";
    case Act::ClampedLinear: return "clamped_linear";
  }
  return "unknown";
}

// Parameters of the clamped SwiGLU pair (only those two activations read them).
struct ActParams {
  float limit = 7.0f;
  float alpha = 1.702f;
  float offset = 1.0f;
};

constexpr float kGeluTanhK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluTanhC = 0.044715f;
constexpr float kQuickGeluAlpha = 1.702f;

LNMLP_HD float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// f(x)
template <Act K> LNMLP_HD float act_value(float x, const ActParams& p) {
  (void)p;
  if constexpr (K == Act::Linear) {
    return x;
  } else if constexpr (K == Act::Relu) {
    return x > 0.0f ? x : 0.0f;
  } else if constexpr (K == Act::Gelu) {
    return 0.5f * x * (1.0f + tanhf(kGeluTanhK * (x + kGeluTanhC * x * x * x)));
  } else if constexpr (K == Act::Silu) {
    return x * sigmoid(x);
  } else if constexpr (K == Act::QuickGelu) {
    return x * sigmoid(kQuickGeluAlpha * x);
  } else if constexpr (K == Act::SquaredRelu) {
    return x > 0.0f ? x * x : 0.0f;
  } else if constexpr (K == Act::Sigmoid) {
    return sigmoid(x);
  } else if constexpr (K == Act::ClampedSilu) {
    const float a = fminf(x, p.limit);
    return a * sigmoid(p.alpha * a);
  } else {  // ClampedLinear
    return fminf(fmaxf(x, -p.limit), p.limit) + p.offset;
  }
}

// f'(x)
template <Act K> LNMLP_HD float act_grad(float x, const ActParams& p) {
  (void)p;
  if constexpr (K == Act::Linear) {
    return 1.0f;
  } else if constexpr (K == Act::Relu) {
    return x > 0.0f ? 1.0f : 0.0f;
  } else if constexpr (K == Act::Gelu) {
    const float t = tanhf(kGeluTanhK * (x + kGeluTanhC * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluTanhK * (1.0f + 3.0f * kGeluTanhC * x * x);
  } else if constexpr (K == Act::Silu) {
    const float s = sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
  } else if constexpr (K == Act::QuickGelu) {
    const float s = sigmoid(kQuickGeluAlpha * x);
    return s * (1.0f + kQuickGeluAlpha * x * (1.0f - s));
  } else if constexpr (K == Act::SquaredRelu) {
    return x > 0.0f ? 2.0f * x : 0.0f;
  } else if constexpr (K == Act::Sigmoid) {
    const float s = sigmoid(x);
    return s * (1.0f - s);
  } else if constexpr (K == Act::ClampedSilu) {
    if (x > p.limit) return 0.0f;
    const float s = sigmoid(p.alpha * x);
    return s * (1.0f + p.alpha * x * (1.0f - s));
  } else {  // ClampedLinear
    return (x > p.limit || x < -p.limit) ? 0.0f : 1.0f;
  }
}

template <Act K> struct ActTag {
  static constexpr Act value = K;
};

// Calls fn(ActTag<K>{}) for the runtime value `a`: the one switch over the activations, on the
// host (loops compiled once per activation instead of switching per element) and on the device.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename Fn> LNMLP_HD decltype(auto) dispatch_act(Act a, Fn&& fn) {
  switch (a) {
    case Act::Relu: return fn(ActTag<Act::Relu>{});
    case Act::Gelu: return fn(ActTag<Act::Gelu>{});
    case Act::Silu: return fn(ActTag<Act::Silu>{});
    case Act::QuickGelu: return fn(ActTag<Act::QuickGelu>{});
    case Act::SquaredRelu: return fn(ActTag<Act::SquaredRelu>{});
    case Act::Sigmoid: return fn(ActTag<Act::Sigmoid>{});
    case Act::ClampedSilu: return fn(ActTag<Act::ClampedSilu>{});
    case Act::ClampedLinear: return fn(ActTag<Act::ClampedLinear>{});
    case Act::Linear: break;
  }
  return fn(ActTag<Act::Linear>{});
}

// An activation fixed at compile time (the CPU's hot loops), or chosen at run time (the CUDA
// kernels, where the choice is uniform over the grid, and rare gated pairs on the CPU). Both have
// value(x) = f(x) and grad(x) = f'(x).
template <Act K> struct FixedAct {
  ActParams p;
  LNMLP_HD float value(float x) const { return act_value<K>(x, p); }
  LNMLP_HD float grad(float x) const { return act_grad<K>(x, p); }
};
struct RuntimeAct {
  Act a;
  ActParams p;
  LNMLP_HD float value(float x) const {
    return dispatch_act(a, [&](auto tag) { return act_value<decltype(tag)::value>(x, p); });
  }
  LNMLP_HD float grad(float x) const {
    return dispatch_act(a, [&](auto tag) { return act_grad<decltype(tag)::value>(x, p); });
  }
};

// The gated pair a = f0(v0) * f1(v1), with v0 = h[:, 0, :] and v1 = h[:, 1, :], and its
// gradients for an upstream gradient g by the product rule, multiplied in this order on every
// backend: d0 = g * f0'(v0) * f1(v1), d1 = g * f0(v0) * f1'(v1).
template <typename F0, typename F1> LNMLP_HD float gated_value(const F0& f0, const F1& f1, float v0, float v1) {
  return f0.value(v0) * f1.value(v1);
}
struct GatedGrad {
  float d0, d1;
};
template <typename F0, typename F1>
LNMLP_HD GatedGrad gated_grad(const F0& f0, const F1& f1, float g, float v0, float v1) {
  return {g * f0.grad(v0) * f1.value(v1), g * f0.value(v0) * f1.grad(v1)};
}

}  // namespace lnmlp::numerics
