// Helpers of the per-kernel GPU tests (test_cuda_kernels.cpp, test_cuda_fp8_kernels.cpp): whether
// a device is there (else the tests skip), device buffers, inputs, dtype conversions and bitwise
// comparison. The kernels run on the legacy default stream; a buffer's host() synchronizes.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "numerics/dtype.h"
#include "numerics/fp8.h"
#include "numerics/quantize.h"

namespace lnmlp_kernel_test {

using lnmlp::numerics::DType;
using lnmlp::numerics::Fp8Format;
using lnmlp::numerics::storage_t;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

inline bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the kernel tests need one"

template <typename T> struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) {
    cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T));
    cudaMemset(p, 0xFF, std::max<size_t>(1, n) * sizeof(T));  // NaN / 0xFF: an element a kernel forgets shows
  }
  explicit Device(const std::vector<T>& host) : Device(host.size()) {
    cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~Device() { cudaFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  std::vector<T> host() const {
    std::vector<T> h(n);
    cudaDeviceSynchronize();
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// A [rows, cols] input with the values quantizers must get right: normal values at several
// scales per block, an all-zero block, NaN and +-inf in one block each, values near the formats'
// limits, and fp32 subnormals.
inline std::vector<float> fp8_input(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[static_cast<size_t>(r * cols + c)] = n(rng) * std::ldexp(1.0f, static_cast<int>((r + c / 7) % 40) - 20);
  for (int64_t c = 0; c < std::min<int64_t>(cols, 128); ++c) x[static_cast<size_t>(c)] = 0.0f;  // a zero block
  if (rows > 2 && cols > 6) {
    x[static_cast<size_t>(2 * cols + 1)] = std::numeric_limits<float>::quiet_NaN();
    x[static_cast<size_t>(1 * cols + 3)] = std::numeric_limits<float>::infinity();
    x[static_cast<size_t>((rows - 1) * cols + cols - 1)] = -std::numeric_limits<float>::infinity();
    x[static_cast<size_t>(2 * cols + cols - 2)] = 57344.0f * 1.5f;
    x[static_cast<size_t>((rows - 2) * cols + 5)] = 1e-40f;
    x[static_cast<size_t>((rows - 3) * cols + 6)] = 448.0f;
  }
  return x;
}

// n normal values with standard deviation sd (finite: for kernels with sums and transcendentals).
inline std::vector<float> normal_input(size_t n, float sd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// x in D's storage, and back: the values a kernel of dtype D reads.
template <DType D> std::vector<storage_t<D>> to_storage(const std::vector<float>& x) {
  std::vector<storage_t<D>> s(x.size());
  for (size_t i = 0; i < x.size(); ++i) s[i] = lnmlp::numerics::store<D>(x[i]);
  return s;
}
template <DType D> std::vector<float> to_float(const std::vector<storage_t<D>>& s) {
  std::vector<float> x(s.size());
  for (size_t i = 0; i < s.size(); ++i) x[i] = lnmlp::numerics::load<D>(s[i]);
  return x;
}
inline std::vector<uint16_t> to_bf16(const std::vector<float>& x) { return to_storage<DType::BF16>(x); }
inline std::vector<float> from_bf16(const std::vector<uint16_t>& b) { return to_float<DType::BF16>(b); }

// Index of the first element whose bytes differ; -1 when none (a size mismatch is index 0).
template <typename T> int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

// The transpose of a [rows, cols] array.
template <typename T> std::vector<T> transposed(const std::vector<T>& a, int64_t rows, int64_t cols) {
  std::vector<T> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = a[static_cast<size_t>(r * cols + c)];
  return t;
}

// FP8 codes of v * scale (numerics/fp8.h's cast), and the magnitude-bits max of v.
inline std::vector<uint8_t> host_codes(const std::vector<float>& v, float scale, Fp8Format f) {
  std::vector<uint8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    q[i] = f == Fp8Format::E5M2 ? lnmlp::numerics::float_to_fp8<Fp8Format::E5M2>(v[i] * scale)
                                : lnmlp::numerics::float_to_fp8<Fp8Format::E4M3>(v[i] * scale);
  return q;
}
inline uint32_t host_amax_bits(const std::vector<float>& v) {
  return lnmlp::numerics::amax_bits_of<DType::F32>(v.data(), static_cast<int64_t>(v.size()));
}

// The largest |got - want| / max(1, |want|) over two arrays, and where.
struct Worst {
  double err = 0.0;
  int64_t at = -1;
};
inline Worst worst_relative(const std::vector<float>& got, const std::vector<float>& want) {
  Worst w;
  if (got.size() != want.size()) return {std::numeric_limits<double>::infinity(), 0};
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]) / std::max(1.0, std::fabs(double{want[i]}));
    if (!(e <= w.err)) w = {std::isnan(e) ? std::numeric_limits<double>::infinity() : e, static_cast<int64_t>(i)};
  }
  return w;
}

}  // namespace lnmlp_kernel_test
