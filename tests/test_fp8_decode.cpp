// The CPU kernels' FP8 decoding (src/cpu/fp8_operands.h: a GEMM operand from codes and block
// scales, by table lookup at the AVX-512 level, by arithmetic below it) at every ISA level this
// build compiles and this CPU runs, against values computed here in double: each code's value from
// its sign, exponent and mantissa bits, times its block's scale_inv (from the layout's own index
// formula), rounded to fp32 as the product of two floats is, then to bf16 by the reference's
// round-to-nearest-even. Every one of the 256 codes of both formats, every scale layout, row
// lengths on both sides of the kernels' 32-code lookups and 256-code spans, 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp8_decode/decode_at_level.h"
#include "reference/dtype_convert.h"

namespace {

using lnmlp::Contract;
using lnmlp::QuantKind;
using lnmlp::Recipe;
using lnmlp::numerics::Fp8Format;
using lnmlp::test::DecodeFn;
using lnmlp::test::QuantizeToOperandFn;

struct Level {
  const char* name;
  DecodeFn decode;
  QuantizeToOperandFn quantize;
  bool runs;  // this CPU has the level
};

std::vector<Level> levels() {
  __builtin_cpu_init();
  // The features src/cpu/isa_dispatch.cpp pins each level on.
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  std::vector<Level> l;
#if defined(LNMLP_TEST_LEVEL_x86_64)
  l.push_back({"x86-64", lnmlp::test::decode_operand_x86_64, lnmlp::test::quantize_to_operand_x86_64, true});
#endif
#if defined(LNMLP_TEST_LEVEL_x86_64_v3)
  l.push_back({"x86-64-v3", lnmlp::test::decode_operand_x86_64_v3, lnmlp::test::quantize_to_operand_x86_64_v3, v3});
#endif
#if defined(LNMLP_TEST_LEVEL_x86_64_v4)
  l.push_back({"x86-64-v4", lnmlp::test::decode_operand_x86_64_v4, lnmlp::test::quantize_to_operand_x86_64_v4, v4});
#endif
#if defined(LNMLP_TEST_LEVEL_native)
  l.push_back({"native", lnmlp::test::decode_operand_native, lnmlp::test::quantize_to_operand_native, true});
#endif
#if defined(LNMLP_TEST_LEVEL_portable)
  l.push_back({"portable", lnmlp::test::decode_operand_portable, lnmlp::test::quantize_to_operand_portable, true});
#endif
  (void)v4;
  return l;
}

// A code's value from its fields (E4M3: no infinities, S.1111.111 NaN; E5M2: IEEE-like).
double code_value(Fp8Format f, uint8_t code) {
  const double sign = code & 0x80 ? -1.0 : 1.0;
  const int mbits = f == Fp8Format::E4M3 ? 3 : 2, bias = f == Fp8Format::E4M3 ? 7 : 15;
  const int e = (code & 0x7f) >> mbits, m = code & ((1 << mbits) - 1), emax = (1 << (7 - mbits)) - 1;
  if (f == Fp8Format::E4M3 && e == emax && m == (1 << mbits) - 1) return NAN;
  if (f == Fp8Format::E5M2 && e == emax) return m == 0 ? sign * INFINITY : NAN;
  if (e == 0) return sign * std::ldexp(m, 1 - bias - mbits);
  return sign * std::ldexp(1.0 + std::ldexp(m, -mbits), e - bias);
}

struct Case {
  const char* name;
  Recipe recipe;
  Contract contract;
  bool weight;
};

// Every recipe's quantizer kinds: per tensor, and each blocked layout.
const Case kCases[] = {
    {"per tensor", Recipe::Current, Contract::Cols, false}, {"block 1x128", Recipe::Block, Contract::Cols, false},
    {"block 128x1", Recipe::Block, Contract::Rows, false},  {"block 128x128", Recipe::Block, Contract::Cols, true},
    {"mxfp8 1x32", Recipe::Mxfp8, Contract::Cols, false},   {"mxfp8 32x1", Recipe::Mxfp8, Contract::Rows, false},
};

// Runs body(level, format, kind) for every level this CPU runs, both formats and every kind;
// returns the number of levels run.
template <typename Body> int for_each_level_format_kind(Body&& body) {
  int ran = 0;
  for (const Level& level : levels()) {
    if (!level.runs) continue;
    ++ran;
    for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
      for (const Case& c : kCases) body(level, f, c);
  }
  return ran;
}

// The scale_inv of element (r, c), from the layouts' definitions (numerics/quantize.h).
double scale_of(const Case& k, const std::vector<float>& sf, const std::vector<uint8_t>& s8, int64_t r, int64_t c,
                int64_t cols) {
  if (k.recipe == Recipe::Current) return 1.0;
  const int64_t b = k.recipe == Recipe::Mxfp8 ? 32 : 128;
  int64_t i;
  if (k.recipe == Recipe::Block && k.weight) i = (r / b) * ((cols + b - 1) / b) + c / b;  // 128x128 tiles
  else if (k.contract == Contract::Cols) i = r * ((cols + b - 1) / b) + c / b;            // 1 x b along rows
  else i = (r / b) * cols + c;                                                            // b x 1 down columns
  if (k.recipe == Recipe::Mxfp8) return s8[i] == 0xFF ? NAN : std::ldexp(1.0, s8[i] - 127);
  return sf[i];
}

TEST(Fp8Decode, EveryCodeEveryLayoutAtEveryLevel) {
  const int64_t shapes[][2] = {{3, 1}, {2, 31}, {5, 33}, {3, 255}, {2, 256}, {4, 257}, {130, 300}, {33, 600}};
  const int ran = for_each_level_format_kind([&](const Level& level, Fp8Format f, const Case& c) {
    for (const auto& shape : shapes)
      for (bool bf16 : {true, false})
        for (int threads : {1, 2}) {
          const int64_t rows = shape[0], cols = shape[1], n = rows * cols;
          const QuantKind k{c.recipe, f, c.contract, c.weight, false, 0.0f};
          std::mt19937 rng(static_cast<uint32_t>(n * 7 + cols));
          std::vector<uint8_t> codes(n);
          for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>(i < 256 ? i : rng() & 0xff);
          const int64_t ns = k.scale_count(rows, cols) + 1;
          std::vector<float> sf(ns);
          std::vector<uint8_t> s8(ns);
          std::uniform_real_distribution<float> log2s(-20.0f, 20.0f);
          for (int64_t i = 0; i < ns; ++i) {
            sf[i] = std::exp2(log2s(rng));
            s8[i] = static_cast<uint8_t>(i % 7 == 0 ? (i % 14 == 0 ? 0xFF : 0) : rng() & 0xff);  // NaN, 2^-127
          }
          const void* scales = c.recipe == Recipe::Mxfp8 ? static_cast<const void*>(s8.data()) : sf.data();
          std::vector<uint16_t> out16(n, 0x1234);
          std::vector<float> out32(n, 1234.5f);
          level.decode(threads, k, codes.data(), scales, rows, cols, bf16,
                       bf16 ? static_cast<void*>(out16.data()) : out32.data());
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t col = 0; col < cols; ++col) {
              const int64_t i = r * cols + col;
              // The fp32 product of the code's value and the scale_inv (exact in double, then
              // rounded once to fp32), in bf16 for bf16 operands.
              const float want = static_cast<float>(code_value(f, codes[i]) * scale_of(c, sf, s8, r, col, cols));
              const std::string where = std::string(level.name) + " " + lnmlp::numerics::fp8_name(f) + " " + c.name +
                                        " " + (bf16 ? "bf16" : "fp32") + " " + std::to_string(rows) + "x" +
                                        std::to_string(cols) + " threads " + std::to_string(threads) + " at (" +
                                        std::to_string(r) + ", " + std::to_string(col) + ") code " +
                                        std::to_string(codes[i]);
              if (bf16) {
                const uint16_t got = out16[i];
                if (std::isnan(want)) {
                  ASSERT_TRUE((got & 0x7fff) > 0x7f80) << where;
                } else {
                  ASSERT_EQ(got, lnmlp_ref::bf16_from_double(want)) << where;
                }
              } else {
                const float got = out32[i];
                if (std::isnan(want)) {
                  ASSERT_TRUE(std::isnan(got)) << where;
                } else {
                  uint32_t gb, wb;
                  std::memcpy(&gb, &got, 4);
                  std::memcpy(&wb, &want, 4);
                  ASSERT_EQ(gb, wb) << where << ": " << got << " vs " << want;
                }
              }
            }
        }
  });
  EXPECT_GT(ran, 0);
}

// quantize_to_operand (the operand straight from x, no codes) against quantize_operand then
// decode_operand at the same level, bit for bit (a NaN for a NaN): every recipe and orientation,
// fp32 and bf16 inputs and operands, e4m3 and e5m2, 1 and 2 threads, shapes with partial blocks on
// both sides, over values spread across 2^-40 .. 2^40 with whole blocks of zeros, a NaN, an
// infinity, fp32 subnormals and values beyond the format (a per-tensor scale of 2^20 saturates).
TEST(Fp8Decode, QuantizeToOperandIsQuantizeThenDecodeAtEveryLevel) {
  const int64_t shapes[][2] = {{1, 1}, {3, 31}, {5, 33}, {2, 257}, {130, 300}, {33, 2100}};
  const int ran = for_each_level_format_kind([&](const Level& level, Fp8Format f, const Case& c) {
    for (const auto& shape : shapes)
      for (bool in_bf16 : {false, true})
        for (bool bf16 : {true, false})
          for (int threads : {1, 2}) {
            const int64_t rows = shape[0], cols = shape[1], n = rows * cols;
            const QuantKind k{c.recipe, f, c.contract, c.weight, false, 0.0f};
            std::mt19937 rng(static_cast<uint32_t>(n * 3 + cols + in_bf16));
            std::normal_distribution<float> normal;
            std::uniform_int_distribution<int> octave(-40, 40);
            std::vector<float> x(n);
            for (int64_t i = 0; i < n; ++i) {
              const int64_t block = i / 32;  // runs of 32 along a row: a block of mxfp8 1x32
              x[i] = std::ldexp(normal(rng), block % 5 == 0 ? octave(rng) : static_cast<int>(block % 9) - 4);
              if (block % 11 == 3) x[i] = 0.0f;
            }
            const float specials[] = {NAN, INFINITY, -INFINITY, 1e-40f, -3e-39f, 1e30f, -0.0f};
            for (int64_t j = 0; j < 7 && j * 97 + 5 < n; ++j) x[j * 97 + 5] = specials[j];
            std::vector<uint16_t> x16(n);
            for (int64_t i = 0; i < n; ++i) {
              x16[i] = lnmlp_ref::bf16_from_double(x[i]);
              if (in_bf16) x[i] = static_cast<float>(lnmlp_ref::bf16_to_double(x16[i]));
            }
            const void* in = in_bf16 ? static_cast<const void*>(x16.data()) : x.data();
            const float scale = n % 2 ? 0x1p20f : 3.75f;
            const int64_t ns = k.scale_count(rows, cols) + 1, bytes = bf16 ? 2 : 4;
            std::vector<uint32_t> work(2 * cols);
            std::vector<uint8_t> codes(n), want(n * bytes, 0x5a), got(n * bytes, 0xa5);
            std::vector<uint32_t> want_scales(ns, 7), got_scales(ns, 7);  // as floats or E8M0 bytes
            level.quantize(threads, k, in, in_bf16, rows, cols, scale, codes.data(), want_scales.data(), bf16,
                           want.data(), work.data());
            level.quantize(threads, k, in, in_bf16, rows, cols, scale, nullptr, got_scales.data(), bf16, got.data(),
                           work.data());
            const std::string where = std::string(level.name) + " " + lnmlp::numerics::fp8_name(f) + " " + c.name +
                                      (in_bf16 ? " from bf16 " : " from fp32 ") + (bf16 ? "to bf16 " : "to fp32 ") +
                                      std::to_string(rows) + "x" + std::to_string(cols) + " threads " +
                                      std::to_string(threads);
            ASSERT_EQ(got_scales, want_scales) << where;
            for (int64_t i = 0; i < n; ++i) {
              double w, g;
              if (bf16) {
                uint16_t wb, gb;
                std::memcpy(&wb, &want[i * 2], 2);
                std::memcpy(&gb, &got[i * 2], 2);
                w = static_cast<float>(lnmlp_ref::bf16_to_double(wb));
                g = static_cast<float>(lnmlp_ref::bf16_to_double(gb));
              } else {
                float wf, gf;
                std::memcpy(&wf, &want[i * 4], 4);
                std::memcpy(&gf, &got[i * 4], 4);
                w = wf;
                g = gf;
              }
              if (std::isnan(w)) {
                ASSERT_TRUE(std::isnan(g)) << where << " at " << i;
              } else {
                ASSERT_EQ(0, std::memcmp(&want[i * bytes], &got[i * bytes], bytes))
                    << where << " at " << i << " (x " << x[i] << "): " << g << " vs " << w;
              }
            }
          }
  });
  EXPECT_GT(ran, 0);
}

}  // namespace
