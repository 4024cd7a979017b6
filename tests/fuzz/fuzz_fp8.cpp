// fuzz_fp8: lnmlp_fp8_encode / lnmlp_fp8_decode on the fuzzer's bytes, against a plain reference
// of E4M3 ("e4m3fn") and E5M2 written from include/lnmlp.h's description (round to nearest even,
// saturating, NaN kept with its sign, signed zeros), and their argument checks (README.md: the byte
// format).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "fuzz_common.h"
#include "lnmlp.h"

namespace {

using fuzz::Buf;
using fuzz::Reader;

struct Format {
  int exp_bits, man_bits, bias;
  uint8_t max_code, nan_code;  // the largest finite magnitude's code, the canonical NaN's
  bool has_inf;
};
constexpr Format kE4M3{4, 3, 7, 0x7e, 0x7f, false};
constexpr Format kE5M2{5, 2, 15, 0x7b, 0x7f, true};

bool is_nan_code(const Format& f, uint8_t c) {
  const uint8_t m = c & 0x7f;
  return f.has_inf ? m > 0x7c : m == 0x7f;
}
bool is_inf_code(const Format& f, uint8_t c) { return f.has_inf && (c & 0x7f) == 0x7c; }

// The magnitude of a finite code's low 7 bits, exactly (a double holds every one).
double magnitude(const Format& f, uint8_t c) {
  const int e = (c & 0x7f) >> f.man_bits, m = c & ((1 << f.man_bits) - 1);
  if (e == 0) return std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  return std::ldexp(static_cast<double>((1 << f.man_bits) + m), e - f.bias - f.man_bits);
}

float reference_decode(const Format& f, uint8_t c) {
  const bool neg = (c & 0x80) != 0;
  if (is_nan_code(f, c))
    return neg ? -std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::quiet_NaN();
  if (is_inf_code(f, c)) return neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  const auto v = static_cast<float>(magnitude(f, c));
  return neg ? -v : v;
}

// Nearest code, ties to the even code; beyond the largest finite value (infinity too) saturates.
uint8_t reference_encode(const Format& f, float v) {
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  if (std::isnan(v)) return f.nan_code;  // canonical: no sign
  const double a = std::fabs(static_cast<double>(v));
  if (a >= magnitude(f, f.max_code)) return sign | f.max_code;
  uint8_t lo = 0;
  while (lo < f.max_code && magnitude(f, static_cast<uint8_t>(lo + 1)) <= a) ++lo;
  if (magnitude(f, lo) == a) return sign | lo;
  const auto hi = static_cast<uint8_t>(lo + 1);
  const double dlo = a - magnitude(f, lo), dhi = magnitude(f, hi) - a;
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | hi;
  return sign | ((lo & 1) == 0 ? lo : hi);
}

bool same_float(float want, float got) {
  if (std::isnan(want)) return std::isnan(got) && std::signbit(want) == std::signbit(got);
  return lnmlp_test::to_bits(want) == lnmlp_test::to_bits(got);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r(data, size);
  const int32_t dtype = r.pick32(LNMLP_DTYPE_FP8_E4M3, LNMLP_DTYPE_FP8_E5M2);
  const float scale = r.pick_float();
  const uint8_t count_sel = r.u8(), nulls = r.u8();
  const bool known = dtype == LNMLP_DTYPE_FP8_E4M3 || dtype == LNMLP_DTYPE_FP8_E5M2;
  const Format& f = dtype == LNMLP_DTYPE_FP8_E5M2 ? kE5M2 : kE4M3;
  const bool scale_ok = std::isfinite(scale) && scale != 0.0f;

  // The rest: float32 inputs of encode (at most 1024), and the same bytes as codes for decode.
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(r.left() / 4), 1024);
  Buf in(n * 4, 4), codes(n, 1), out8(n, 1), out32(n * 4, 4);
  r.take(in.data(), static_cast<size_t>(n * 4));
  std::memcpy(codes.data(), in.data(), static_cast<size_t>(n));
  const auto* x = reinterpret_cast<const float*>(in.data());
  int64_t count = n;
  if (count_sel >= 0xF0) {
    const int64_t bad[16] = {-1, -2, std::numeric_limits<int64_t>::min(), -1024, 0, 0, 1, 1, -1, -1, -3, -4, -5, -6,
                             -7, -8};
    count = std::min(bad[count_sel - 0xF0], n);
  }
  const bool null_in = (nulls & 1) != 0 && (nulls & 0x80) != 0, null_out = (nulls & 2) != 0 && (nulls & 0x80) != 0;
  const bool ok = known && scale_ok && count >= 0 && (count == 0 || (!null_in && !null_out));

  // Encode.
  out8.fill_byte(0xCC);
  std::vector<uint8_t> before = out8.snapshot();
  int32_t st = API(lnmlp_fp8_encode(dtype, null_in ? nullptr : x, count, scale, null_out ? nullptr : out8.data()));
  FUZZ_CHECK(ok == (st == LNMLP_SUCCESS), "fp8_encode(dtype %d, count %lld, scale %g, in %s, out %s): %s", dtype,
             static_cast<long long>(count), scale, null_in ? "NULL" : "given", null_out ? "NULL" : "given",
             lnmlp_status_string(st));
  if (st != LNMLP_SUCCESS) {
    FUZZ_CHECK(out8.same(before), "a failed fp8_encode wrote its output");
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const float v = x[i] * scale;  // the product in fp32, as the header says
      const uint8_t want = reference_encode(f, v);
      FUZZ_CHECK(out8.data()[i] == want, "fp8_encode(%s) of %a * %a = %a: code 0x%02x, the reference says 0x%02x",
                 dtype == LNMLP_DTYPE_FP8_E4M3 ? "E4M3" : "E5M2", x[i], scale, v, out8.data()[i], want);
    }
    for (int64_t i = count; i < n; ++i) FUZZ_CHECK(out8.data()[i] == 0xCC, "fp8_encode wrote past count");
  }

  // Decode of the same bytes as codes.
  out32.fill_byte(0xCC);
  before = out32.snapshot();
  auto* y = reinterpret_cast<float*>(out32.data());
  st = API(lnmlp_fp8_decode(dtype, null_in ? nullptr : codes.data(), count, scale, null_out ? nullptr : y));
  FUZZ_CHECK(ok == (st == LNMLP_SUCCESS), "fp8_decode(dtype %d, count %lld, scale_inv %g): %s", dtype,
             static_cast<long long>(count), scale, lnmlp_status_string(st));
  if (st != LNMLP_SUCCESS) {
    FUZZ_CHECK(out32.same(before), "a failed fp8_decode wrote its output");
  } else {
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t c = codes.data()[i];
      const float want = reference_decode(f, c) * scale;
      FUZZ_CHECK(same_float(want, y[i]), "fp8_decode(%s) of 0x%02x * %a: %a, the reference says %a",
                 dtype == LNMLP_DTYPE_FP8_E4M3 ? "E4M3" : "E5M2", c, scale, y[i], want);
      if (is_nan_code(f, c))
        FUZZ_CHECK((lnmlp_test::to_bits(y[i]) & 0x00400000u) != 0, "a NaN code decodes to a signalling NaN");
    }
  }

  // Every code of the format: decode(code) with scale 1 is exact, and encodes back to the code.
  if (known) {
    uint8_t all[256], back[256];
    float values[256];
    for (int c = 0; c < 256; ++c) all[c] = static_cast<uint8_t>(c);
    EXPECT_STATUS(API(lnmlp_fp8_decode(dtype, all, 256, 1.0f, values)), LNMLP_SUCCESS);
    EXPECT_STATUS(API(lnmlp_fp8_encode(dtype, values, 256, 1.0f, back)), LNMLP_SUCCESS);
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      FUZZ_CHECK(same_float(reference_decode(f, code), values[c]), "decode of code 0x%02x: %a", c, values[c]);
      if (is_nan_code(f, code)) {
        FUZZ_CHECK(back[c] == f.nan_code, "NaN code 0x%02x encodes back as 0x%02x", c, back[c]);
      } else if (is_inf_code(f, code)) {
        FUZZ_CHECK(back[c] == ((code & 0x80) | f.max_code), "infinity 0x%02x encodes as 0x%02x, not saturated", c,
                   back[c]);
      } else {
        FUZZ_CHECK(back[c] == code, "code 0x%02x decodes to %a, which encodes as 0x%02x", c, values[c], back[c]);
      }
    }
  }
  return 0;
}
