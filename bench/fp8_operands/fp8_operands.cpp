// The CPU backend's FP8 operand passes alone (src/cpu/fp8_operands.h): quantizing a bf16 matrix
// the shape of W1 (1024 x 4096) for each recipe and orientation, and decoding the codes into the
// bf16 GEMM operand, and the two in one pass without codes (quantize_to_operand, "straight"), in
// ns per element, best of 7 after one warm-up, at 1 and `threads` threads; then NVFP4's
// representations (src/cpu/nvfp4_operands.h), with and without the bf16 operand.
// Built by run.sh once per ISA level (LNMLP_CPU_ISA and -march), as the library builds its
// kernels; the block-level effect of these passes is bench/ab_compare.py --set fp8.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu/fp8_operands.h"
#include "cpu/nvfp4_operands.h"

namespace {

using namespace lnmlp;
using lnmlp::numerics::DType;

template <typename F> double best_ms(F&& f) {
  f();
  double best = 1e30;
  for (int i = 0; i < 7; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const char* level = argc > 1 ? argv[1] : "?";
  const int threads = argc > 2 ? std::atoi(argv[2]) : omp_get_max_threads();
  const int64_t rows = 1024, cols = 4096, n = rows * cols;
  std::vector<uint16_t> in(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (auto& v : in) v = numerics::store<DType::BF16>(normal(rng));
  std::vector<uint8_t> codes(n), e8m0(n / 32 + cols);
  std::vector<float> scales(n / 32 + cols);
  std::vector<uint16_t> out(n);
  std::vector<uint32_t> work(static_cast<size_t>(threads) * cols);
  struct Kind {
    const char* name;
    Recipe recipe;
    Contract contract;
  };
  const Kind kinds[] = {{"per tensor (current)", Recipe::Current, Contract::Cols},
                        {"block 1x128 along rows", Recipe::Block, Contract::Cols},
                        {"block 128x1 down columns", Recipe::Block, Contract::Rows},
                        {"mxfp8 1x32 along rows", Recipe::Mxfp8, Contract::Cols},
                        {"mxfp8 32x1 down columns", Recipe::Mxfp8, Contract::Rows}};
  std::printf("FP8 operand passes, bf16 [%lld, %lld] -> e4m3 codes -> bf16 operand, CPU kernels at %s; ns/element\n",
              static_cast<long long>(rows), static_cast<long long>(cols), level);
  std::printf("%-26s %10s %10s %10s %10s %10s %10s\n", "quantizer", "quant 1t", "decode 1t", "straight 1t", "quant Nt",
              "decode Nt", "straight Nt");
  for (const Kind& k : kinds) {
    const QuantKind q{k.recipe, numerics::Fp8Format::E4M3, k.contract, false, false, 0.0f};
    void* s = k.recipe == Recipe::Mxfp8 ? static_cast<void*>(e8m0.data()) : scales.data();
    double t[6];
    for (int i = 0; i < 2; ++i) {
      const int th = i == 0 ? 1 : threads;
      t[3 * i] = best_ms([&] {
        cpu::quantize_operand<DType::BF16>(th, q, in.data(), rows, cols, 1.0f, codes.data(), s, work.data());
      });
      t[3 * i + 1] =
          best_ms([&] { cpu::decode_operand(th, q, codes.data(), s, rows, cols, cpu::GemmType::BF16, out.data()); });
      t[3 * i + 2] = best_ms([&] {
        cpu::quantize_to_operand<DType::BF16>(th, q, in.data(), rows, cols, 1.0f, s, cpu::GemmType::BF16, out.data(),
                                              work.data());
      });
    }
    std::printf("%-26s", k.name);
    for (double ms : t) std::printf(" %10.3f", ms * 1e6 / n);
    std::printf("\n");
  }
  std::printf("(N = %d threads)\n", threads);

  // NVFP4 (src/cpu/nvfp4_operands.h): codes and scales alone, and with the decoded bf16 operand in
  // the same pass; the columnwise representations quantize the fp32 transpose (timed apart).
  std::printf("\nNVFP4 operand passes, bf16 [%lld, %lld] -> e2m1 codes (+ bf16 operand); ns/element\n",
              static_cast<long long>(rows), static_cast<long long>(cols));
  std::printf("%-30s %10s %12s %10s %12s\n", "representation", "codes 1t", "+operand 1t", "codes Nt", "+operand Nt");
  struct Fp4Kind {
    const char* name;
    Contract contract;
    bool tiles, hadamard, stochastic;
  };
  const Fp4Kind fp4_kinds[] = {{"1x16 along rows", Contract::Cols, false, false, false},
                               {"16x16 weight tiles", Contract::Cols, true, false, false},
                               {"transposed", Contract::Rows, false, false, false},
                               {"transposed, RHT + stochastic", Contract::Rows, false, true, true}};
  std::vector<uint8_t> region(static_cast<size_t>(n / 16 + 64));
  std::vector<float> transposed(static_cast<size_t>(n));
  for (const Fp4Kind& f : fp4_kinds) {
    const QuantKind q{Recipe::Nvfp4, numerics::Fp8Format::E4M3, f.contract, f.tiles, false, 0.0f, f.tiles, f.hadamard,
                      f.stochastic};
    numerics::Nvfp4Rounding rounding;
    rounding.stochastic = f.stochastic;
    rounding.seed = 1;
    double t[4];
    for (int i = 0; i < 2; ++i) {
      const int th = i == 0 ? 1 : threads;
      for (int with_operand = 0; with_operand < 2; ++with_operand)
        t[2 * i + with_operand] = best_ms([&] {
          cpu::quantize_nvfp4_operand<DType::BF16>(th, q, in.data(), rows, cols, rounding, nullptr, codes.data(),
                                                   region.data(), transposed.data(), cpu::GemmType::BF16,
                                                   with_operand ? out.data() : nullptr);
        });
    }
    std::printf("%-30s", f.name);
    for (double ms : t) std::printf(" %10.3f  ", ms * 1e6 / n);
    std::printf("\n");
  }
  const double transpose_ms =
      best_ms([&] { cpu::transpose_to_f32<DType::BF16>(threads, in.data(), rows, cols, transposed.data()); });
  std::printf("(of the transposed ones, the fp32 transpose: %.3f ns/element at N threads)\n", transpose_ms * 1e6 / n);
  return 0;
}
