// The FP8 recipe arithmetic (src/numerics/scaling.h) and the reference quantizers
// (src/numerics/quantize.h) against expectations computed here, in double, from
// docs/design.md, "FP8". Only numerics/fp8.h's float_to_fp8 / fp8_to_float (verified in test_fp8_formats.cpp)
// are reused, for the final element casts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <random>
#include <vector>

#include "numerics/quantize.h"
#include "numerics/scaling.h"

namespace {

namespace nx = lnmlp::numerics;
using nx::Fp8Format;

constexpr float kE4M3Max = 448.0f;
constexpr float kE5M2Max = 57344.0f;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- expected values, in double -----------------------------------------------------------

// (fmt_max / amax) / 2^margin as fp32 (fp32 division is correctly rounded, and so is the double
// division rounded to fp32; dividing by 2^margin is exact in double).
float expect_delayed(float fmt_max, float amax, int margin) {
  const double q = static_cast<double>(fmt_max) / amax / std::ldexp(1.0, margin);
  return q > FLT_MAX ? FLT_MAX : static_cast<float>(q);
}

// Largest power of two <= v (v > 0, finite).
double floor_pow2(double v) {
  int e;
  std::frexp(v, &e);  // v = f 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 1);
}

// Current / block scaling: fmt / max(amax, eps), FLT_MAX on overflow, optionally floor-pow2;
// 1.0 for zero or non-finite max(amax, eps).
float expect_current(float amax, float fmt_max, bool pow2, float eps) {
  const double a = std::isnan(amax) ? amax : std::max<double>(amax, eps);
  if (!(a > 0) || std::isinf(a)) return 1.0f;
  double s = static_cast<float>(fmt_max / a);
  if (std::isinf(static_cast<float>(s)) || s > FLT_MAX) s = FLT_MAX;
  if (pow2) s = floor_pow2(s);
  return static_cast<float>(s);
}

// mxfp8: the smallest integer e with fmt_max * 2^e >= amax (= ceil(log2(amax / fmt_max))),
// clamped to [-127, 127]; amax 0 -> -127. Products by 2^e are exact in double.
int expect_mx_exp(float amax, float fmt_max) {
  if (amax == 0) return -127;
  if (std::isinf(amax) || std::isnan(amax)) return 127;
  int e = -300;
  while (static_cast<double>(fmt_max) * std::ldexp(1.0, e) < amax) ++e;
  return std::clamp(e, -127, 127);
}

template <Fp8Format F> uint8_t cast(double v) { return nx::float_to_fp8<F>(static_cast<float>(v)); }

// Random matrix whose blocks have very different magnitudes (and some exact zeros and negatives).
std::vector<float> random_matrix(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-30, 30);
  std::vector<float> m(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    int scale_exp = ex(rng);
    for (int64_t c = 0; c < cols; ++c) {
      if (c % 37 == 0) scale_exp = ex(rng);
      m[r * cols + c] = std::ldexp(u(rng), scale_exp);
    }
  }
  return m;
}

// ---- delayed scaling ----------------------------------------------------------------------

TEST(DelayedScaling, UpdateWithMargin) {
  for (float fmt : {kE4M3Max, kE5M2Max}) {
    for (int margin : {0, 1, 3, 7}) {
      for (float amax : {1.0f, 2.0f, 3.7f, 448.0f, 1e-3f, 12345.678f, 1e20f}) {
        EXPECT_EQ(bits(nx::delayed_scale_update(5.0f, amax, fmt, margin)), bits(expect_delayed(fmt, amax, margin)))
            << fmt << " " << margin << " " << amax;
      }
    }
  }
  EXPECT_EQ(nx::delayed_scale_update(1.0f, 2.0f, kE4M3Max, 0), 224.0f);
  EXPECT_EQ(nx::delayed_scale_update(1.0f, 2.0f, kE4M3Max, 1), 112.0f);
  EXPECT_EQ(nx::delayed_scale_update(1.0f, 2.0f, kE4M3Max, 3), 28.0f);
}

TEST(DelayedScaling, ZeroNanInfAmaxKeepScale) {
  for (float old : {1.0f, 0.125f, 3.5f}) {
    EXPECT_EQ(nx::delayed_scale_update(old, 0.0f, kE4M3Max, 0), old);
    EXPECT_EQ(nx::delayed_scale_update(old, -0.0f, kE4M3Max, 0), old);
    EXPECT_EQ(nx::delayed_scale_update(old, kNaN, kE4M3Max, 0), old);
    EXPECT_EQ(nx::delayed_scale_update(old, kInf, kE5M2Max, 2), old);
    EXPECT_EQ(nx::delayed_scale_update(old, -kInf, kE5M2Max, 2), old);
  }
}

TEST(DelayedScaling, TinyAmaxGivesFloatMax) {
  EXPECT_EQ(nx::delayed_scale_update(1.0f, 1e-40f, kE4M3Max, 0), FLT_MAX);
  EXPECT_EQ(nx::delayed_scale_update(1.0f, std::numeric_limits<float>::denorm_min(), kE5M2Max, 0), FLT_MAX);
}

// (448 / 1e30) / 2^127 underflows fp32 to 0; the plan then stored scale 0, which its own
// lnmlp_plan_set_quantizer_state refuses (fuzz_state's crash input). The smallest normal instead,
// with a finite inverse; at the edge of the normal range the exact quotient.
TEST(DelayedScaling, HugeAmaxWithALargeMarginGivesTheSmallestNormal) {
  const float min_normal = std::numeric_limits<float>::min();
  EXPECT_EQ(nx::delayed_scale_update(1.0f, 1e30f, kE4M3Max, 127), min_normal);
  EXPECT_EQ(nx::delayed_scale_update(1.0f, FLT_MAX, kE5M2Max, 127), min_normal);
  EXPECT_EQ(nx::delayed_scale_update(1.0f, FLT_MAX, kE4M3Max, 20), min_normal);  // a subnormal before
  EXPECT_TRUE(std::isfinite(1.0f / nx::delayed_scale_update(1.0f, FLT_MAX, kE4M3Max, 127)));
  EXPECT_EQ(nx::delayed_scale_update(1.0f, 448.0f, kE4M3Max, 126), min_normal);  // exactly 2^-126
}

// A known amax sequence through a history of length 4, both algorithms, checked against a deque
// kept here (newest at the front).
TEST(DelayedScaling, HistoryMaxAndMostRecent) {
  const std::vector<float> seq = {1.0f, 5.0f, 2.0f, 0.5f, 3.0f, 0.25f, 0.1f, 0.0f, 0.0f, 7.0f};
  const int len = 4;
  for (bool use_max : {true, false}) {
    std::vector<float> hist(len, 0.0f);
    std::deque<float> ref(len, 0.0f);
    float scale = 1.0f, ref_scale = 1.0f;
    for (size_t step = 0; step < seq.size(); ++step) {
      const float amax = seq[step];
      std::vector<float> out_of_place(len);
      for (int i = 0; i < len; ++i) out_of_place[i] = nx::history_pushed_entry(hist.data(), i, amax);
      scale = nx::delayed_record_and_update(hist.data(), len, amax, scale, use_max, kE4M3Max, 1);
      ref.push_front(amax);
      ref.pop_back();
      for (int i = 0; i < len; ++i) {
        EXPECT_EQ(hist[i], ref[i]) << step << " " << i;
        EXPECT_EQ(out_of_place[i], ref[i]) << step << " " << i;
      }
      const double amax_h = use_max ? *std::max_element(ref.begin(), ref.end()) : ref.front();
      EXPECT_EQ(nx::history_reduce(hist.data(), len, use_max), static_cast<float>(amax_h));
      if (amax_h > 0) ref_scale = expect_delayed(kE4M3Max, static_cast<float>(amax_h), 1);
      EXPECT_EQ(scale, ref_scale) << "step " << step << " use_max " << use_max;
    }
  }
  // Spot values: after 1,5,2,0.5,3 the history is {3, 0.5, 2, 5}: max 5, most_recent 3.
  std::vector<float> h(len, 0.0f);
  for (int i = 0; i < 5; ++i) nx::history_push(h.data(), len, seq[i]);
  EXPECT_EQ(h, (std::vector<float>{3.0f, 0.5f, 2.0f, 5.0f}));
  EXPECT_EQ(nx::history_reduce(h.data(), len, true), 5.0f);
  EXPECT_EQ(nx::history_reduce(h.data(), len, false), 3.0f);
  // Zeros recorded after a nonzero amax: "most_recent" keeps the scale, "max" still sees it.
  std::vector<float> z = {0.0f, 0.0f, 4.0f, 0.0f};
  EXPECT_EQ(nx::delayed_scale_update(9.0f, nx::history_reduce(z.data(), len, false), kE4M3Max, 0), 9.0f);
  EXPECT_EQ(nx::delayed_scale_update(9.0f, nx::history_reduce(z.data(), len, true), kE4M3Max, 0), 112.0f);
}

TEST(DelayedScaling, HistoryLengthOne) {
  float h = 0.0f;
  float scale = 1.0f;
  for (float amax : {2.0f, 8.0f, 0.5f}) {
    const float s_max = nx::delayed_record_and_update(&h, 1, amax, scale, true, kE4M3Max, 0);
    float h2 = 123.0f;
    const float s_recent = nx::delayed_record_and_update(&h2, 1, amax, scale, false, kE4M3Max, 0);
    EXPECT_EQ(h, amax);
    EXPECT_EQ(h2, amax);
    EXPECT_EQ(s_max, s_recent);
    EXPECT_EQ(s_max, expect_delayed(kE4M3Max, amax, 0));
    scale = s_max;
  }
}

TEST(DelayedScaling, NanInHistoryFreezesScaleUntilShiftedOut) {
  const int len = 3;
  std::vector<float> hist(len, 0.0f);
  float scale = nx::delayed_record_and_update(hist.data(), len, 4.0f, 1.0f, true, kE4M3Max, 0);
  EXPECT_EQ(scale, 112.0f);
  scale = nx::delayed_record_and_update(hist.data(), len, kNaN, scale, true, kE4M3Max, 0);
  EXPECT_TRUE(std::isnan(nx::history_reduce(hist.data(), len, true)));
  EXPECT_EQ(scale, 112.0f);
  scale = nx::delayed_record_and_update(hist.data(), len, 1.0f, scale, true, kE4M3Max, 0);
  EXPECT_EQ(scale, 112.0f);  // NaN still in the history (max propagates it)
  scale = nx::delayed_record_and_update(hist.data(), len, 1.0f, scale, true, kE4M3Max, 0);
  EXPECT_EQ(scale, 112.0f);
  scale = nx::delayed_record_and_update(hist.data(), len, 2.0f, scale, true, kE4M3Max, 0);
  EXPECT_EQ(scale, 224.0f);  // NaN shifted out: max {2, 1, 1}
  // most_recent recovers on the next finite amax.
  std::vector<float> h2 = {kNaN, 0.0f, 0.0f};
  EXPECT_EQ(nx::delayed_record_and_update(h2.data(), len, 8.0f, 1.0f, false, kE4M3Max, 0), 56.0f);
}

// ---- current scaling ----------------------------------------------------------------------

TEST(CurrentScaling, PlainAndPowerOfTwo) {
  EXPECT_EQ(nx::current_scale(1.0f, kE4M3Max, false, 0.0f), 448.0f);
  EXPECT_EQ(nx::current_scale(1.0f, kE4M3Max, true, 0.0f), 256.0f);
  EXPECT_EQ(nx::current_scale(1.0f, kE5M2Max, true, 0.0f), 32768.0f);
  // amax = fmt / 2^k: the scale is exactly 2^k, kept by the rounding; just above -> 2^(k-1),
  // just below -> 2^k.
  for (float fmt : {kE4M3Max, kE5M2Max}) {
    for (int k = -100; k <= 100; k += 7) {
      const float amax = static_cast<float>(std::ldexp(static_cast<double>(fmt), -k));
      EXPECT_EQ(nx::current_scale(amax, fmt, true, 0.0f), std::ldexp(1.0f, k)) << k;
      EXPECT_EQ(nx::current_scale(amax, fmt, false, 0.0f), std::ldexp(1.0f, k)) << k;
      const float above = std::nextafter(amax, kInf), below = std::nextafter(amax, 0.0f);
      EXPECT_EQ(nx::current_scale(above, fmt, true, 0.0f), std::ldexp(1.0f, k - 1)) << k;
      EXPECT_EQ(nx::current_scale(below, fmt, true, 0.0f), std::ldexp(1.0f, k)) << k;
      EXPECT_LT(nx::current_scale(above, fmt, false, 0.0f), std::ldexp(1.0f, k));
      EXPECT_GE(nx::current_scale(below, fmt, false, 0.0f), std::ldexp(1.0f, k));
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(1.0f, 2.0f);
  std::uniform_int_distribution<int> ex(-140, 120);
  for (int i = 0; i < 20000; ++i) {
    const float amax = std::ldexp(u(rng), ex(rng));
    for (bool p2 : {false, true}) {
      for (float fmt : {kE4M3Max, kE5M2Max}) {
        ASSERT_EQ(bits(nx::current_scale(amax, fmt, p2, 0.0f)), bits(expect_current(amax, fmt, p2, 0.0f)))
            << amax << " " << p2 << " " << fmt;
      }
    }
  }
}

TEST(CurrentScaling, EpsilonFloor) {
  EXPECT_EQ(nx::current_scale(1e-6f, kE4M3Max, false, 1e-3f), expect_current(1e-3f, kE4M3Max, false, 0.0f));
  EXPECT_EQ(nx::current_scale(1e-6f, kE4M3Max, true, 1e-3f), 262144.0f);  // 448000 -> 2^18
  EXPECT_EQ(nx::current_scale(2.0f, kE4M3Max, false, 1e-3f), 224.0f);    // above the floor: unchanged
  EXPECT_EQ(nx::current_scale(0.0f, kE4M3Max, false, 1e-3f), expect_current(0.0f, kE4M3Max, false, 1e-3f));
  EXPECT_EQ(nx::current_scale(0.0f, kE4M3Max, false, 0.5f), 896.0f);     // zero amax floored to eps
}

TEST(CurrentScaling, ZeroNonFiniteAndTinyAmax) {
  for (bool p2 : {false, true}) {
    EXPECT_EQ(nx::current_scale(0.0f, kE4M3Max, p2, 0.0f), 1.0f);
    EXPECT_EQ(nx::current_scale(kInf, kE4M3Max, p2, 0.0f), 1.0f);
    EXPECT_EQ(nx::current_scale(kNaN, kE4M3Max, p2, 0.0f), 1.0f);
    EXPECT_EQ(nx::current_scale(kNaN, kE4M3Max, p2, 1e-3f), 1.0f);
    EXPECT_EQ(nx::block_scale(0.0f, kE5M2Max, p2), 1.0f);
    EXPECT_EQ(nx::block_scale(kInf, kE5M2Max, p2), 1.0f);
  }
  EXPECT_EQ(nx::current_scale(1e-40f, kE4M3Max, false, 0.0f), FLT_MAX);
  EXPECT_EQ(nx::current_scale(1e-40f, kE4M3Max, true, 0.0f), std::ldexp(1.0f, 127));
  EXPECT_EQ(nx::current_scale(FLT_MAX, kE4M3Max, false, 0.0f), expect_current(FLT_MAX, kE4M3Max, false, 0.0f));
}

// ---- mxfp8 --------------------------------------------------------------------------------

TEST(Mxfp8, ExponentAtAndAroundPowersOfTwo) {
  for (float fmt : {kE4M3Max, kE5M2Max}) {
    for (int k = -120; k <= 110; ++k) {
      const float amax = static_cast<float>(std::ldexp(static_cast<double>(fmt), k));
      if (amax == 0 || std::isinf(amax)) continue;
      EXPECT_EQ(nx::mxfp8_scale_inv_exponent(amax, fmt), std::clamp(k, -127, 127)) << fmt << " " << k;
      EXPECT_EQ(nx::mxfp8_scale_inv_exponent(std::nextafter(amax, kInf), fmt), std::clamp(k + 1, -127, 127));
      EXPECT_EQ(nx::mxfp8_scale_inv_exponent(std::nextafter(amax, 0.0f), fmt), std::clamp(k, -127, 127));
      // Powers of two of the amax itself (the mantissa of fmt_max is not 1 for E4M3/E5M2).
      const float p = std::ldexp(1.0f, k);
      EXPECT_EQ(nx::mxfp8_scale_inv_exponent(p, fmt), expect_mx_exp(p, fmt)) << k;
    }
  }
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(448.0f, kE4M3Max), 0);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(449.0f, kE4M3Max), 1);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(447.0f, kE4M3Max), 0);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(224.5f, kE4M3Max), 0);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(224.0f, kE4M3Max), -1);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(1.0f, kE4M3Max), -8);  // 2^-8 * 448 = 1.75 >= 1
}

TEST(Mxfp8, ExponentSweepTinyHugeZero) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any(0, 0x7f7fffffu);  // every finite non-negative float
  for (int i = 0; i < 100000; ++i) {
    uint32_t u = any(rng);
    float a;
    std::memcpy(&a, &u, 4);
    for (float fmt : {kE4M3Max, kE5M2Max}) ASSERT_EQ(nx::mxfp8_scale_inv_exponent(a, fmt), expect_mx_exp(a, fmt)) << a;
  }
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(0.0f, kE4M3Max), -127);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(-0.0f, kE4M3Max), -127);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(std::numeric_limits<float>::denorm_min(), kE4M3Max), -127);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(1e-38f, kE5M2Max), -127);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(FLT_MAX, kE4M3Max), expect_mx_exp(FLT_MAX, kE4M3Max));
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(FLT_MAX, kE4M3Max), 120);
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(kInf, kE4M3Max), 127);
  // Subnormal amax with a small fmt_max: normalized, exact.
  const float fmt_small = std::ldexp(1.0f, -20);
  for (float a : {std::ldexp(1.0f, -140), std::ldexp(1.5f, -135), std::numeric_limits<float>::denorm_min()})
    EXPECT_EQ(nx::mxfp8_scale_inv_exponent(a, fmt_small), expect_mx_exp(a, fmt_small)) << a;
  // Clamped at the top when fmt_max is small.
  EXPECT_EQ(nx::mxfp8_scale_inv_exponent(std::ldexp(1.0f, 120), fmt_small), 127);
  // The byte form: e + 127; NaN amax -> 0xFF, inf -> 0xFE, zero -> 0x00.
  EXPECT_EQ(nx::mxfp8_scale_e8m0(448.0f, kE4M3Max), 127);
  EXPECT_EQ(nx::mxfp8_scale_e8m0(0.0f, kE4M3Max), 0);
  EXPECT_EQ(nx::mxfp8_scale_e8m0(kInf, kE4M3Max), 0xFE);
  EXPECT_EQ(nx::mxfp8_scale_e8m0(kNaN, kE4M3Max), 0xFF);
}

TEST(Mxfp8, E8M0RoundTrip) {
  for (int b = 0; b < 255; ++b) {
    const float v = nx::e8m0_to_float(static_cast<uint8_t>(b));
    EXPECT_EQ(static_cast<double>(v), std::ldexp(1.0, b - 127)) << b;
    EXPECT_EQ(nx::e8m0_encode(b - 127), b);
    // The quantization scale is the exact reciprocal.
    EXPECT_EQ(static_cast<double>(nx::mxfp8_scale_from_exponent(b - 127)), std::ldexp(1.0, 127 - b)) << b;
  }
  EXPECT_TRUE(std::isnan(nx::e8m0_to_float(0xFF)));
  EXPECT_EQ(nx::e8m0_encode(-200), 0);
  EXPECT_EQ(nx::e8m0_encode(200), 254);
}

// ---- amax and per-tensor quantization ----------------------------------------------------

TEST(Quantize, AmaxOf) {
  const auto m = random_matrix(3, 333, 5);
  double ref = 0;
  for (float v : m) ref = std::max(ref, std::fabs(static_cast<double>(v)));
  EXPECT_EQ(nx::amax_of(m.data(), static_cast<int64_t>(m.size())), static_cast<float>(ref));
  EXPECT_EQ(nx::amax_of(m.data(), 0), 0.0f);
  std::vector<float> v = {-0.0f, 0.0f};
  EXPECT_EQ(bits(nx::amax_of(v.data(), 2)), 0u);
  v = {1.0f, -3.0f, 2.0f};
  EXPECT_EQ(nx::amax_of(v.data(), 3), 3.0f);
  v = {1.0f, -kInf, 2.0f};
  EXPECT_EQ(nx::amax_of(v.data(), 3), kInf);
  v = {1.0f, kInf, -kNaN, 2.0f};
  EXPECT_EQ(bits(nx::amax_of(v.data(), 4)), 0x7fc00000u);  // NaN propagates, canonical quiet NaN
}

template <Fp8Format F> void check_tensor(float fmt) {
  const auto x = random_matrix(1, 1000, 3);
  const int64_t n = static_cast<int64_t>(x.size());
  const float scale = nx::current_scale(nx::amax_of(x.data(), n), fmt, false, 0.0f);
  std::vector<uint8_t> q(n);
  std::vector<float> d(n);
  nx::quantize_tensor<F>(x.data(), n, scale, q.data());
  nx::dequantize_tensor<F>(q.data(), n, 1.0f / scale, d.data());
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(q[i], cast<F>(static_cast<double>(x[i]) * scale)) << i;
    ASSERT_EQ(d[i], static_cast<float>(static_cast<double>(nx::fp8_to_float<F>(q[i])) * (1.0f / scale)));
  }
}

TEST(Quantize, PerTensor) {
  check_tensor<Fp8Format::E4M3>(kE4M3Max);
  check_tensor<Fp8Format::E5M2>(kE5M2Max);
}

// ---- 1xK block scaling, brute force -----------------------------------------------------

template <Fp8Format F> void check_rows_blocked(int64_t rows, int64_t cols, int64_t K, bool p2, float eps) {
  const float fmt = F == Fp8Format::E4M3 ? kE4M3Max : kE5M2Max;
  auto x = random_matrix(rows, cols, 17);
  // Row 1: its partial last block all zero; row 2: a whole full block zero.
  const int64_t last0 = (cols / K) * K;
  for (int64_t c = last0; c < cols; ++c) x[1 * cols + c] = 0.0f;
  for (int64_t c = 0; c < K && c < cols; ++c) x[2 * cols + c] = 0.0f;
  const int64_t nb = (cols + K - 1) / K;
  std::vector<uint8_t> q(rows * cols);
  std::vector<float> sinv(rows * nb), d(rows * cols);
  nx::quantize_rows_blocked<F>(x.data(), rows, cols, K, p2, eps, q.data(), sinv.data());
  nx::dequantize_rows_blocked<F>(q.data(), rows, cols, K, sinv.data(), d.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * K, c1 = std::min(cols, c0 + K);
      double amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(static_cast<double>(x[r * cols + c])));
      const float scale = expect_current(static_cast<float>(amax), fmt, p2, eps);
      const float si = static_cast<float>(1.0 / scale);
      ASSERT_EQ(bits(sinv[r * nb + b]), bits(si)) << r << " " << b;
      for (int64_t c = c0; c < c1; ++c) {
        ASSERT_EQ(q[r * cols + c], cast<F>(static_cast<double>(x[r * cols + c]) * scale)) << r << " " << c;
        ASSERT_EQ(d[r * cols + c], static_cast<float>(static_cast<double>(nx::fp8_to_float<F>(q[r * cols + c])) * si));
      }
    }
  }
  // The zero blocks (without an epsilon floor): scale 1.
  if (eps == 0.0f) {
    if (cols % K != 0) {
      EXPECT_EQ(sinv[1 * nb + nb - 1], 1.0f);
    }
    EXPECT_EQ(sinv[2 * nb + 0], 1.0f);
  }
}

TEST(Quantize, RowsBlocked1x128PartialLastBlock) {
  for (bool p2 : {false, true}) {
    check_rows_blocked<Fp8Format::E4M3>(5, 300, 128, p2, 0.0f);
    check_rows_blocked<Fp8Format::E5M2>(5, 300, 128, p2, 0.0f);
  }
  check_rows_blocked<Fp8Format::E4M3>(4, 300, 128, false, 1e-6f);
  check_rows_blocked<Fp8Format::E4M3>(3, 128, 128, true, 0.0f);  // exact multiple
  check_rows_blocked<Fp8Format::E4M3>(3, 50, 128, true, 0.0f);   // a single partial block
  // Rows of more than the 64 blocks the quantizer takes at a time (quantize_blocks_along_rows).
  check_rows_blocked<Fp8Format::E4M3>(3, 64 * 128 + 77, 128, false, 0.0f);
  check_rows_blocked<Fp8Format::E5M2>(3, 65 * 128, 128, true, 0.0f);
}

// ---- 128x128 tiles, brute force ---------------------------------------------------------

template <Fp8Format F> void check_tiles(int64_t rows, int64_t cols, int64_t BR, int64_t BC, bool p2) {
  const float fmt = F == Fp8Format::E4M3 ? kE4M3Max : kE5M2Max;
  const auto x = random_matrix(rows, cols, 23);
  const int64_t nbr = (rows + BR - 1) / BR, nbc = (cols + BC - 1) / BC;
  std::vector<uint8_t> q(rows * cols);
  std::vector<float> sinv(nbr * nbc), d(rows * cols);
  nx::quantize_tiles<F>(x.data(), rows, cols, BR, BC, p2, 0.0f, q.data(), sinv.data());
  nx::dequantize_tiles<F>(q.data(), rows, cols, BR, BC, sinv.data(), d.data());
  for (int64_t br = 0; br < nbr; ++br) {
    for (int64_t bc = 0; bc < nbc; ++bc) {
      const int64_t r0 = br * BR, r1 = std::min(rows, r0 + BR), c0 = bc * BC, c1 = std::min(cols, c0 + BC);
      double amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(static_cast<double>(x[r * cols + c])));
      const float scale = expect_current(static_cast<float>(amax), fmt, p2, 0.0f);
      const float si = static_cast<float>(1.0 / scale);
      ASSERT_EQ(bits(sinv[br * nbc + bc]), bits(si)) << br << " " << bc;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          ASSERT_EQ(q[r * cols + c], cast<F>(static_cast<double>(x[r * cols + c]) * scale)) << r << " " << c;
          ASSERT_EQ(d[r * cols + c], static_cast<float>(static_cast<double>(nx::fp8_to_float<F>(q[r * cols + c])) * si));
        }
      }
    }
  }
}

TEST(Quantize, Tiles128x128PartialEdges) {
  for (bool p2 : {false, true}) {
    check_tiles<Fp8Format::E4M3>(200, 300, 128, 128, p2);
    check_tiles<Fp8Format::E5M2>(200, 300, 128, 128, p2);
  }
  check_tiles<Fp8Format::E4M3>(256, 128, 128, 128, true);  // exact multiples
  check_tiles<Fp8Format::E4M3>(70, 90, 128, 128, false);   // one partial tile
}

// ---- mxfp8 blocks, brute force ----------------------------------------------------------

template <Fp8Format F> void check_mxfp8(int64_t rows, int64_t cols) {
  const float fmt = F == Fp8Format::E4M3 ? kE4M3Max : kE5M2Max;
  const int64_t K = 32;
  auto x = random_matrix(rows, cols, 29);
  for (int64_t c = 0; c < K; ++c) x[c] = 0.0f;  // an all-zero block
  x[1 * cols + 40] = kNaN;                      // a NaN block (row 1, block 1)
  x[2 * cols + 5] = kInf;                       // an inf block (row 2, block 0)
  const int64_t nb = (cols + K - 1) / K;
  std::vector<uint8_t> q(rows * cols), s(rows * nb);
  std::vector<float> d(rows * cols);
  nx::quantize_mxfp8_rows<F>(x.data(), rows, cols, q.data(), s.data());
  nx::dequantize_mxfp8_rows<F>(q.data(), rows, cols, s.data(), d.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t c0 = b * K, c1 = std::min(cols, c0 + K);
      double amax = 0;
      bool nan = false;
      for (int64_t c = c0; c < c1; ++c) {
        nan |= std::isnan(x[r * cols + c]);
        amax = std::max(amax, std::fabs(static_cast<double>(x[r * cols + c])));
      }
      // A NaN block is coded with the largest exponent (its codes do not matter: it dequantizes
      // to NaN).
      const int e = nan ? 127 : expect_mx_exp(static_cast<float>(amax), fmt);
      ASSERT_EQ(s[r * nb + b], nan ? 0xFF : e + 127) << r << " " << b;
      for (int64_t c = c0; c < c1; ++c) {
        const float v = x[r * cols + c];
        if (!std::isnan(v)) {
          ASSERT_EQ(q[r * cols + c], cast<F>(std::ldexp(static_cast<double>(v), -e))) << r << " " << c;
        }
        if (nan) {
          ASSERT_TRUE(std::isnan(d[r * cols + c]));
        } else {
          const double dq = std::ldexp(static_cast<double>(nx::fp8_to_float<F>(q[r * cols + c])), e);
          ASSERT_EQ(d[r * cols + c], static_cast<float>(dq)) << r << " " << c;
        }
      }
    }
  }
  EXPECT_EQ(s[0], 0);                   // the zero block: smallest exponent
  EXPECT_EQ(s[1 * nb + 1], 0xFF);       // NaN
  EXPECT_EQ(s[2 * nb + 0], 0xFE);       // inf: 2^127
}

TEST(Quantize, Mxfp8RowsPartialLastBlock) {
  check_mxfp8<Fp8Format::E4M3>(4, 300);  // 300 = 9 * 32 + 12
  check_mxfp8<Fp8Format::E5M2>(4, 300);
  check_mxfp8<Fp8Format::E4M3>(3, 64);
  // Rows of more than the 64 blocks the quantizer takes at a time (quantize_blocks_along_rows):
  // the partial last block in the second group, and a row of exactly two groups.
  check_mxfp8<Fp8Format::E4M3>(3, 64 * 32 + 45);
  check_mxfp8<Fp8Format::E5M2>(3, 128 * 32);
}

// ---- the GEMM contract --------------------------------------------------------------------

// C = A B, A [M, K] in 1x128 blocks, B [K, N] in 128x128 tiles: block_scaled_dot against the
// double dot of the dequantized operands (equal up to fp32 summation, the scales being powers of
// two).
TEST(Quantize, BlockScaledDotMatchesDequantizedGemm) {
  const int64_t M = 3, K = 300, N = 260, Kb = 128;
  const auto a = random_matrix(M, K, 31);
  const auto b = random_matrix(K, N, 37);
  const int64_t nka = nx::num_blocks(K, Kb), nnb = nx::num_blocks(N, Kb);
  std::vector<uint8_t> qa(M * K), qb(K * N);
  std::vector<float> sa(M * nka), sb(nka * nnb), da(M * K), db(K * N);
  nx::quantize_rows_blocked<Fp8Format::E4M3>(a.data(), M, K, Kb, true, 0.0f, qa.data(), sa.data());
  nx::quantize_tiles<Fp8Format::E4M3>(b.data(), K, N, Kb, Kb, true, 0.0f, qb.data(), sb.data());
  nx::dequantize_rows_blocked<Fp8Format::E4M3>(qa.data(), M, K, Kb, sa.data(), da.data());
  nx::dequantize_tiles<Fp8Format::E4M3>(qb.data(), K, N, Kb, Kb, sb.data(), db.data());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        ref += static_cast<double>(da[m * K + k]) * db[k * N + n];
        mag += std::fabs(static_cast<double>(da[m * K + k]) * db[k * N + n]);
      }
      const float got = nx::block_scaled_dot<Fp8Format::E4M3, Fp8Format::E4M3>(
          qa.data() + m * K, sa.data() + m * nka, qb.data() + n, N, sb.data() + n / Kb, nnb, K, Kb);
      ASSERT_NEAR(got, ref, 1e-5 * mag + 1e-30) << m << " " << n;
    }
  }
}

}  // namespace
