// The CUDA backend's FP8 kernels against the CPU backend's quantizers on identical inputs, bit for
// bit: where the two backends are meant to agree exactly (codes and block scales of every layout
// and format, per-tensor codes and their transpose, amax, the per-tensor scale, the delayed
// update, decoded operands, the bias epilogue), a difference in any element fails. Native block
// scaling's layouts (cuBLASLt's) hold the CPU backend's codes and scales, moved. The host side is
// the CPU backend's own code (src/cpu/fp8_operands.h over src/numerics/), the device side the
// kernels the CUDA module runs (src/cuda/fp8_kernels.cu, compiled into this test). Shapes include
// partial tiles and rows whose length is not a multiple of 4 (the kernels' element-by-element
// path). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/fp8_operands.h"
#include "cpu/kernels.h"
#include "cuda/fp8_kernels.h"
#include "cuda/kernels.h"
#include "kernel_test_util.h"
#include "numerics/scaling.h"

namespace {

using namespace lnmlp_kernel_test;
using lnmlp::Contract;
using lnmlp::QuantKind;
using lnmlp::Recipe;

std::vector<float> input(int64_t rows, int64_t cols, uint32_t seed) { return fp8_input(rows, cols, seed); }

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

// Per tensor, on the shapes of both kernel paths: rows whose length is not a multiple of 4 (element
// by element), partial 64 x 64 tiles, and an I/O-dtype input.
TEST(CudaFp8KernelsPerTensor, CodesAndTransposeOnEveryPath) {
  SKIP_WITHOUT_DEVICE();
  struct Shape {
    int64_t rows, cols;
    DType in;
  };
  for (const Shape sh : {Shape{70, 37, DType::F32}, Shape{200, 300, DType::F32}, Shape{5, 3, DType::F32},
                         Shape{192, 64, DType::BF16}, Shape{130, 66, DType::BF16}})
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      SCOPED_TRACE(std::to_string(sh.rows) + " x " + std::to_string(sh.cols) + " " + lnmlp::numerics::fp8_name(f) +
                   (sh.in == DType::BF16 ? " bf16" : " f32"));
      std::vector<float> x = input(sh.rows, sh.cols, 21);
      const std::vector<uint16_t> xb = to_bf16(x);
      if (sh.in == DType::BF16) x = from_bf16(xb);
      const float scale = 0.75f;
      const std::vector<uint8_t> codes = host_codes(x, scale, f);
      Device<float> dx(x), dscale(std::vector<float>{scale, 1.0f / scale});
      Device<uint16_t> dxb(xb);
      const void* in = sh.in == DType::BF16 ? static_cast<const void*>(dxb.p) : static_cast<const void*>(dx.p);
      Device<uint8_t> dcodes(codes.size()), dcodes_t(codes.size()), donly_t(codes.size()), dtrans(codes.size());
      lnmlp::cuda::fp8_quantize_per_tensor(sh.in, f, in, sh.rows, sh.cols, dscale.p, dcodes.p, dcodes_t.p, nullptr);
      lnmlp::cuda::fp8_quantize_per_tensor(sh.in, f, in, sh.rows, sh.cols, dscale.p, nullptr, donly_t.p, nullptr);
      lnmlp::cuda::fp8_transpose_codes(dcodes.p, sh.rows, sh.cols, dtrans.p, nullptr);
      CUDA_OK(cudaGetLastError());
      const std::vector<uint8_t> want_t = transposed(codes, sh.rows, sh.cols);
      EXPECT_EQ(first_difference(codes, dcodes.host()), -1) << "rowwise codes";
      EXPECT_EQ(first_difference(want_t, dcodes_t.host()), -1) << "transposed codes, in the same pass";
      EXPECT_EQ(first_difference(want_t, donly_t.host()), -1) << "transposed codes alone";
      EXPECT_EQ(first_difference(want_t, dtrans.host()), -1) << "the transpose kernel";

      Device<uint32_t> damax(1);
      lnmlp::cuda::fp8_amax(sh.in, in, sh.rows * sh.cols, damax.p, nullptr);
      EXPECT_EQ(damax.host()[0], host_amax_bits(x)) << "amax";
    }
}

// The delayed update moves the history in parallel segments of 1024 entries: lengths around the
// segment size and the API's largest, a NaN in the history, both reductions and margins.
TEST(CudaFp8KernelsPerTensor, DelayedUpdateOfLongHistoriesIsTheCpuBackends) {
  SKIP_WITHOUT_DEVICE();
  for (int32_t len : {1, 2, 1023, 1024, 1025, 3000, 65536})
    for (bool use_max : {true, false})
      for (bool nan_inside : {false, true}) {
        SCOPED_TRACE("history " + std::to_string(len) + (use_max ? " max" : " most_recent") +
                     (nan_inside ? " with a NaN" : ""));
        std::vector<float> state(static_cast<size_t>(1 + len));
        state[0] = 3.0f;
        for (int32_t i = 0; i < len; ++i)
          state[static_cast<size_t>(1 + i)] = static_cast<float>((i * 37) % 1001) * 0.125f + 0.5f;
        if (nan_inside && len > 1) state[static_cast<size_t>(len / 2 + 1)] = std::numeric_limits<float>::quiet_NaN();
        const float amax = 17.25f;
        std::vector<float> host = state;
        host[0] = lnmlp::numerics::delayed_record_and_update(host.data() + 1, len, amax, host[0], use_max, 57344.0f, 2);
        Device<float> dstate(state);
        Device<uint32_t> damax(std::vector<uint32_t>{lnmlp::numerics::float_bits(amax)});
        lnmlp::cuda::fp8_delayed_update(dstate.p, len, damax.p, use_max, 57344.0f, 2, nullptr);
        CUDA_OK(cudaGetLastError());
        EXPECT_EQ(first_difference(host, dstate.host()), -1) << "0: the scale; i > 0: history entry i - 1";
      }
}

// Native block scaling (cuBLASLt's block-scaled GEMMs): the K-major representations hold the CPU
// backend's codes and scales, moved to cuBLASLt's layouts (numerics/quantize.h): rowwise codes in
// place with their 1 x 128 scales by K-block; columnwise codes transposed with the scales of the
// 128 x 1 blocks down the columns; 128 x 128 weight tiles in both orientations from one pass.
// Run once with the launches' y dimension at the device's limit, and once capped at one block, so
// that the kernels' loops over bands and tile rows (what covers tensors of more than 65535 of them)
// write every band too.
class CudaFp8KernelsNativeBlock : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    saved_cap_ = lnmlp::cuda::grid_y_cap();
    if (GetParam() > 0) lnmlp::cuda::grid_y_cap() = GetParam();
  }
  void TearDown() override { lnmlp::cuda::grid_y_cap() = saved_cap_; }

 private:
  int64_t saved_cap_ = 0;
};

TEST_P(CudaFp8KernelsNativeBlock, LayoutsHoldTheCpuBackendsCodesAndScales) {
  SKIP_WITHOUT_DEVICE();
  using lnmlp::numerics::gemm_blk128_scale_index;
  using lnmlp::numerics::gemm_block_scale_count;
  using lnmlp::numerics::gemm_vec128_scale_index;
  const int64_t rows = 272, cols = 400;  // multiples of 16, partial 128-blocks both ways
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (bool pow2 : {false, true})
      for (DType in : {DType::F32, DType::BF16})
        for (bool weight : {false, true}) {
          SCOPED_TRACE(std::string(lnmlp::numerics::fp8_name(f)) + (pow2 ? " pow2" : " fp32 scales") +
                       (in == DType::BF16 ? " bf16" : " f32") + (weight ? " tiles" : " 1x128"));
          std::vector<float> x = input(rows, cols, 31);
          const std::vector<uint16_t> xb = to_bf16(x);
          if (in == DType::BF16) x = from_bf16(xb);
          const QuantKind row_kind{Recipe::Block, f, Contract::Cols, weight, pow2, 0.0f};
          const QuantKind col_kind{Recipe::Block, f, Contract::Rows, weight, pow2, 0.0f};
          std::vector<uint32_t> work(static_cast<size_t>(cols));
          const int64_t n = rows * cols;
          // The CPU backend's compact layouts.
          std::vector<uint8_t> rcodes(static_cast<size_t>(n)), ccodes(static_cast<size_t>(n));
          std::vector<float> rscales(static_cast<size_t>(row_kind.scale_count(rows, cols)));
          std::vector<float> cscales(static_cast<size_t>(col_kind.scale_count(rows, cols)));
          lnmlp::cpu::quantize_operand(1, row_kind, x.data(), rows, cols, 0.0f, rcodes.data(), rscales.data(),
                                       work.data());
          lnmlp::cpu::quantize_operand(1, col_kind, x.data(), rows, cols, 0.0f, ccodes.data(), cscales.data(),
                                       work.data());
          // ... and cuBLASLt's, from the device.
          Device<float> dx(x);
          Device<uint16_t> dxb(xb);
          const void* dev_in = in == DType::BF16 ? static_cast<const void*>(dxb.p) : static_cast<const void*>(dx.p);
          Device<uint8_t> dcodes(static_cast<size_t>(n)), dcodes_t(static_cast<size_t>(n));
          Device<float> dscales(static_cast<size_t>(gemm_block_scale_count(weight, rows, cols)));
          Device<float> dscales_t(static_cast<size_t>(gemm_block_scale_count(weight, cols, rows)));
          lnmlp::cuda::fp8_quantize_blocked_native(in, row_kind, dev_in, rows, cols, dcodes.p, dscales.p, dcodes_t.p,
                                                   dscales_t.p, nullptr);
          CUDA_OK(cudaGetLastError());
          const auto gcodes = dcodes.host(), gcodes_t = dcodes_t.host();
          const auto gscales = dscales.host(), gscales_t = dscales_t.host();
          EXPECT_EQ(first_difference(rcodes, gcodes), -1) << "rowwise codes";
          // Tiles: one quantization serves both orientations; 1 x 128: the columnwise blocks' codes.
          EXPECT_EQ(first_difference(transposed(weight ? rcodes : ccodes, rows, cols), gcodes_t), -1)
              << "columnwise codes, transposed";
          int64_t bad_row = -1, bad_col = -1;
          const int64_t b = lnmlp::numerics::kBlockScalingLength, nbc = lnmlp::numerics::num_blocks(cols, b);
          for (int64_t r = 0; r < rows && (bad_row < 0 || bad_col < 0); ++r)
            for (int64_t c = 0; c < cols; ++c) {
              // The CPU's scale of element (r, c), rowwise and columnwise, against cuBLASLt's slots.
              const float want_row = weight ? rscales[static_cast<size_t>((r / b) * nbc + c / b)]
                                            : rscales[static_cast<size_t>(r * nbc + c / b)];
              const float want_col = weight ? want_row : cscales[static_cast<size_t>((r / b) * cols + c)];
              const int64_t at_row = weight ? gemm_blk128_scale_index(r, c, cols) : gemm_vec128_scale_index(r, c, rows);
              const int64_t at_col = weight ? gemm_blk128_scale_index(c, r, rows) : gemm_vec128_scale_index(c, r, cols);
              if (bad_row < 0 && lnmlp::numerics::float_bits(gscales[static_cast<size_t>(at_row)]) !=
                                     lnmlp::numerics::float_bits(want_row))
                bad_row = r * cols + c;
              if (bad_col < 0 && lnmlp::numerics::float_bits(gscales_t[static_cast<size_t>(at_col)]) !=
                                     lnmlp::numerics::float_bits(want_col))
                bad_col = r * cols + c;
            }
          EXPECT_EQ(bad_row, -1) << "first element whose rowwise scale differs";
          EXPECT_EQ(bad_col, -1) << "first element whose columnwise scale differs";

          // One representation at a time writes only its own.
          Device<uint8_t> dalone(static_cast<size_t>(n));
          Device<float> dalone_s(static_cast<size_t>(gemm_block_scale_count(weight, cols, rows)));
          lnmlp::cuda::fp8_quantize_blocked_native(in, row_kind, dev_in, rows, cols, nullptr, nullptr, dalone.p,
                                                   dalone_s.p, nullptr);
          EXPECT_EQ(first_difference(gcodes_t, dalone.host()), -1) << "columnwise codes alone";
        }
}

INSTANTIATE_TEST_SUITE_P(GridY, CudaFp8KernelsNativeBlock, ::testing::Values(int64_t{0}, int64_t{1}),
                         [](const ::testing::TestParamInfo<int64_t>& i) {
                           return i.param == 0 ? std::string("device_limit") : "capped_at_" + std::to_string(i.param);
                         });

// The GEMM epilogue after a collective or an fp32 staging: rnd(acc + bias), also in place.
TEST(CudaFp8KernelsEpilogue, BiasRoundIsTheCpuBackendsAlsoInPlace) {
  SKIP_WITHOUT_DEVICE();
  for (int64_t cols : {int64_t{64}, int64_t{37}})
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(std::to_string(cols) + (with_bias ? " with bias" : " without bias"));
      const int64_t rows = 33;
      const std::vector<float> acc = normal_input(static_cast<size_t>(rows * cols), 3.0f, 5);
      const std::vector<float> bias = normal_input(static_cast<size_t>(cols), 1.0f, 6);
      const std::vector<uint16_t> bias_b = to_bf16(bias);
      std::vector<uint16_t> want_b(acc.size());
      std::vector<float> want_f(acc.size());
      lnmlp::cpu::scale_bias_rows<DType::BF16>(cols, 0, rows, acc.data(), 1.0f, with_bias ? bias_b.data() : nullptr,
                                               want_b.data());
      lnmlp::cpu::scale_bias_rows<DType::F32>(cols, 0, rows, acc.data(), 1.0f, with_bias ? bias.data() : nullptr,
                                              want_f.data());
      Device<float> dacc(acc), dbias(bias), dinplace(acc);
      Device<uint16_t> dbias_b(bias_b), dout_b(acc.size());
      lnmlp::cuda::bias_round(DType::BF16, dacc.p, rows, cols, with_bias ? dbias_b.p : nullptr, false, dout_b.p,
                              nullptr);
      lnmlp::cuda::bias_round(DType::F32, dinplace.p, rows, cols, with_bias ? dbias.p : nullptr, false, dinplace.p,
                              nullptr);
      CUDA_OK(cudaGetLastError());
      EXPECT_EQ(first_difference(want_b, dout_b.host()), -1) << "bf16";
      EXPECT_EQ(first_difference(want_f, dinplace.host()), -1) << "fp32, in place";
      if (with_bias) continue;
      // An accumulating gradient: rnd(out + acc), added into what the bf16 output holds.
      lnmlp::cpu::accumulate_rows<DType::BF16>(cols, 0, rows, acc.data(), 1.0f, want_b.data());
      lnmlp::cuda::bias_round(DType::BF16, dacc.p, rows, cols, nullptr, true, dout_b.p, nullptr);
      CUDA_OK(cudaGetLastError());
      EXPECT_EQ(first_difference(want_b, dout_b.host()), -1) << "bf16, accumulated";
    }
}

// Every NaN, of either sign, quiet or signalling, any payload, comes out of a kernel as the
// format's canonical NaN (numerics/dtype.h, fp8.h): 0x7fff in bf16 and f16, 0x7f in both FP8
// formats, as NVIDIA's conversions write them; on the host as on the device, whose arithmetic
// turns every NaN into 0x7fffffff before it is stored.
TEST(CudaFp8KernelsNan, EveryNanIsTheCanonicalCode) {
  SKIP_WITHOUT_DEVICE();
  const int64_t rows = 4, cols = 8;
  std::vector<float> x = normal_input(static_cast<size_t>(rows * cols), 2.0f, 7);
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fa01234u, 0xffffffffu};
  std::vector<bool> is_nan(x.size(), false);
  for (size_t i = 0; i < std::size(nans); ++i) {
    const size_t at = 5 * i + 1;
    std::memcpy(&x[at], &nans[i], sizeof(float));
    is_nan[at] = true;
  }
  const Device<float> dx(x);
  for (DType d : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(lnmlp::numerics::dtype_name(d));
    Device<uint16_t> out(x.size());
    lnmlp::cuda::bias_round(d, dx.p, rows, cols, nullptr, false, out.p, nullptr);
    CUDA_OK(cudaGetLastError());
    const std::vector<uint16_t> got = out.host();
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = is_nan[i]          ? uint16_t{0x7fff}
                            : d == DType::BF16 ? lnmlp::numerics::float_to_bf16(x[i])
                                               : lnmlp::numerics::float_to_f16(x[i]);
      EXPECT_EQ(got[i], want) << "element " << i;
    }
  }
  const Device<float> scale(std::vector<float>{1.0f});
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(f == Fp8Format::E4M3 ? "e4m3" : "e5m2");
    Device<uint8_t> codes(x.size()), codes_t(x.size());
    lnmlp::cuda::fp8_quantize_per_tensor(DType::F32, f, dx.p, rows, cols, scale.p, codes.p, codes_t.p, nullptr);
    CUDA_OK(cudaGetLastError());
    const std::vector<uint8_t> got = codes.host(), got_t = codes_t.host();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        const uint8_t want = is_nan[i]              ? uint8_t{0x7f}
                             : f == Fp8Format::E4M3 ? lnmlp::numerics::float_to_fp8<Fp8Format::E4M3>(x[i])
                                                    : lnmlp::numerics::float_to_fp8<Fp8Format::E5M2>(x[i]);
        EXPECT_EQ(int{got[i]}, int{want}) << "element " << i;
        EXPECT_EQ(int{got_t[static_cast<size_t>(c * rows + r)]}, int{want}) << "transposed element " << i;
      }
  }
}

}  // namespace
