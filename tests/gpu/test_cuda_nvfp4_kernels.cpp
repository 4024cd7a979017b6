// The CUDA backend's NVFP4 kernels (src/cuda/nvfp4_kernels.cu) against the CPU backend's NVFP4
// quantizer (src/cpu/nvfp4_operands.h) on identical inputs, bit for bit: the E2M1 codes, the scale
// region (fp32 global amax, E4M3 block scales), the decoded GEMM operands in bf16 and fp32, the
// decoding of saved codes, and the global amaxes a group max-reduces. Every layout a quantizer
// makes -- 1x16 blocks along the rows, 16x16 weight tiles, the transposed (columnwise) matrix with
// and without the random Hadamard transform -- with and without stochastic rounding (a nontrivial
// stream: seed, offset, first index and a shard's row map), from fp32 and bf16, with the tensor's
// own global amax and a given one, on inputs with zero blocks, fp32 subnormals, values across 40
// binades, and +inf or NaN. The shape has partial blocks, a partial last Hadamard block and odd
// rows and columns (a row's last high nibble). Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cpu/nvfp4_operands.h"
#include "cuda/fp8_kernels.h"
#include "cuda/nvfp4_kernels.h"
#include "kernel_test_util.h"

namespace {

using namespace lnmlp_kernel_test;
using lnmlp::Contract;
using lnmlp::QuantKind;
using lnmlp::Recipe;
using lnmlp::cpu::GemmType;
namespace numerics = lnmlp::numerics;

enum class Layout { Rowwise, Tiles, Columnwise, ColumnwiseHadamard };

struct Nvfp4Case {
  Layout layout;
  bool stochastic;
  DType in;
};

std::string name_of(const Nvfp4Case& c) {
  static const char* layouts[] = {"rowwise", "tiles", "columnwise", "columnwise_rht"};
  return std::string(layouts[static_cast<int>(c.layout)]) + (c.stochastic ? "_sr" : "_rn") +
         (c.in == DType::BF16 ? "_bf16in" : "_f32in");
}

std::vector<Nvfp4Case> nvfp4_cases() {
  std::vector<Nvfp4Case> v;
  for (Layout l : {Layout::Rowwise, Layout::Tiles, Layout::Columnwise, Layout::ColumnwiseHadamard})
    for (bool sr : {false, true})
      for (DType in : {DType::F32, DType::BF16}) v.push_back({l, sr, in});
  return v;
}

QuantKind kind_of(const Nvfp4Case& c) {
  const bool columnwise = c.layout == Layout::Columnwise || c.layout == Layout::ColumnwiseHadamard;
  const bool tiles = c.layout == Layout::Tiles;
  return {Recipe::Nvfp4,
          lnmlp::Fp8Format::E4M3,
          columnwise ? Contract::Rows : Contract::Cols,
          tiles,
          false,
          0.0f,
          tiles,
          c.layout == Layout::ColumnwiseHadamard,
          c.stochastic};
}

// fp8_input's values with its non-finite ones kept as `specials` says (0: none, 1: +-inf, 2: NaN
// too): a NaN or an inf makes the global amax NaN or inf, which the other variants keep finite.
std::vector<float> nvfp4_input(int64_t rows, int64_t cols, int specials) {
  std::vector<float> x = fp8_input(rows, cols, 29);
  for (float& v : x)
    if ((std::isnan(v) && specials < 2) || (std::isinf(v) && specials < 1)) v = 3.0f;
  return x;
}

void PrintTo(const Nvfp4Case& c, std::ostream* os) { *os << name_of(c); }

class CudaNvfp4Kernels : public ::testing::TestWithParam<Nvfp4Case> {};

TEST_P(CudaNvfp4Kernels, QuantizationAndDecodingAreTheCpuBackendsBitForBit) {
  SKIP_WITHOUT_DEVICE();
  const Nvfp4Case& c = GetParam();
  const QuantKind k = kind_of(c);
  const int64_t rows = 71, cols = 87, n = rows * cols;
  numerics::Nvfp4Rounding rounding;
  rounding.stochastic = c.stochastic;
  rounding.seed = 0x0123456789abcdefull;
  rounding.offset = 42;
  rounding.first_index = lnmlp::nvfp4_stream_first_index(3, k.contract == Contract::Rows);
  rounding.rows = numerics::Nvfp4StreamMap{32, 80, 16};  // a shard's rows among a whole tensor's

  for (int specials : {0, 1, 2})
    for (bool given : {false, true}) {
      SCOPED_TRACE("specials " + std::to_string(specials) + (given ? ", a given global amax" : ", its own amax"));
      std::vector<float> x = nvfp4_input(rows, cols, specials);
      std::vector<uint16_t> xb;
      if (c.in == DType::BF16) {
        xb = to_bf16(x);
        x = from_bf16(xb);  // the CPU quantizes the same values, widened exactly
      }
      const float given_amax = 1234.5f;
      const uint32_t given_bits = numerics::magnitude_bits(given_amax);
      std::vector<uint8_t> codes(static_cast<size_t>(k.code_bytes(rows, cols)));
      std::vector<uint8_t> region(static_cast<size_t>(k.scale_region_bytes(rows, cols)));
      std::vector<float> transposed(static_cast<size_t>(n));
      std::vector<uint16_t> op_bf16(static_cast<size_t>(n));
      std::vector<float> op_f32(static_cast<size_t>(n));
      auto cpu = [&](GemmType type, void* op) {
        lnmlp::cpu::quantize_nvfp4_operand<DType::F32>(1, k, x.data(), rows, cols, rounding,
                                                       given ? &given_amax : nullptr, codes.data(), region.data(),
                                                       transposed.data(), type, op);
      };
      cpu(GemmType::F32, op_f32.data());
      cpu(GemmType::BF16, op_bf16.data());

      Device<float> dx32(x), dt(static_cast<size_t>(n));
      Device<uint16_t> dxb(xb);
      Device<uint32_t> dgiven(std::vector<uint32_t>{given_bits});
      const void* in = c.in == DType::BF16 ? static_cast<const void*>(dxb.p) : static_cast<const void*>(dx32.p);
      for (bool f32 : {false, true}) {
        SCOPED_TRACE(f32 ? "fp32 operand" : "bf16 operand");
        Device<uint8_t> dcodes(codes.size()), dregion(region.size()), dop(static_cast<size_t>(n * (f32 ? 4 : 2)));
        lnmlp::cuda::nvfp4_quantize(c.in, k, in, rows, cols, rounding, given ? dgiven.p : nullptr, dcodes.p, dregion.p,
                                    dt.p, f32, dop.p, nullptr);
        CUDA_OK(cudaGetLastError());
        EXPECT_EQ(first_difference(codes, dcodes.host()), -1) << "first differing code byte";
        EXPECT_EQ(first_difference(region, dregion.host()), -1) << "first differing scale region byte (0-3: amax)";
        const auto op = dop.host();
        std::vector<uint8_t> want(op.size());
        std::memcpy(want.data(), f32 ? static_cast<const void*>(op_f32.data()) : op_bf16.data(), want.size());
        EXPECT_EQ(first_difference(want, op), -1) << "first differing operand byte";

        // The saved codes decoded again (backward's operand).
        std::vector<uint8_t> decoded(op.size());
        lnmlp::cpu::decode_nvfp4_operand(1, k, codes.data(), region.data(), rows, cols,
                                         f32 ? GemmType::F32 : GemmType::BF16, decoded.data());
        Device<uint8_t> ddecoded(op.size());
        lnmlp::cuda::nvfp4_decode_operand(k, dcodes.p, dregion.p, rows, cols, f32, ddecoded.p, nullptr);
        CUDA_OK(cudaGetLastError());
        EXPECT_EQ(first_difference(decoded, ddecoded.host()), -1) << "first differing decoded byte";
      }

      // The global amax a group max-reduces (Exec::nvfp4_amaxes): the matrix quantized's.
      const uint32_t want_bits = k.hadamard
                                     ? lnmlp::cpu::hadamard_columns_amax_bits<DType::F32>(1, x.data(), rows, cols)
                                     : lnmlp::cpu::parallel_amax_bits<DType::F32>(1, x.data(), n);
      Device<uint32_t> damax(1);
      lnmlp::cuda::nvfp4_amax(c.in, k, in, rows, cols, damax.p, nullptr);
      CUDA_OK(cudaGetLastError());
      EXPECT_EQ(damax.host()[0], want_bits);
    }
}

INSTANTIATE_TEST_SUITE_P(All, CudaNvfp4Kernels, ::testing::ValuesIn(nvfp4_cases()),
                         [](const ::testing::TestParamInfo<Nvfp4Case>& i) { return name_of(i.param); });

// The GEMM epilogue with NVFP4's alpha (fp8_kernels.h's bias_round, amaxes on the device): the CPU
// backend's, rnd(acc * alpha + bias) and rnd(out + acc * alpha), alpha numerics' nvfp4_gemm_alpha.
TEST(CudaNvfp4KernelsEpilogue, AlphaFromTheAmaxesScalesTheSumBeforeBiasAndAccumulation) {
  SKIP_WITHOUT_DEVICE();
  const int64_t rows = 5, cols = 13;
  const float amax_a = 3.75f, amax_b = 1000.0f;
  const float alpha = numerics::nvfp4_gemm_alpha(amax_a, amax_b);
  std::vector<float> acc = fp8_input(rows, cols, 3), bias = fp8_input(1, cols, 4), old = fp8_input(rows, cols, 5);
  for (auto* v : {&acc, &bias, &old})
    for (float& e : *v)
      if (!std::isfinite(e)) e = 1.0f;
  std::vector<float> with_bias(acc.size()), accumulated(acc.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const size_t i = static_cast<size_t>(r * cols + j);
      with_bias[i] = acc[i] * alpha + bias[static_cast<size_t>(j)];
      accumulated[i] = old[i] + acc[i] * alpha;
    }
  Device<float> dacc(acc), dbias(bias), dout(acc.size()), dold(old);
  Device<float> damax(std::vector<float>{amax_a, amax_b});
  lnmlp::cuda::bias_round(DType::F32, dacc.p, rows, cols, dbias.p, false, dout.p, nullptr, damax.p, damax.p + 1);
  lnmlp::cuda::bias_round(DType::F32, dacc.p, rows, cols, nullptr, true, dold.p, nullptr, damax.p, damax.p + 1);
  CUDA_OK(cudaGetLastError());
  EXPECT_EQ(first_difference(with_bias, dout.host()), -1);
  EXPECT_EQ(first_difference(accumulated, dold.host()), -1);
}

}  // namespace

// The block scales as cuBLASLt's FP4 GEMMs read them (nvfp4_gemm_scales), against cuBLAS's
// description of the layout written out tile by tile: the scales of the matrix quantized, padded to
// tiles of 128 rows x 4 blocks laid in row-major order, each 512 bytes holding its rows in four
// groups of 32, row i of group g at byte 16 i + 4 g, its four blocks' scales there in order; the
// padding zero. Rowwise and transposed representations, with partial tiles both ways.
TEST(CudaNvfp4KernelsGemmScales, ScalesGoWhereCublasLtReadsThemInTilesOf128RowsBy4Blocks) {
  SKIP_WITHOUT_DEVICE();
  for (Layout layout : {Layout::Rowwise, Layout::Columnwise})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{300, 200}, {16, 32}, {129, 80}}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) +
                   (layout == Layout::Rowwise ? ", rowwise" : ", transposed"));
      const QuantKind k = kind_of({layout, false, DType::F32});
      const bool t = k.nvfp4_transposed();
      const int64_t qrows = t ? cols : rows, qcols = t ? rows : cols, blocks = numerics::num_blocks(qcols, 16);
      std::vector<uint8_t> region(static_cast<size_t>(k.scale_region_bytes(rows, cols)));
      for (size_t i = 0; i < region.size(); ++i) region[i] = static_cast<uint8_t>(1 + (i * 37) % 200);
      const uint8_t* s = region.data() + QuantKind::kNvfp4AmaxBytes;

      std::vector<uint8_t> want;
      for (int64_t tr = 0; tr * 128 < qrows; ++tr)
        for (int64_t tc = 0; tc * 4 < blocks; ++tc) {
          uint8_t tile[512] = {};
          for (int64_t g = 0; g < 4; ++g)
            for (int64_t i = 0; i < 32; ++i)
              for (int64_t j = 0; j < 4; ++j) {
                const int64_t o = tr * 128 + g * 32 + i, b = tc * 4 + j;
                if (o < qrows && b < blocks) tile[i * 16 + g * 4 + j] = s[o * blocks + b];
              }
          want.insert(want.end(), tile, tile + 512);
        }
      ASSERT_EQ(static_cast<int64_t>(want.size()), numerics::nvfp4_gemm_scale_bytes(qrows, qcols));

      Device<uint8_t> dregion(region), dout(std::vector<uint8_t>(want.size(), 0xff));
      lnmlp::cuda::nvfp4_gemm_scales(k, dregion.p, rows, cols, dout.p, nullptr);
      CUDA_OK(cudaGetLastError());
      EXPECT_EQ(first_difference(want, dout.host()), -1) << "first differing byte";
    }
}
