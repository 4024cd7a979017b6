// The CUDA backend's FP8 kernels against the CPU backend's quantizers on identical inputs, bit for
// bit: where the two backends are meant to agree exactly (codes and block scales of every layout
// and format, per-tensor codes and their transpose, amax, the per-tensor scale, the delayed
// update, decoded operands), a difference in any element fails. The host side is the CPU
// backend's own code (src/cpu/fp8_operands.h over src/numerics/), the device side the kernels the
// CUDA module runs (src/cuda/fp8_kernels.cu, compiled into this test). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/fp8_operands.h"
#include "cuda/fp8_kernels.h"
#include "numerics/scaling.h"

namespace {

using lnmlp::Contract;
using lnmlp::QuantKind;
using lnmlp::Recipe;
using lnmlp::numerics::DType;
using lnmlp::numerics::Fp8Format;

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

bool have_gpu() {
  int n = 0;
  const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
  cudaGetLastError();
  return ok;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the FP8 kernel tests need one"

template <typename T> struct Device {
  T* p = nullptr;
  size_t n = 0;
  explicit Device(size_t count) : n(count) {
    cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T));
  }
  Device(const std::vector<T>& host) : Device(host.size()) {
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
std::vector<float> input(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[r * cols + c] = n(rng) * std::ldexp(1.0f, static_cast<int>((r + c / 7) % 40) - 20);
  for (int64_t c = 0; c < std::min<int64_t>(cols, 128); ++c) x[c] = 0.0f;  // a zero block (row 0)
  if (rows > 2 && cols > 3) {
    x[2 * cols + 1] = std::numeric_limits<float>::quiet_NaN();
    x[1 * cols + 3] = std::numeric_limits<float>::infinity();
    x[(rows - 1) * cols + cols - 1] = -std::numeric_limits<float>::infinity();
    x[2 * cols + cols - 2] = 57344.0f * 1.5f;
    x[(rows - 2) * cols + 5] = 1e-40f;
    x[(rows - 3) * cols + 6] = 448.0f;
  }
  return x;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = lnmlp::numerics::float_to_bf16(x[i]);
  return b;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& b) {
  std::vector<float> x(b.size());
  for (size_t i = 0; i < b.size(); ++i) x[i] = lnmlp::numerics::bf16_to_float(b[i]);
  return x;
}

template <typename T> int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return -1;
}

struct BlockedCase {
  Recipe recipe;
  Fp8Format format;
  Contract contract;
  bool weight;
  bool power_2_scale;
  DType in;
};

std::string name_of(const BlockedCase& c) {
  std::string s = c.recipe == Recipe::Mxfp8 ? "mxfp8" : "block";
  s += c.format == Fp8Format::E4M3 ? "_e4m3" : "_e5m2";
  s += c.weight && c.recipe == Recipe::Block ? "_tiles" : c.contract == Contract::Cols ? "_rowwise" : "_columnwise";
  if (c.recipe == Recipe::Block) s += c.power_2_scale ? "_pow2" : "_fp32scale";
  s += c.in == DType::BF16 ? "_bf16in" : "_f32in";
  return s;
}

std::vector<BlockedCase> blocked_cases() {
  std::vector<BlockedCase> v;
  for (Recipe r : {Recipe::Block, Recipe::Mxfp8})
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (int layout = 0; layout < 3; ++layout) {
        if (layout == 2 && r != Recipe::Block) continue;  // tiles: block scaling's weights only
        for (bool pow2 : {false, true}) {
          if (r == Recipe::Mxfp8 && !pow2) continue;  // E8M0 scales are powers of two
          for (DType in : {DType::F32, DType::BF16})
            v.push_back({r, f, layout == 1 ? Contract::Rows : Contract::Cols, layout == 2, pow2, in});
        }
      }
  return v;
}

class CudaFp8Kernels : public ::testing::TestWithParam<BlockedCase> {};

// Codes, block scales and the decoded GEMM operands (bf16 and fp32) of one layout.
TEST_P(CudaFp8Kernels, BlockedQuantizationIsTheCpuBackendsBitForBit) {
  SKIP_WITHOUT_DEVICE();
  const BlockedCase& c = GetParam();
  const int64_t rows = 200, cols = 300;  // partial blocks in both directions
  const QuantKind k{c.recipe, c.format, c.contract, c.weight, c.power_2_scale, 0.0f};
  std::vector<float> x = input(rows, cols, 11);
  std::vector<uint16_t> xb;
  if (c.in == DType::BF16) {
    xb = to_bf16(x);
    x = from_bf16(xb);  // the CPU quantizes the same values, widened exactly
  }
  const int64_t n = rows * cols, ns = k.scale_count(rows, cols);
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  std::vector<uint8_t> scales(static_cast<size_t>(ns * k.scale_bytes()));
  std::vector<uint32_t> work(static_cast<size_t>(cols));
  lnmlp::cpu::quantize_operand(1, k, x.data(), rows, cols, 0.0f, codes.data(), scales.data(), work.data());

  Device<float> dx32(x);
  Device<uint16_t> dxb(xb);
  Device<uint8_t> dcodes(codes.size()), dscales(scales.size());
  const void* in = c.in == DType::BF16 ? static_cast<const void*>(dxb.p) : static_cast<const void*>(dx32.p);
  lnmlp::cuda::fp8_quantize_blocked(c.in, k, in, rows, cols, dcodes.p, dscales.p, nullptr);
  CUDA_OK(cudaGetLastError());
  const auto gcodes = dcodes.host(), gscales = dscales.host();
  EXPECT_EQ(first_difference(codes, gcodes), -1) << "first differing code";
  EXPECT_EQ(first_difference(scales, gscales), -1) << "first differing scale byte";

  for (bool f32_out : {false, true}) {
    SCOPED_TRACE(f32_out ? "fp32 operand" : "bf16 operand");
    const auto type = f32_out ? lnmlp::cpu::GemmType::F32 : lnmlp::cpu::GemmType::BF16;
    std::vector<uint8_t> op(static_cast<size_t>(n * (f32_out ? 4 : 2)));
    lnmlp::cpu::decode_operand(1, k, codes.data(), scales.data(), rows, cols, type, op.data());
    Device<uint8_t> dop(op.size());
    lnmlp::cuda::fp8_decode_operand(k, dcodes.p, dscales.p, rows, cols, f32_out, dop.p, nullptr);
    CUDA_OK(cudaGetLastError());
    EXPECT_EQ(first_difference(op, dop.host()), -1) << "first differing operand byte";
  }
}

INSTANTIATE_TEST_SUITE_P(All, CudaFp8Kernels, ::testing::ValuesIn(blocked_cases()),
                         [](const ::testing::TestParamInfo<BlockedCase>& i) { return name_of(i.param); });

// Per tensor: amax, the scale (current scaling), the codes and their transpose.
TEST(CudaFp8KernelsPerTensor, AmaxScaleCodesAndTransposeAreTheCpuBackends) {
  SKIP_WITHOUT_DEVICE();
  const int64_t rows = 96, cols = 160;
  for (bool with_nan : {false, true})
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      SCOPED_TRACE(std::string(lnmlp::numerics::fp8_name(f)) + (with_nan ? " with NaN" : ""));
      std::vector<float> x = input(rows, cols, 5);
      if (!with_nan)
        for (float& v : x)
          if (!std::isfinite(v)) v = 3.0f;
      Device<float> dx(x);
      Device<uint32_t> damax(1);
      lnmlp::cuda::fp8_amax(DType::F32, dx.p, rows * cols, damax.p, nullptr);
      const uint32_t amax_bits = lnmlp::numerics::amax_bits_of<DType::F32>(x.data(), rows * cols);
      EXPECT_EQ(damax.host()[0], amax_bits);

      const float fmt_max = lnmlp::numerics::fp8_max(f);
      Device<float> dscale(2);
      lnmlp::cuda::fp8_per_tensor_scale(nullptr, nullptr, damax.p, fmt_max, false, 0.0f, dscale.p, nullptr, nullptr);
      const float scale = lnmlp::numerics::per_tensor_scale(
          nullptr, nullptr, lnmlp::numerics::amax_from_bits(amax_bits), fmt_max, false, 0.0f);
      const auto gscale = dscale.host();
      EXPECT_EQ(lnmlp::numerics::float_bits(gscale[0]), lnmlp::numerics::float_bits(scale));
      EXPECT_EQ(lnmlp::numerics::float_bits(gscale[1]), lnmlp::numerics::float_bits(1.0f / scale));

      const QuantKind k{Recipe::Current, f, Contract::Cols, false, false, 0.0f};
      std::vector<uint8_t> codes(static_cast<size_t>(rows * cols)), codes_t(codes.size());
      lnmlp::cpu::quantize_operand(1, k, x.data(), rows, cols, scale, codes.data(), nullptr, nullptr);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) codes_t[c * rows + r] = codes[r * cols + c];
      Device<uint8_t> dcodes(codes.size()), dcodes_t(codes.size()), dtrans(codes.size());
      lnmlp::cuda::fp8_quantize_per_tensor(DType::F32, f, dx.p, rows, cols, dscale.p, dcodes.p, dcodes_t.p, nullptr);
      lnmlp::cuda::fp8_transpose_codes(dcodes.p, rows, cols, dtrans.p, nullptr);
      CUDA_OK(cudaGetLastError());
      EXPECT_EQ(first_difference(codes, dcodes.host()), -1) << "rowwise codes";
      EXPECT_EQ(first_difference(codes_t, dcodes_t.host()), -1) << "transposed codes, written in the same pass";
      EXPECT_EQ(first_difference(codes_t, dtrans.host()), -1) << "the transpose kernel";
    }
}

// Delayed scaling's update: the history pushed, reduced (max and most recent) and the new scale,
// as the CPU backend computes them (numerics/scaling.h).
TEST(CudaFp8KernelsPerTensor, DelayedUpdateIsTheCpuBackends) {
  SKIP_WITHOUT_DEVICE();
  const int32_t len = 16;
  for (bool use_max : {true, false})
    for (float amax :
         {0.0f, 3.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e-42f}) {
      SCOPED_TRACE(std::to_string(amax) + (use_max ? " max" : " most_recent"));
      std::vector<float> state(static_cast<size_t>(1 + len));
      state[0] = 2.0f;
      for (int32_t i = 0; i < len; ++i) state[static_cast<size_t>(1 + i)] = 0.25f * static_cast<float>(i % 5);
      std::vector<float> host = state;
      host[0] = lnmlp::numerics::delayed_record_and_update(host.data() + 1, len, amax, host[0], use_max, 448.0f, 1);
      Device<float> dstate(state);
      Device<uint32_t> damax(std::vector<uint32_t>{lnmlp::numerics::float_bits(amax) & 0x7fffffffu});
      lnmlp::cuda::fp8_delayed_update(dstate.p, len, damax.p, use_max, 448.0f, 1, nullptr);
      CUDA_OK(cudaGetLastError());
      EXPECT_EQ(first_difference(host, dstate.host()), -1);
    }
}

}  // namespace
