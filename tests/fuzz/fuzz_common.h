// What the libFuzzer harnesses of tests/fuzz share: a reader that turns the fuzzer's bytes into
// values (README.md documents the encoding; make_corpus.py writes it), the checks of the header's
// conventions that hold for every call, exactly-sized buffers (so AddressSanitizer sees one byte too
// far), and the fills of tensors in the plan's dtypes.
#ifndef LNMLP_TESTS_FUZZ_FUZZ_COMMON_H
#define LNMLP_TESTS_FUZZ_FUZZ_COMMON_H

#include <cfloat>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include <vector>
#include "reference/dtype_convert.h"  // tests/: bf16 and f16 rounded to nearest even
#include "reference/float_bits.h"     // tests/: a float's bits and back

#include "lnmlp.h"

namespace fuzz {

// ---- reporting ---------------------------------------------------------------------------------

// A broken promise of include/lnmlp.h: says which, then traps, so that libFuzzer saves the input.
[[noreturn]] __attribute__((format(printf, 3, 4))) inline void die(const char* file, int line, const char* fmt, ...) {
  std::fprintf(stderr, "\n==== lnmlp fuzz: broken promise at %s:%d\n     ", file, line);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "\n     lnmlp_last_error(): \"%s\"\n", lnmlp_last_error());
  std::fflush(stderr);
  __builtin_trap();
}

#define FUZZ_CHECK(cond, ...)                                  \
  do {                                                         \
    if (!(cond)) ::fuzz::die(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// LNMLP_FUZZ_VERBOSE=1: print what a harness could not classify (a call that looked valid and
// failed), for reading a corpus run; never a failure by itself.
inline bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("LNMLP_FUZZ_VERBOSE");
    return e != nullptr && e[0] != '\0' && e[0] != '0';
  }();
  return v;
}

// ---- the status conventions of every call (include/lnmlp.h, "Conventions") ---------------------

inline bool is_argument_error(int32_t st) {
  return st == LNMLP_ERROR_INVALID_ARGUMENT || st == LNMLP_ERROR_NULL_POINTER || st == LNMLP_ERROR_SIZE_OVERFLOW ||
         st == LNMLP_ERROR_INVALID_HANDLE || st == LNMLP_ERROR_MISALIGNED || st == LNMLP_ERROR_WORKSPACE_TOO_SMALL ||
         st == LNMLP_ERROR_NO_WORKSPACE;
}

// Every status is a known one with a name; a failure leaves a non-empty message; a success leaves
// the last error message as it was; LNMLP_ERROR_INTERNAL is a bug by definition.
inline int32_t check_status(const char* what, int32_t st, const std::string& error_before) {
  const char* name = lnmlp_status_string(st);
  FUZZ_CHECK(name != nullptr && std::strncmp(name, "LNMLP_", 6) == 0 && std::strcmp(name, "LNMLP_UNKNOWN_STATUS") != 0,
             "%s returned %d, which lnmlp_status_string does not name (\"%s\")", what, st, name ? name : "(null)");
  const char* err = lnmlp_last_error();
  FUZZ_CHECK(err != nullptr, "lnmlp_last_error() is NULL after %s", what);
  if (st == LNMLP_SUCCESS) {
    FUZZ_CHECK(error_before == err, "%s succeeded but changed lnmlp_last_error() from \"%s\" to \"%s\"", what,
               error_before.c_str(), err);
  } else {
    FUZZ_CHECK(err[0] != '\0', "%s failed with %s and left lnmlp_last_error() empty", what, name);
  }
  FUZZ_CHECK(st != LNMLP_ERROR_INTERNAL, "%s returned LNMLP_ERROR_INTERNAL (a bug in lnmlp, says the header)", what);
  return st;
}

template <typename Fn> int32_t checked_call(const char* what, Fn&& fn) {
  const std::string before = lnmlp_last_error();
  const int32_t st = fn();
  return check_status(what, st, before);
}

// API(lnmlp_x(...)): the call, its status checked as above.
#define API(call) ::fuzz::checked_call(#call, [&]() -> int32_t { return (call); })

#define EXPECT_STATUS(st, want)                                                                                 \
  FUZZ_CHECK((st) == (want), "expected %s, got %s (%s:%d)", lnmlp_status_string(want), lnmlp_status_string(st), \
             __FILE__, __LINE__)

// ---- bytes to values -----------------------------------------------------------------------------

// Reads the fuzzer's bytes front to back; past the end every read gives zeros.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  size_t left() const { return n_; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }
  uint64_t u64() {
    const uint64_t lo = u32();
    return lo | (static_cast<uint64_t>(u32()) << 32);
  }
  float f32() {
    const uint32_t b = u32();
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  // Up to n bytes from the stream (fewer at its end).
  size_t take(uint8_t* out, size_t n) {
    const size_t k = n < n_ ? n : n_;
    if (k > 0) std::memcpy(out, p_, k);
    p_ += k;
    n_ -= k;
    return k;
  }

  // An integer: one tag byte t. t < 0xE0: lo + t % (hi - lo + 1), in range. Otherwise the hostile
  // value kHostile[t - 0xE0] (README.md lists them; two of them read 8 or 4 more bytes).
  int64_t pick(int64_t lo, int64_t hi) {
    const uint8_t t = u8();
    if (t < 0xE0) return lo + static_cast<int64_t>(t % static_cast<uint64_t>(hi - lo + 1));
    switch (t - 0xE0) {
      case 0: return lo == std::numeric_limits<int64_t>::min() ? lo : lo - 1;
      case 1: return hi == std::numeric_limits<int64_t>::max() ? hi : hi + 1;
      case 2: return 0;
      case 3: return -1;
      case 4: return -2;
      case 5: return std::numeric_limits<int32_t>::min();
      case 6: return std::numeric_limits<int32_t>::max();
      case 7: return int64_t{std::numeric_limits<int32_t>::max()} + 1;
      case 8: return int64_t{std::numeric_limits<uint32_t>::max()};
      case 9: return std::numeric_limits<int64_t>::min();
      case 10: return std::numeric_limits<int64_t>::max();
      case 11: return std::numeric_limits<int64_t>::min() + 1;
      case 12: return int64_t{std::numeric_limits<int32_t>::min()} - 1;
      case 13: return 65535;
      case 14: return 65536;
      case 15: return 65537;
      case 16: return int64_t{1} << 20;
      case 17: return int64_t{1} << 40;
      case 18: return int64_t{1} << 46;
      case 19: return int64_t{1} << 62;
      case 20: return -65536;
      case 21: return lo;
      case 22: return hi;
      case 23: return 255;
      case 24: return 256;
      case 25: return -128;
      case 26: return -127;
      case 27: return 127;
      case 28: return 128;
      case 29: return -126;
      case 30: return static_cast<int64_t>(u64());
      default: return static_cast<int32_t>(u32());
    }
  }
  // The same, for an int32_t parameter: out-of-range hostile values wrap to 32 bits.
  int32_t pick32(int32_t lo, int32_t hi) { return static_cast<int32_t>(pick(lo, hi)); }

  // A float: one tag byte t. t < 0xE0: kFloats[t % 32]; otherwise 4 raw bytes (any bit pattern).
  float pick_float() {
    static const float kFloats[32] = {0.0f,
                                      1e-6f,
                                      1e-5f,
                                      1e-3f,
                                      0.1f,
                                      0.5f,
                                      1.0f,
                                      1.702f,
                                      2.0f,
                                      7.0f,
                                      448.0f,
                                      57344.0f,
                                      -0.0f,
                                      -1.0f,
                                      -1e-6f,
                                      std::numeric_limits<float>::quiet_NaN(),
                                      -std::numeric_limits<float>::quiet_NaN(),
                                      std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity(),
                                      FLT_MAX,
                                      -FLT_MAX,
                                      FLT_MIN,
                                      std::numeric_limits<float>::denorm_min(),
                                      1e30f,
                                      1e-30f,
                                      3.0f,
                                      0.25f,
                                      100.0f,
                                      1e38f,
                                      -7.0f,
                                      65504.0f,
                                      1.0f / 1024.0f};
    const uint8_t t = u8();
    if (t < 0xE0) return kFloats[t % 32];
    return f32();
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

// A small deterministic generator for tensor contents, seeded from the bytes.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t s_;
};

// ---- exactly-sized, aligned buffers --------------------------------------------------------------

// posix_memalign of exactly `bytes` (0 gives a unique pointer nothing may touch), so that
// AddressSanitizer reports the first byte read or written past the end.
class Buf {
 public:
  Buf() = default;
  Buf(int64_t bytes, int64_t align) : n_(bytes) {
    size_t a = align < static_cast<int64_t>(sizeof(void*)) ? sizeof(void*) : static_cast<size_t>(align);
    void* p = nullptr;
    if (posix_memalign(&p, a, static_cast<size_t>(bytes)) != 0 || (p == nullptr && bytes > 0)) std::abort();
    p_ = static_cast<uint8_t*>(p);
  }
  ~Buf() { std::free(p_); }
  Buf(Buf&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buf& operator=(Buf&& o) noexcept {
    if (this != &o) {
      std::free(p_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  uint8_t* data() const { return p_; }
  int64_t size() const { return n_; }
  bool allocated() const { return p_ != nullptr || n_ > 0; }
  void fill_byte(uint8_t v) {
    if (n_ > 0) std::memset(p_, v, static_cast<size_t>(n_));
  }
  std::vector<uint8_t> snapshot() const { return n_ > 0 ? std::vector<uint8_t>(p_, p_ + n_) : std::vector<uint8_t>(); }
  bool same(const std::vector<uint8_t>& s) const {
    return static_cast<int64_t>(s.size()) == n_ && (n_ == 0 || std::memcmp(p_, s.data(), s.size()) == 0);
  }

 private:
  uint8_t* p_ = nullptr;
  int64_t n_ = 0;
};

// ---- element types -------------------------------------------------------------------------------

inline int64_t elem_bytes(int32_t dtype) {
  switch (dtype) {
    case LNMLP_DTYPE_F32: return 4;
    case LNMLP_DTYPE_BF16:
    case LNMLP_DTYPE_F16: return 2;
    case LNMLP_DTYPE_U8:
    case LNMLP_DTYPE_FP8_E4M3:
    case LNMLP_DTYPE_FP8_E5M2: return 1;
    default: return 0;
  }
}

// Writes one value in dtype (F32, BF16 or F16) at element i.
inline void store(uint8_t* p, int64_t i, int32_t dtype, float v) {
  if (dtype == LNMLP_DTYPE_F32) {
    std::memcpy(p + 4 * i, &v, 4);
  } else {
    const uint16_t h = dtype == LNMLP_DTYPE_BF16 ? lnmlp_ref::bf16_from_double(v) : lnmlp_ref::f16_from_double(v);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

// Fills n elements of dtype. mode % 4: 0 values k/64, |k| <= 64 (exact in every dtype); 1 the
// stream's next bytes, as many as there are (then the generator's); 2 as 0 with one element in
// eight a special value (NaN, infinities, signed zeros, huge, tiny, subnormal); 3 any bit pattern.
inline void fill(uint8_t* p, int64_t n, int32_t dtype, uint8_t mode, uint32_t seed, Reader& r) {
  if (p == nullptr || n <= 0) return;
  const int64_t e = elem_bytes(dtype);
  Rng g(seed);
  static const float kSpecial[12] = {std::numeric_limits<float>::quiet_NaN(),
                                     -std::numeric_limits<float>::quiet_NaN(),
                                     std::numeric_limits<float>::infinity(),
                                     -std::numeric_limits<float>::infinity(),
                                     0.0f,
                                     -0.0f,
                                     FLT_MAX,
                                     -65504.0f,
                                     1e-40f,
                                     6e-8f,
                                     3e38f,
                                     -1e-30f};
  switch (mode % 4) {
    case 0:
    case 2:
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t z = g.next();
        float v = static_cast<float>(static_cast<int>(z % 129) - 64) / 64.0f;
        if (mode % 4 == 2 && ((z >> 8) & 7) == 0) v = kSpecial[(z >> 12) % 12];
        store(p, i, dtype, v);
      }
      break;
    case 1: {
      const size_t bytes = static_cast<size_t>(n * e);
      const size_t got = r.take(p, bytes);
      for (size_t i = got; i < bytes; ++i) p[i] = static_cast<uint8_t>(g.next());
      break;
    }
    default:
      for (int64_t i = 0; i < n * e; ++i) p[i] = static_cast<uint8_t>(g.next());
      break;
  }
}

}  // namespace fuzz

#endif  // LNMLP_TESTS_FUZZ_FUZZ_COMMON_H
