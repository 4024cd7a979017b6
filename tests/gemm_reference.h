// The CPU GEMM layer's tests (test_gemm_sliced.cpp, test_gemm_packed.cpp): random operands of a
// GemmShape, the GEMM under test run on them, and its error against the float64 product of the
// same inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "cpu/gemm.h"
#include "numerics/dtype.h"

namespace gemm_reference {

using lnmlp::cpu::GemmShape;
using lnmlp::cpu::GemmType;

// Values of the input type, kept also as the floats they are (bf16-rounded for bf16).
struct Values {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  const void* data(GemmType t) const {
    return t == GemmType::BF16 ? static_cast<const void*>(bf16.data()) : f32.data();
  }
};

inline Values random_values(int64_t count, GemmType type, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Values v;
  for (int64_t i = 0; i < count; ++i) {
    float x = dist(rng);
    if (type == GemmType::BF16) {
      v.bf16.push_back(lnmlp::numerics::float_to_bf16(x));
      x = lnmlp::numerics::bf16_to_float(v.bf16.back());
    }
    v.f32.push_back(x);
  }
  return v;
}

// 64-byte aligned bytes (the GEMM layer's scratch and packed operands).
struct AlignedBytes {
  explicit AlignedBytes(int64_t n) : raw(static_cast<size_t>(n) + 64) {}
  void* get() { return raw.data() + (64 - reinterpret_cast<uintptr_t>(raw.data()) % 64) % 64; }
  std::vector<unsigned char> raw;
};

// Runs the GEMM of shape s on random operands (seeded) through run(a, b, bias, c), B stored as
// s.trans_b says, and returns max |C - float64 reference| / max |reference|.
template <typename Run> double gemm_error(const GemmShape& s, unsigned seed, Run&& run) {
  std::mt19937 rng(seed);
  const Values a = random_values(s.m * s.k, s.input, rng), b = random_values(s.k * s.n, s.input, rng);
  const Values bias = random_values(s.n, s.input, rng), c0 = random_values(s.m * s.n, s.output, rng);
  std::vector<float> c32 = c0.f32;
  std::vector<uint16_t> c16 = c0.bf16;
  void* out = s.output == GemmType::F32 ? static_cast<void*>(c32.data()) : static_cast<void*>(c16.data());
  run(a.data(s.input), b.data(s.input), s.bias ? bias.data(s.input) : nullptr, out);

  double worst = 0.0, largest = 0.0;
  std::vector<double> ref(static_cast<size_t>(s.m * s.n));
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      double r = (s.bias ? bias.f32[j] : 0.0) + (s.accumulate ? c0.f32[i * s.n + j] : 0.0);
      for (int64_t p = 0; p < s.k; ++p)
        r += double(s.trans_a ? a.f32[p * s.m + i] : a.f32[i * s.k + p]) *
             double(s.trans_b ? b.f32[j * s.k + p] : b.f32[p * s.n + j]);
      ref[i * s.n + j] = r;
      largest = std::max(largest, std::abs(r));
    }
  for (int64_t i = 0; i < s.m * s.n; ++i) {
    const double got = s.output == GemmType::F32 ? c32[i] : lnmlp::numerics::bf16_to_float(c16[i]);
    worst = std::max(worst, std::abs(got - ref[i]));
  }
  return worst / largest;
}

// fp32 accumulation over k terms of unit-variance products: relative error ~ k * 2^-24 of the
// largest entry; a bf16 output adds one rounding (2^-9 relative). Normalised by the largest
// |reference| so that near-zero entries do not dominate.
inline double tolerance(GemmType output) { return output == GemmType::BF16 ? 1.0 / 256 : 1e-5; }

}  // namespace gemm_reference
