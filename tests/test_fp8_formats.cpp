// The FP8 conversions of src/numerics/fp8.h (host path) against a brute-force reference written
// here from the format definitions: decoding by ldexp of the code's fields, encoding by scanning
// the codes for the nearest value (ties to even), with the library's stated saturation (beyond
// max finite and ±inf -> ± max finite) and NaN handling. ml_dtypes is the second, independent
// oracle, in bindings/python/tests/test_fp8_formats.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "float_bits.h"
#include "numerics/fp8.h"

namespace {

using namespace lnmlp::numerics;

using lnmlp_test::from_bits;
using lnmlp_test::to_bits;

// ---- the reference ----------------------------------------------------------------------------

struct Format {
  Fp8Format fmt;
  int exp_bits, man_bits, bias;
  bool has_inf;  // E5M2: exponent all ones, mantissa 0 is infinity; E4M3 (fn): only S.1111.111 is NaN
};
constexpr Format kE4M3{Fp8Format::E4M3, 4, 3, 7, false};
constexpr Format kE5M2{Fp8Format::E5M2, 5, 2, 15, true};

enum class Kind { Finite, Inf, NaN };

Kind kind_of(const Format& f, int code) {
  const int e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.man_bits) - 1);
  const int emax = (1 << f.exp_bits) - 1;
  if (f.has_inf) return e == emax ? (m == 0 ? Kind::Inf : Kind::NaN) : Kind::Finite;
  return (e == emax && m == (1 << f.man_bits) - 1) ? Kind::NaN : Kind::Finite;
}

// The value of a code, by the definition: (-1)^s 2^(1-bias) m/2^M for e = 0, else
// (-1)^s 2^(e-bias) (1 + m/2^M).
double ref_decode(const Format& f, int code) {
  const bool neg = code & 0x80;
  const int e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1), m = code & ((1 << f.man_bits) - 1);
  double v;
  switch (kind_of(f, code)) {
    case Kind::NaN: return std::numeric_limits<double>::quiet_NaN();
    case Kind::Inf: v = std::numeric_limits<double>::infinity(); break;
    default: v = e == 0 ? std::ldexp(m, 1 - f.bias - f.man_bits) : std::ldexp((1 << f.man_bits) + m, e - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

// The non-negative finite codes in increasing order of value (checked), with their values.
struct Table {
  std::vector<int> codes;
  std::vector<double> values;
  int nan_code;  // the canonical NaN code the library documents (no sign)
};

Table make_table(const Format& f) {
  Table t;
  for (int c = 0; c < 128; ++c)
    if (kind_of(f, c) == Kind::Finite) {
      t.codes.push_back(c);
      t.values.push_back(ref_decode(f, c));
    }
  for (size_t i = 1; i < t.values.size(); ++i)
    if (!(t.values[i] > t.values[i - 1])) ADD_FAILURE() << "reference table not increasing at " << i;
  t.nan_code = 0x7f;  // both formats: NVIDIA's canonical NaN
  return t;
}

// Nearest code to x, ties to the even code; beyond max finite (and ±inf) saturate; NaN -> NaN.
// The bracket v[k] <= |x| < v[k+1] is found in the table of all codes and |x| compared with the exact
// midpoint (all these are exact in double: few significant bits).
uint8_t ref_encode(const Format& f, const Table& t, float x) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return static_cast<uint8_t>(t.nan_code);
  const double a = std::fabs(static_cast<double>(x));
  const double vmax = t.values.back();
  if (a >= vmax) return static_cast<uint8_t>(sign | t.codes.back());  // saturation, ±inf included
  // the bracket by bisection over the sorted table (a linear scan gives the same k, only slower)
  const size_t k = static_cast<size_t>(std::upper_bound(t.values.begin(), t.values.end(), a) - t.values.begin()) - 1;
  const double mid = 0.5 * (t.values[k] + t.values[k + 1]);
  int c;
  if (a < mid) c = t.codes[k];
  else if (a > mid) c = t.codes[k + 1];
  else c = (t.codes[k] & 1) == 0 ? t.codes[k] : t.codes[k + 1];
  (void)f;
  return static_cast<uint8_t>(sign | c);
}

// ---- checks -----------------------------------------------------------------------------------

template <Fp8Format F> void check_encode(const Format& f, const Table& t, float x) {
  const uint8_t want = ref_encode(f, t, x);
  const uint8_t got = float_to_fp8<F>(x);
  ASSERT_EQ(int{got}, int{want}) << lnmlp::numerics::fp8_name(F) << " of " << x << " (bits 0x" << std::hex
                                 << to_bits(x) << ")";
  ASSERT_EQ(int{float_to_fp8(x, F)}, int{want}) << "runtime-format overload, bits 0x" << std::hex << to_bits(x);
}

template <Fp8Format F> void check_encode_both_signs(const Format& f, const Table& t, float x) {
  check_encode<F>(f, t, x);
  check_encode<F>(f, t, -x);
}

template <Fp8Format F> struct Fixture {
  const Format& f = F == Fp8Format::E4M3 ? kE4M3 : kE5M2;
  Table t = make_table(f);
};

template <Fp8Format F> void every_code_decodes() {
  Fixture<F> fx;
  for (int c = 0; c < 256; ++c) {
    const float got = fp8_to_float<F>(static_cast<uint8_t>(c));
    ASSERT_EQ(to_bits(fp8_to_float(static_cast<uint8_t>(c), F)), to_bits(got)) << "runtime-format overload";
    const double want = ref_decode(fx.f, c);
    if (std::isnan(want)) {
      // NaN codes decode to the quiet NaN with the code's sign (what ml_dtypes gives).
      ASSERT_EQ(to_bits(got), (c & 0x80 ? 0xffc00000u : 0x7fc00000u)) << "code 0x" << std::hex << c;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << "code 0x" << std::hex << c;
      ASSERT_EQ(std::signbit(got), (c & 0x80) != 0) << "code 0x" << std::hex << c;  // -0 for 0x80
      // every finite (and infinite) code round-trips
      ASSERT_EQ(int{float_to_fp8<F>(got)}, kind_of(fx.f, c) == Kind::Inf ? ((c & 0x80) | fx.t.codes.back()) : c)
          << "code 0x" << std::hex << c;
    }
  }
}

// Every midpoint between neighbouring finite values (ties), and the floats up to 8 ulps either side,
// of every value too, both signs.
template <Fp8Format F> void ties_and_neighbours() {
  Fixture<F> fx;
  std::vector<double> points(fx.t.values.begin(), fx.t.values.end());
  for (size_t k = 0; k + 1 < fx.t.values.size(); ++k) points.push_back(0.5 * (fx.t.values[k] + fx.t.values[k + 1]));
  // half the smallest subnormal (a tie with zero) and the midpoint above max (saturation anyway)
  points.push_back(0.5 * fx.t.values[1]);
  points.push_back(fx.t.values.back() + 0.5 * (fx.t.values.back() - fx.t.values[fx.t.values.size() - 2]));
  int ties = 0;
  for (double p : points) {
    const float c = static_cast<float>(p);
    ASSERT_EQ(static_cast<double>(c), p) << "point not a float";
    for (int d = -8; d <= 8; ++d) {
      const int64_t b = static_cast<int64_t>(to_bits(c)) + d;
      if (b < 0) continue;
      check_encode_both_signs<F>(fx.f, fx.t, from_bits(static_cast<uint32_t>(b)));
    }
    ++ties;
  }
  EXPECT_GT(ties, 200);
}

// A dense sweep of float bit patterns (every 257th, so every exponent and a spread of mantissas),
// plus every float in the binades around the fp8 range edges, both signs.
template <Fp8Format F> void dense_sweep() {
  Fixture<F> fx;
  for (uint64_t b = 0; b <= 0x7fffffffu; b += 257) check_encode_both_signs<F>(fx.f, fx.t, from_bits(static_cast<uint32_t>(b)));
  // every float in [min subnormal / 4, 2 min normal) and in [max / 2, 2 max)
  const double min_sub = fx.t.values[1], min_normal = std::ldexp(1.0, 1 - fx.f.bias), vmax = fx.t.values.back();
  const auto every = [&](double lo, double hi) {
    for (uint32_t b = to_bits(static_cast<float>(lo)); b < to_bits(static_cast<float>(hi)); ++b)
      check_encode_both_signs<F>(fx.f, fx.t, from_bits(b));
  };
  every(min_sub / 4, 2 * min_normal);
  every(vmax / 2, 2 * vmax);
}

template <Fp8Format F> void specials() {
  Fixture<F> fx;
  const float inf = std::numeric_limits<float>::infinity(), vmax = fp8_max(F);
  const uint8_t max_code = static_cast<uint8_t>(fx.t.codes.back());
  ASSERT_EQ(static_cast<double>(vmax), fx.t.values.back());
  // Saturation: at max, just above, at the midpoint above max, far beyond, FLT_MAX, and ±inf (the
  // library's choice: infinity saturates to max finite, for both formats).
  for (float x : {vmax, std::nextafter(vmax, inf), vmax * 1.0625f, vmax * 1.5f, vmax * 2, 1e30f,
                  std::numeric_limits<float>::max(), inf}) {
    EXPECT_EQ(int{float_to_fp8<F>(x)}, int{max_code}) << x;
    EXPECT_EQ(int{float_to_fp8<F>(-x)}, 0x80 | max_code) << -x;
  }
  // Every NaN, of either sign, quiet or signalling, any payload, is the canonical NaN code.
  for (uint32_t nb : {0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu, 0x7fe00000u}) {
    EXPECT_EQ(int{float_to_fp8<F>(from_bits(nb))}, fx.t.nan_code);
    EXPECT_EQ(int{float_to_fp8<F>(from_bits(nb | 0x80000000u))}, fx.t.nan_code);
    EXPECT_TRUE(std::isnan(fp8_to_float<F>(float_to_fp8<F>(from_bits(nb)))));
  }
  // Zeros keep their sign; underflow to zero keeps the sign.
  EXPECT_EQ(int{float_to_fp8<F>(0.0f)}, 0);
  EXPECT_EQ(int{float_to_fp8<F>(-0.0f)}, 0x80);
  const float half_min_sub = static_cast<float>(fx.t.values[1] / 2);
  EXPECT_EQ(int{float_to_fp8<F>(half_min_sub)}, 0);  // a tie: to the even code, 0
  EXPECT_EQ(int{float_to_fp8<F>(-half_min_sub)}, 0x80);
  EXPECT_EQ(int{float_to_fp8<F>(std::nextafter(half_min_sub, 1.0f))}, 1);
  EXPECT_EQ(int{float_to_fp8<F>(-std::nextafter(half_min_sub, 1.0f))}, 0x81);
  EXPECT_EQ(int{float_to_fp8<F>(std::numeric_limits<float>::denorm_min())}, 0);
  EXPECT_EQ(int{float_to_fp8<F>(-std::numeric_limits<float>::denorm_min())}, 0x80);
  if (F == Fp8Format::E5M2) {
    EXPECT_EQ(fp8_to_float<F>(0x7c), inf);
    EXPECT_EQ(fp8_to_float<F>(0xfc), -inf);
  }
}

// round_to_fp8 (rounding on the format's grid in fp32, without the code) gives the bits of the
// round trip through the code, fp8_to_float(float_to_fp8(x)), whose encode the reference above
// checks: for every float of either sign from a quarter of the smallest subnormal to twice max
// finite (every rounding, tie and carry into the next binade, and the saturation's edge), every
// 257th float elsewhere, infinities and NaNs of every kind. Counted, not asserted one by one:
// half a billion floats.
template <Fp8Format F> void round_to_fp8_is_the_round_trip() {
  Fixture<F> fx;
  uint64_t checked = 0, wrong = 0;
  uint32_t first_wrong = 0;
  const auto check = [&](uint32_t b) {
    for (uint32_t s : {0u, 0x80000000u}) {
      const float x = from_bits(b | s);
      const uint32_t got = to_bits(round_to_fp8<F>(x)), want = to_bits(fp8_to_float<F>(float_to_fp8<F>(x)));
      if (got != want && wrong++ == 0) first_wrong = b | s;
      ++checked;
    }
  };
  const uint32_t lo = to_bits(static_cast<float>(fx.t.values[1] / 4)), hi = to_bits(2 * fp8_max(F));
  for (uint32_t b = lo; b < hi; ++b) check(b);
  for (uint64_t b = 0; b <= 0x7fffffffu; b += 257) check(static_cast<uint32_t>(b));
  for (uint32_t b : {0x7f800000u, 0x7f800001u, 0x7fa00000u, 0x7fc00000u, 0x7fffffffu}) check(b);
  EXPECT_EQ(wrong, 0u) << "first at float bits 0x" << std::hex << first_wrong;
  EXPECT_GT(checked, uint64_t{2} * (hi - lo));
}

TEST(Fp8Formats, E4M3RoundToFp8IsTheRoundTrip) { round_to_fp8_is_the_round_trip<Fp8Format::E4M3>(); }
TEST(Fp8Formats, E5M2RoundToFp8IsTheRoundTrip) { round_to_fp8_is_the_round_trip<Fp8Format::E5M2>(); }

TEST(Fp8Formats, E4M3EveryCodeDecodesAndRoundTrips) { every_code_decodes<Fp8Format::E4M3>(); }
TEST(Fp8Formats, E5M2EveryCodeDecodesAndRoundTrips) { every_code_decodes<Fp8Format::E5M2>(); }
TEST(Fp8Formats, E4M3TiesAndNeighbours) { ties_and_neighbours<Fp8Format::E4M3>(); }
TEST(Fp8Formats, E5M2TiesAndNeighbours) { ties_and_neighbours<Fp8Format::E5M2>(); }
TEST(Fp8Formats, E4M3DenseSweep) { dense_sweep<Fp8Format::E4M3>(); }
TEST(Fp8Formats, E5M2DenseSweep) { dense_sweep<Fp8Format::E5M2>(); }
TEST(Fp8Formats, E4M3Specials) { specials<Fp8Format::E4M3>(); }
TEST(Fp8Formats, E5M2Specials) { specials<Fp8Format::E5M2>(); }

TEST(Fp8Formats, Constants) {
  static_assert(fp8_max(Fp8Format::E4M3) == 448.0f && fp8_max(Fp8Format::E5M2) == 57344.0f);
  static_assert(static_cast<int32_t>(Fp8Format::E4M3) == 0 && static_cast<int32_t>(Fp8Format::E5M2) == 1);
  EXPECT_EQ(to_bits(448.0f), lnmlp::numerics::Fp8Traits<Fp8Format::E4M3>::max_float_bits);
  EXPECT_EQ(to_bits(57344.0f), lnmlp::numerics::Fp8Traits<Fp8Format::E5M2>::max_float_bits);
}

}  // namespace
