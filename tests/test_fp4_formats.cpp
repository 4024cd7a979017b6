// FP4 E2M1 (src/numerics/fp4.h) and the NVFP4 quantizer (src/numerics/quantize_nvfp4.h) against
// references written here from the definitions: E2M1's eight magnitudes listed by hand, encoding
// by scanning them for the nearest (ties to the even code), NaN -> +6, saturation at 6; the NVFP4
// scales computed in double from TransformerEngine's formulas and rounded to fp32 where its kernels
// round. ml_dtypes is the second, independent oracle (bindings/python/tests/test_nvfp4.py).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "float_bits.h"
#include "numerics/fp4.h"
#include "numerics/philox.h"
#include "numerics/quantize_nvfp4.h"

namespace {

using namespace lnmlp::numerics;

using lnmlp_test::from_bits;
using lnmlp_test::to_bits;

// The magnitudes of codes 0..7, by the format's definition.
constexpr float kMagnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Nearest magnitude code, ties to the even code; beyond 6 (and inf) 7; NaN 7 without sign.
uint8_t ref_encode(float x) {
  if (std::isnan(x)) return 7;
  const bool neg = std::signbit(x);
  const double a = std::fabs(static_cast<double>(x));
  int best = 7;
  if (a < 6.0) {
    best = 0;
    for (int c = 1; c < 8; ++c) {
      const double d = std::fabs(a - kMagnitudes[c]), db = std::fabs(a - kMagnitudes[best]);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
  }
  return static_cast<uint8_t>(best | (neg ? 8 : 0));
}

void expect_encodes(float x) {
  const uint8_t want = ref_encode(x);
  ASSERT_EQ(float_to_e2m1(x), want) << "x = " << x << " (bits 0x" << std::hex << to_bits(x) << ")";
  ASSERT_EQ(to_bits(round_to_e2m1(x)), to_bits(e2m1_to_float(want))) << "x = " << x;
}

TEST(Fp4Formats, EveryCodeDecodes) {
  for (int c = 0; c < 16; ++c) {
    const float want = (c & 8) ? -kMagnitudes[c & 7] : kMagnitudes[c & 7];
    EXPECT_EQ(to_bits(e2m1_to_float(static_cast<uint8_t>(c))), to_bits(want)) << "code " << c;
    EXPECT_EQ(float_to_e2m1(want), c) << "code " << c << " does not round-trip";
    EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(c | 0xf0)), e2m1_to_float(static_cast<uint8_t>(c)));
  }
}

TEST(Fp4Formats, TiesAndSpecials) {
  // The midpoint between codes i and i + 1 goes to the even one of them: 0.25 -> 0, 0.75 -> 1.0,
  // 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4; just below it to i, just above to i + 1.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int i = 0; i < 7; ++i) {
    const int even = i % 2 == 0 ? i : i + 1;
    EXPECT_EQ(float_to_e2m1(ties[i]), even) << ties[i];
    EXPECT_EQ(float_to_e2m1(-ties[i]), even | 8) << -ties[i];
    EXPECT_EQ(float_to_e2m1(std::nextafter(ties[i], 0.0f)), i) << ties[i];
    EXPECT_EQ(float_to_e2m1(std::nextafter(ties[i], 10.0f)), i + 1) << ties[i];
  }
  EXPECT_EQ(float_to_e2m1(-0.0f), 8);
  EXPECT_EQ(float_to_e2m1(-1e-30f), 8);
  EXPECT_EQ(float_to_e2m1(6.5f), 7);
  EXPECT_EQ(float_to_e2m1(1e30f), 7);
  EXPECT_EQ(float_to_e2m1(std::numeric_limits<float>::infinity()), 7);
  EXPECT_EQ(float_to_e2m1(-std::numeric_limits<float>::infinity()), 15);
  EXPECT_EQ(float_to_e2m1(std::numeric_limits<float>::quiet_NaN()), 7);
  EXPECT_EQ(float_to_e2m1(-std::numeric_limits<float>::quiet_NaN()), 7);
  EXPECT_EQ(to_bits(round_to_e2m1(std::numeric_limits<float>::quiet_NaN())), to_bits(6.0f));
}

// Every fp32 from 2^-8 to 16 (both signs: the whole range where E2M1 rounds, ~0.2 G floats of
// each sign would take too long, so every 7th), and every 4099th float of the rest.
TEST(Fp4Formats, Sweep) {
  for (uint32_t u = to_bits(0x1p-8f); u <= to_bits(16.0f); u += 7) {
    expect_encodes(from_bits(u));
    expect_encodes(from_bits(u | 0x80000000u));
  }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) expect_encodes(from_bits(static_cast<uint32_t>(u)));
}

TEST(Fp4Formats, Packing) {
  EXPECT_EQ(pack_e2m1x2(0x3, 0xc), 0xc3);
  const uint8_t row[2] = {0xc3, 0x05};
  EXPECT_EQ(unpack_e2m1(row, 0), 0x3);
  EXPECT_EQ(unpack_e2m1(row, 1), 0xc);
  EXPECT_EQ(unpack_e2m1(row, 2), 0x5);
  EXPECT_EQ(unpack_e2m1(row, 3), 0x0);
}

// ---- the NVFP4 quantizer ------------------------------------------------------------------------

// TransformerEngine's formulas (docs/design.md, "NVFP4"), each product and quotient rounded to
// fp32 as its kernels round them (an operation on two floats done in double and rounded to float
// once is the fp32 operation), then limited to FLT_MAX as fminf limits them (NaN included).
constexpr double kFltMax = std::numeric_limits<float>::max();
float at_most_flt_max(double q) {
  return std::isnan(q) || q > kFltMax ? static_cast<float>(kFltMax) : static_cast<float>(q);
}
double d(float v) { return static_cast<double>(v); }

float ref_global_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  const float s = at_most_flt_max(2688.0 / d(amax));
  return s == 0.0f ? 1.0f : s;
}

struct RefBlock {
  uint8_t scale;
  float element_scale;
};
RefBlock ref_block(float block_amax, float global_scale) {
  const float m = static_cast<float>(d(global_scale) * d(1.0f / 6.0f));
  const uint8_t s = float_to_fp8<Fp8Format::E4M3>(at_most_flt_max(d(block_amax) * d(m)));  // E4M3: test_fp8_formats
  const float dec = static_cast<float>(1.0 / d(global_scale));
  const float p = static_cast<float>(d(fp8_to_float<Fp8Format::E4M3>(s)) * d(dec));
  return {s, at_most_flt_max(1.0 / d(p))};
}

// max |x| over rows [r0, r1) and columns [c0, c1) of a [*, cols] matrix, NaN if one of them is.
float ref_amax(const std::vector<float>& x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  float m = 0.0f;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < std::min(cols, c1); ++c) {
      const float v = x[r * cols + c];
      m = std::isnan(v) || std::isnan(m) ? NAN : std::max(m, std::fabs(v));
    }
  return m;
}
float ref_amax(const std::vector<float>& x) { return ref_amax(x, 1, 0, static_cast<int64_t>(x.size()), 0, 1); }

void check_quantizer(const std::vector<float>& x, int64_t rows, int64_t cols, bool tiles) {
  const float amax = ref_amax(x);
  const int64_t blocks = (cols + 15) / 16, row_bytes = (cols + 1) / 2;
  std::vector<uint8_t> codes(rows * row_bytes, 0xee), scales(rows * blocks, 0xee);
  quantize_nvfp4(x.data(), rows, cols, tiles, amax, codes.data(), scales.data());
  const float gs = ref_global_scale(amax);
  const int64_t tr = tiles ? 16 : 1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float bmax = ref_amax(x, cols, r / tr * tr, std::min(rows, r / tr * tr + tr), b * 16, b * 16 + 16);
      const RefBlock rb = ref_block(bmax, gs);
      ASSERT_EQ(scales[r * blocks + b], rb.scale) << "row " << r << " block " << b << " amax " << bmax;
      for (int64_t c = b * 16; c < std::min(cols, b * 16 + 16); ++c) {
        const uint8_t want = ref_encode(x[r * cols + c] * rb.element_scale);
        ASSERT_EQ(unpack_e2m1(codes.data() + r * row_bytes, c), want) << "(" << r << ", " << c << ")";
      }
      if (cols % 2 == 1) {
        ASSERT_EQ(codes[r * row_bytes + row_bytes - 1] >> 4, 0) << "row " << r << "'s padding";
      }
    }
}

std::vector<float> random_matrix(int64_t n, uint32_t seed, float spread) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-spread, spread);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen) * std::exp2(exponent(gen));
  return x;
}

TEST(Nvfp4Quantizer, BlocksAndTilesAgainstTheFormulas) {
  for (bool tiles : {false, true}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 16}, {3, 37}, {16, 32}, {33, 47}, {40, 64}, {17, 1}}) {
      for (float spread : {0.0f, 6.0f, 40.0f}) {
        SCOPED_TRACE(testing::Message() << rows << " x " << cols << (tiles ? " tiles" : " blocks") << " spread "
                                        << spread);
        check_quantizer(random_matrix(rows * cols, static_cast<uint32_t>(rows * 131 + cols), spread), rows, cols,
                        tiles);
      }
    }
  }
}

TEST(Nvfp4Quantizer, SpecialBlocks) {
  // A row of 5 blocks: zeros, subnormal floats, a NaN, an inf, and ordinary values.
  std::vector<float> x(80, 0.0f);
  for (int i = 16; i < 32; ++i) x[i] = from_bits(static_cast<uint32_t>(i * 1000));  // fp32 subnormals
  for (int i = 32; i < 48; ++i) x[i] = 0.1f * static_cast<float>(i);
  x[40] = NAN;
  for (int i = 48; i < 64; ++i) x[i] = -0.3f * static_cast<float>(i);
  x[50] = -std::numeric_limits<float>::infinity();
  for (int i = 64; i < 80; ++i) x[i] = static_cast<float>(i - 70);
  check_quantizer(x, 1, 80, false);
  x[40] = 1.0f;  // the inf alone
  check_quantizer(x, 1, 80, false);
  x[50] = 2.0f;  // finite; the zero and subnormal blocks under an ordinary global scale
  check_quantizer(x, 1, 80, false);
  check_quantizer(std::vector<float>(64, 0.0f), 2, 32, true);  // all zeros: global scale 1
}

TEST(Nvfp4Quantizer, DequantizeIsCodeTimesScales) {
  const int64_t rows = 5, cols = 35;
  const std::vector<float> x = random_matrix(rows * cols, 7, 3.0f);
  const float amax = ref_amax(x);
  std::vector<uint8_t> codes(rows * 18), scales(rows * 3);
  quantize_nvfp4(x.data(), rows, cols, false, amax, codes.data(), scales.data());
  std::vector<float> out(rows * cols);
  dequantize_nvfp4(codes.data(), scales.data(), rows, cols, amax, out.data());
  const float dec = 1.0f / ref_global_scale(amax);
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = fp8_to_float<Fp8Format::E4M3>(scales[r * 3 + c / 16]);
      const float want = (e2m1_to_float(unpack_e2m1(codes.data() + r * 18, c)) * s) * dec;
      ASSERT_EQ(to_bits(out[r * cols + c]), to_bits(want));
      worst = std::max(worst,
                       std::fabs(static_cast<double>(out[r * cols + c]) - x[r * cols + c]) / static_cast<double>(amax));
    }
  // An element is off by at most half a grid step, 1/6 of its block's amax (between 4 and 6 the
  // step is 2, and the block's max maps near 6), give or take the E4M3 scale's rounding (1/16).
  EXPECT_LT(worst, (1.0 / 6.0) * (1.0 + 1.0 / 16.0));
}

}  // namespace

// ---- stochastic rounding ------------------------------------------------------------------------

namespace {

// The index lo of the grid magnitudes around a in [0, 6): kMagnitudes[lo] <= a < kMagnitudes[lo + 1].
int grid_below(double a) {
  int lo = 0;
  while (lo < 6 && kMagnitudes[lo + 1] <= a) ++lo;
  return lo;
}

// floor((a - lo) / (hi - lo) * 2^32) in exact arithmetic, for a magnitude below 6.
uint64_t ref_threshold(float v) {
  const double a = std::fabs(static_cast<double>(v));
  const int lo = grid_below(a);
  return static_cast<uint64_t>(std::floor((a - kMagnitudes[lo]) / (kMagnitudes[lo + 1] - kMagnitudes[lo]) * 0x1p32));
}

TEST(Fp4Stochastic, RoundsUpForExactlyTheRightShareOfRandomBits) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> mag(0.0f, 6.0f);
  std::vector<float> values = {0.0f,  0.5f,  1.0f, 1.5f,   2.0f,     3.0f,     4.0f,
                               0.25f, 0.75f, 5.0f, 5.999f, 0x1p-20f, 0x1p-140f};
  for (int i = 0; i < 2000; ++i) values.push_back(mag(gen));
  for (float v : values) {
    for (float s : {v, -v}) {
      const uint8_t down = static_cast<uint8_t>(float_to_e2m1(s) & 8);  // the sign; magnitude below
      const uint64_t t = ref_threshold(s);
      const int lo = grid_below(std::fabs(static_cast<double>(s)));
      // Bits just below and at the threshold: up below it, down from it on.
      if (t > 0) {
        ASSERT_EQ(stochastic_float_to_e2m1(s, static_cast<uint32_t>(t - 1)), (lo + 1) | down) << s;
      }
      ASSERT_EQ(stochastic_float_to_e2m1(s, static_cast<uint32_t>(std::min<uint64_t>(t, 0xffffffffu))), lo | down) << s;
      ASSERT_EQ(stochastic_float_to_e2m1(s, 0xffffffffu), lo | down) << s;
    }
  }
  EXPECT_EQ(stochastic_float_to_e2m1(6.0f, 0), 7);
  EXPECT_EQ(stochastic_float_to_e2m1(-100.0f, 0), 15);
  EXPECT_EQ(stochastic_float_to_e2m1(std::numeric_limits<float>::infinity(), 0), 7);
  EXPECT_EQ(stochastic_float_to_e2m1(std::numeric_limits<float>::quiet_NaN(), 0), 7);
  EXPECT_EQ(stochastic_float_to_e2m1(-0.0f, 0), 8);
}

// With Philox's bits, the decoded values average to the input (unbiased) with the variance of a
// two-point distribution, step^2 p (1 - p), within 5 standard errors.
TEST(Fp4Stochastic, UnbiasedWithTheExpectedVariance) {
  const int n = 200000;
  for (float v : {0.1f, 0.3f, 0.8f, 1.2f, 1.9f, 2.7f, 3.3f, 4.5f, 5.5f, -2.2f}) {
    double sum = 0.0, sum2 = 0.0;
    for (int i = 0; i < n; ++i) {
      const double d = e2m1_to_float(stochastic_float_to_e2m1(v, philox_bits(42, 7, static_cast<uint64_t>(i))));
      sum += d;
      sum2 += d * d;
    }
    const double mean = sum / n, var = sum2 / n - mean * mean;
    const double a = std::fabs(static_cast<double>(v));
    const int lo = grid_below(a);
    const double step = kMagnitudes[lo + 1] - kMagnitudes[lo], p = (a - kMagnitudes[lo]) / step;
    const double want_var = step * step * p * (1.0 - p);
    EXPECT_NEAR(mean, static_cast<double>(v), 5.0 * std::sqrt(want_var / n)) << v;
    // The sample variance of n two-point draws has a standard error of about var * sqrt(2 / n)
    // (its fourth moment is bounded by step^4 p (1-p)); 5 of those, relative.
    EXPECT_NEAR(var, want_var, 5.0 * step * step * std::sqrt(p * (1.0 - p) / n)) << v;
  }
}

}  // namespace

// ---- the quantizer with stochastic rounding, and the GEMM contract --------------------------------

namespace {

Nvfp4Rounding stochastic_rounding(uint64_t seed, uint64_t offset) {
  Nvfp4Rounding r;
  r.stochastic = true;
  r.seed = seed;
  r.offset = offset;
  return r;
}

TEST(Nvfp4Quantizer, StochasticRoundingDrawsEachElementsOwnBits) {
  const int64_t rows = 32, cols = 40;
  const std::vector<float> x = random_matrix(rows * cols, 9, 4.0f);
  const float amax = ref_amax(x);
  const Nvfp4Rounding sr = stochastic_rounding(1234, 5);
  std::vector<uint8_t> codes(rows * 20), scales(rows * 3), nearest_codes(rows * 20), nearest_scales(rows * 3);
  quantize_nvfp4(x.data(), rows, cols, false, amax, codes.data(), scales.data(), sr);
  quantize_nvfp4(x.data(), rows, cols, false, amax, nearest_codes.data(), nearest_scales.data());
  EXPECT_EQ(scales, nearest_scales);  // the scales do not depend on the rounding
  const float gs = ref_global_scale(amax);
  int64_t differ = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float bmax = ref_amax(x, cols, r, r + 1, c / 16 * 16, c / 16 * 16 + 16);
      const float scaled = x[r * cols + c] * ref_block(bmax, gs).element_scale;
      const uint32_t bits = philox_bits(1234, 5, static_cast<uint64_t>(r * cols + c));
      ASSERT_EQ(unpack_e2m1(codes.data() + r * 20, c), stochastic_float_to_e2m1(scaled, bits)) << r << ", " << c;
      differ += unpack_e2m1(codes.data() + r * 20, c) != unpack_e2m1(nearest_codes.data() + r * 20, c);
    }
  EXPECT_GT(differ, rows * cols / 10);  // stochastic rounding moves many elements off nearest
  // Quantized in two pieces of rows, the second offset by its first row, it draws the same bits.
  std::vector<uint8_t> halves(rows * 20), half_scales(rows * 3);
  quantize_nvfp4(x.data(), 16, cols, false, amax, halves.data(), half_scales.data(), sr);
  Nvfp4Rounding second = sr;
  second.row_offset = 16;
  quantize_nvfp4(x.data() + 16 * cols, 16, cols, false, amax, halves.data() + 16 * 20, half_scales.data() + 16 * 3,
                 second);
  EXPECT_EQ(halves, codes);
}

TEST(Nvfp4Quantizer, AShardsStreamMapsDrawTheWholeTensorsBits) {
  // The whole tensor [rows, A * F] (A = 2 halves of F = 64), and rank 1's shard of a group of 2:
  // columns 32..63 of each half, [rows, 2 * 32]. With the whole tensor's amax and the stream mapped
  // (halves of 32 columns, 64 apart, from column 32; row stride 128), the shard's codes are the
  // whole tensor's at its columns; and the transposed shard's, rows mapped, the transposed whole's.
  const int64_t rows = 24, A = 2, F = 64, W = 32, cols = A * F;
  const std::vector<float> x = random_matrix(rows * cols, 21, 4.0f);
  const float amax = ref_amax(x);
  std::vector<float> shard(rows * A * W);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t j = 0; j < W; ++j) shard[(r * A + a) * W + j] = x[r * cols + a * F + W + j];
  const Nvfp4StreamMap features{W, F, W};
  const Nvfp4Rounding whole_sr = stochastic_rounding(77, 3);
  std::vector<uint8_t> codes(rows * cols / 2), scales(rows * cols / 16);
  quantize_nvfp4(x.data(), rows, cols, false, amax, codes.data(), scales.data(), whole_sr);
  Nvfp4Rounding shard_sr = whole_sr;
  shard_sr.cols = features;
  shard_sr.row_stride = cols;
  std::vector<uint8_t> shard_codes(rows * A * W / 2), shard_scales(rows * A * W / 16);
  quantize_nvfp4(shard.data(), rows, A * W, false, amax, shard_codes.data(), shard_scales.data(), shard_sr);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < A * W; ++c)
      ASSERT_EQ(unpack_e2m1(shard_codes.data() + r * A * W / 2, c),
                unpack_e2m1(codes.data() + r * cols / 2, features(c)))
          << r << ", " << c;
  // Transposed: the whole [cols, rows] and the shard's [A * W, rows], rows mapped.
  std::vector<float> xt(cols * rows), shard_t(A * W * rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
    for (int64_t c = 0; c < A * W; ++c) shard_t[c * rows + r] = shard[r * A * W + c];
  }
  const int64_t t_blocks = num_blocks(rows, 16);  // 16 and a partial 8
  std::vector<uint8_t> t_codes(cols * rows / 2), t_scales(cols * t_blocks);
  quantize_nvfp4(xt.data(), cols, rows, false, amax, t_codes.data(), t_scales.data(), whole_sr);
  Nvfp4Rounding shard_t_sr = whole_sr;
  shard_t_sr.rows = features;
  std::vector<uint8_t> st_codes(A * W * rows / 2), st_scales(A * W * t_blocks);
  quantize_nvfp4(shard_t.data(), A * W, rows, false, amax, st_codes.data(), st_scales.data(), shard_t_sr);
  for (int64_t c = 0; c < A * W; ++c)
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(unpack_e2m1(st_codes.data() + c * rows / 2, r), unpack_e2m1(t_codes.data() + features(c) * rows / 2, r))
          << c << ", " << r;
}

TEST(Nvfp4Gemm, BlockScaledDotIsTheContract) {
  EXPECT_EQ(to_bits(kNvfp4AlphaFactorInv), to_bits(static_cast<float>(1.0 / 7225344.0)));
  const int64_t m = 3, n = 4, k = 40, row_bytes = 20, blocks = 3;
  const std::vector<float> a = random_matrix(m * k, 11, 3.0f), b = random_matrix(n * k, 12, 3.0f);
  const float amax_a = ref_amax(a), amax_b = ref_amax(b);
  std::vector<uint8_t> qa(m * row_bytes), sa(m * blocks), qb(n * row_bytes), sb(n * blocks);
  quantize_nvfp4(a.data(), m, k, false, amax_a, qa.data(), sa.data());
  quantize_nvfp4(b.data(), n, k, true, amax_b, qb.data(), sb.data());
  const float alpha = nvfp4_gemm_alpha(amax_a, amax_b);
  EXPECT_EQ(to_bits(alpha), to_bits(static_cast<float>(static_cast<double>(static_cast<float>(d(amax_a) * d(amax_b))) *
                                                       d(kNvfp4AlphaFactorInv))));
  // An element's quantization error is at most half a grid step at its block's scale: 1/6 of the
  // block's amax (the step between 4 and 6 is 2), times 17/16 for the E4M3 rounding of the scale.
  auto error_bound = [&](const std::vector<float>& x, int64_t r0, int64_t r1, int64_t blk) {
    return d(ref_amax(x, k, r0, r1, blk * 16, blk * 16 + 16)) / 6.0 * 17.0 / 16.0;
  };
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      // The contract in double: each block's dot times its two scales is exact in fp32 too.
      double sum = 0.0, mass = 0.0, exact = 0.0, bound = 0.0;
      for (int64_t blk = 0; blk < blocks; ++blk) {
        double dot = 0.0;
        for (int64_t c = blk * 16; c < std::min(k, blk * 16 + 16); ++c)
          dot += d(e2m1_to_float(unpack_e2m1(qa.data() + i * row_bytes, c))) *
                 d(e2m1_to_float(unpack_e2m1(qb.data() + j * row_bytes, c)));
        const double term = dot * d(fp8_to_float<Fp8Format::E4M3>(sa[i * blocks + blk])) *
                            d(fp8_to_float<Fp8Format::E4M3>(sb[j * blocks + blk]));
        sum += term;
        mass += std::fabs(term);
      }
      for (int64_t c = 0; c < k; ++c) {
        const double ea = error_bound(a, i, i + 1, c / 16), eb = error_bound(b, 0, n, c / 16);  // B: 16x16 tiles
        exact += d(a[i * k + c]) * d(b[j * k + c]);
        bound += ea * std::fabs(d(b[j * k + c])) + std::fabs(d(a[i * k + c])) * eb + ea * eb;
      }
      const float got = nvfp4_block_scaled_dot(qa.data() + i * row_bytes, sa.data() + i * blocks,
                                               qb.data() + j * row_bytes, sb.data() + j * blocks, k, alpha);
      // Only the sum over the blocks (3) and the product with alpha round.
      EXPECT_NEAR(got, sum * d(alpha), (3.0 * mass + std::fabs(sum)) * d(alpha) * 0x1p-23) << i << ", " << j;
      // And it is the unquantized product within the elements' quantization errors.
      EXPECT_LE(std::fabs(d(got) - exact), bound * (1.0 + 1e-3)) << i << ", " << j;
    }
}

}  // namespace
