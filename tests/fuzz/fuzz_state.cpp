// fuzz_state: a small DELAYED-recipe plan (shape, dtype, formats and history length from the first
// four bytes), then a sequence of operations on its FP8 quantizer state from the rest: blob imports
// (raw bytes, mutated exports, crafted blobs), per-quantizer reads and writes, exports, attached
// arrays, forward and backward passes. The harness keeps a model of the state (include/lnmlp.h,
// "FP8 quantizer state" and "The FP8 state as a blob") and checks it after every operation
// (README.md: the byte format and the list of checks).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "fuzz_common.h"
#include "lnmlp.h"

namespace {

using fuzz::Buf;
using fuzz::Reader;

constexpr int kQ = LNMLP_QUANTIZER_COUNT;
constexpr int64_t kHeader = 24;  // magic "LNMLPQS1", int32 version, recipe, history length, quantizers

struct Dims {
  int64_t T, H, F;
};
constexpr Dims kShapes[8] = {{1, 1, 1},   {2, 4, 8},    {4, 8, 4},   {3, 5, 7},
                             {8, 16, 32}, {16, 32, 16}, {5, 33, 17}, {32, 64, 64}};
constexpr int64_t kLongHistories[16] = {1024, 65536, 100, 31, 32, 33, 127, 128, 129, 255, 256, 257, 1000, 4096, 2, 3};
// Delayed scaling's margins: small ones mostly, and the extremes of [-126, 127].
constexpr int32_t kMargins[32] = {-2,  -1,  0,   1,  2,  3,  4,   8,   16,  24,  30,  31,   32,   40,   64,   100,
                                  120, 126, 127, -3, -4, -8, -16, -30, -31, -32, -64, -100, -120, -125, -126, 50};

// A value the state functions accept in a history: >= 0, +inf or NaN (not below zero).
bool valid_amax(float v) { return !(v < 0.0f); }
bool valid_scale(float v) { return std::isfinite(v) && v > 0.0f; }

struct State {
  lnmlp_plan* plan = nullptr;
  Dims d{};
  int32_t dtype = LNMLP_DTYPE_F32, norm = LNMLP_NORM_LAYERNORM, remat = LNMLP_REMAT_SAVE_ALL, algo = 0;
  int32_t bias1 = 0, bias2 = 0;
  int64_t L = 0, need = 0, stride = 0;
  int32_t version = 0;  // the blob version this library writes (read from its first export)
  // The model, as float32 bit patterns: the plan's own state, and the attached array's.
  std::vector<uint32_t> owned, in_attached;
  std::vector<std::unique_ptr<Buf>> arrays;  // every array ever attached, alive until the plan is gone
  Buf* attached = nullptr;                   // the attached one, if any
  std::vector<uint8_t> last_export;          // a valid blob of this plan, for re-import
  int imports_ok = 0, imports_refused = 0, forwards_ok = 0, backwards_ok = 0;  // for LNMLP_FUZZ_VERBOSE

  // The model of the state now: the attached array's, else the plan's own.
  const std::vector<uint32_t>& current() const { return attached != nullptr ? in_attached : owned; }
  void set_current(const std::vector<uint32_t>& v) { (attached != nullptr ? in_attached : owned) = v; }

  std::vector<uint8_t> export_blob() const {
    std::vector<uint8_t> b(static_cast<size_t>(need));
    EXPECT_STATUS(API(lnmlp_plan_export_state(plan, b.data(), need)), LNMLP_SUCCESS);
    return b;
  }
  // The exported blob must be the header's format around the modelled state, exactly.
  void check_export(const char* after) const {
    const std::vector<uint8_t> b = export_blob();
    FUZZ_CHECK(std::memcmp(b.data(), "LNMLPQS1", 8) == 0, "after %s: the blob's magic is not LNMLPQS1", after);
    int32_t h[4];
    std::memcpy(h, b.data() + 8, 16);
    FUZZ_CHECK(h[0] == version && h[1] == LNMLP_RECIPE_DELAYED && h[2] == L && h[3] == kQ,
               "after %s: blob header version %d recipe %d history %d quantizers %d (expected %d, 1, %lld, 6)", after,
               h[0], h[1], h[2], h[3], version, static_cast<long long>(L));
    const std::vector<uint32_t> want = current();
    for (size_t i = 0; i < want.size(); ++i) {
      uint32_t got;
      std::memcpy(&got, b.data() + kHeader + 4 * i, 4);
      FUZZ_CHECK(got == want[i], "after %s: state float %zu (quantizer %zu, %s) is 0x%08x, the model says 0x%08x",
                 after, i, i / static_cast<size_t>(stride), i % static_cast<size_t>(stride) == 0 ? "scale" : "history",
                 got, want[i]);
    }
  }
  void resync() {
    const std::vector<uint8_t> b = export_blob();
    std::vector<uint32_t> v(static_cast<size_t>(kQ * stride));
    std::memcpy(v.data(), b.data() + kHeader, v.size() * 4);
    set_current(v);
  }
};

// Values of a history or state from the bytes: the first few picked one by one, the rest by a rule.
void fill_history(Reader& r, float* h, int64_t n) {
  const uint8_t rule = r.u8();
  for (int64_t i = 0; i < n; ++i) {
    if (i < 4) {
      h[i] = r.pick_float();
      continue;
    }
    switch (rule % 4) {
      case 0: h[i] = 0.0f; break;
      case 1: h[i] = h[i % 4]; break;
      case 2: h[i] = static_cast<float>(i); break;
      default: h[i] = std::numeric_limits<float>::infinity(); break;
    }
  }
}

// What the header says an import of `blob` must do: 1 succeed, 0 fail, -1 either (a longer blob).
int import_verdict(const State& s, const uint8_t* blob, int64_t n) {
  if (blob == nullptr || n < kHeader) return 0;
  int32_t h[4];
  std::memcpy(h, blob + 8, 16);
  if (std::memcmp(blob, "LNMLPQS1", 8) != 0 || h[0] != s.version || h[1] != LNMLP_RECIPE_DELAYED || h[2] != s.L ||
      h[3] != kQ)
    return 0;
  if (n < s.need) return 0;
  for (int64_t q = 0; q < kQ; ++q) {
    for (int64_t i = 0; i < s.stride; ++i) {
      float v;
      std::memcpy(&v, blob + kHeader + 4 * (q * s.stride + i), 4);
      if (i == 0 ? !valid_scale(v) : !valid_amax(v)) return 0;
    }
  }
  return n == s.need ? 1 : -1;
}

void do_import(State& s, const uint8_t* blob, int64_t n, const char* what) {
  const int verdict = import_verdict(s, blob, n);
  const std::vector<uint8_t> before = s.export_blob();
  const std::vector<uint8_t> input = blob && n > 0 ? std::vector<uint8_t>(blob, blob + n) : std::vector<uint8_t>();
  const int32_t st = API(lnmlp_plan_import_state(s.plan, blob, n));
  if (blob && n > 0) FUZZ_CHECK(std::memcmp(input.data(), blob, input.size()) == 0, "import (%s) wrote its blob", what);
  if (verdict == 1)
    FUZZ_CHECK(st == LNMLP_SUCCESS, "import (%s) of a valid blob failed: %s", what, lnmlp_status_string(st));
  if (verdict == 0) FUZZ_CHECK(st != LNMLP_SUCCESS, "import (%s) of a blob the header says is invalid succeeded", what);
  if (st != LNMLP_SUCCESS) {
    FUZZ_CHECK(fuzz::is_argument_error(st), "import (%s) failed with %s", what, lnmlp_status_string(st));
    FUZZ_CHECK(s.export_blob() == before, "a failed import (%s) changed the state (export before != after)", what);
    ++s.imports_refused;
    return;
  }
  // Round trip: the state is now the blob's, bit for bit, and exports as the same bytes.
  ++s.imports_ok;
  std::vector<uint32_t> v(static_cast<size_t>(kQ * s.stride));
  std::memcpy(v.data(), blob + kHeader, v.size() * 4);
  s.set_current(v);
  const std::vector<uint8_t> after = s.export_blob();
  FUZZ_CHECK(std::equal(after.begin(), after.end(), blob),
             "export after a successful import (%s) differs from the blob", what);
}

// ---- forward and backward ------------------------------------------------------------------------

struct Tensors {
  std::vector<Buf> in;  // x, gamma, beta, w1, b1, w2, b2, dy
  Buf y, saved, dx, dgamma, dbeta, dw1, db1, dw2, db2;
};

Buf tensor(lnmlp_plan* plan, int32_t t, int64_t tokens, Reader* r) {
  int64_t rank = 0, dims[3] = {0, 0, 0};
  int32_t dtype = 0;
  EXPECT_STATUS(API(lnmlp_plan_get_tensor_shape(plan, t, tokens, &rank, dims, &dtype)), LNMLP_SUCCESS);
  if (rank < 0) return Buf();
  int64_t n = 1;
  for (int64_t i = 0; i < rank; ++i) n *= dims[i];
  Buf b(n * fuzz::elem_bytes(dtype), 64);
  if (r != nullptr) {
    const uint8_t mode = r->u8();
    fuzz::fill(b.data(), n, dtype, mode, r->u32(), *r);
  } else {
    b.fill_byte(0xA5);
  }
  return b;
}

uint8_t* p(Buf& b) { return b.allocated() ? b.data() : nullptr; }

// Checks a pass's effect on the state: the quantizers of the other direction kept theirs; each
// updated one has its history shifted by one (the newest entry first); a scale stays when the
// amax it is updated from is 0, infinite or NaN; and the state stays one that import accepts.
void check_pass(const State& s, const std::vector<uint32_t>& before, const std::vector<uint32_t>& after, bool forward,
                int64_t tokens) {
  for (int q = 0; q < kQ; ++q) {
    const bool updated = tokens > 0 && (forward ? q <= LNMLP_QUANTIZER_W2 : q >= LNMLP_QUANTIZER_DY);
    const uint32_t* b = before.data() + q * s.stride;
    const uint32_t* a = after.data() + q * s.stride;
    if (!updated) {
      FUZZ_CHECK(std::equal(b, b + s.stride, a), "a %s pass with %lld tokens changed quantizer %d",
                 forward ? "forward" : "backward", static_cast<long long>(tokens), q);
      continue;
    }
    for (int64_t i = 2; i < s.stride; ++i)
      FUZZ_CHECK(a[i] == b[i - 1], "quantizer %d: history entry %lld is not the previous entry %lld after a pass", q,
                 static_cast<long long>(i - 1), static_cast<long long>(i - 2));
    const float newest = lnmlp_test::from_bits(a[1]);
    FUZZ_CHECK(valid_amax(newest), "quantizer %d recorded amax %g", q, newest);
    bool keeps = false;
    if (s.algo == LNMLP_AMAX_ALGO_MOST_RECENT) {
      keeps = newest == 0.0f || !std::isfinite(newest);
    } else {
      keeps = true;  // the largest entry: 0 when every entry is 0
      for (int64_t i = 1; i < s.stride; ++i) keeps = keeps && lnmlp_test::from_bits(a[i]) == 0.0f;
    }
    if (keeps) FUZZ_CHECK(a[0] == b[0], "quantizer %d: the scale changed although its amax is 0, inf or NaN", q);
    FUZZ_CHECK(valid_scale(lnmlp_test::from_bits(a[0])), "quantizer %d: a pass left scale %g (not finite and > 0)", q,
               lnmlp_test::from_bits(a[0]));
  }
}

void run_pass(State& s, Reader& r) {
  const int64_t tokens = r.u8() % (s.d.T + 1);
  const uint8_t state_mode = r.u8() % 3;
  const bool do_backward = (r.u8() & 1) != 0 && s.remat != LNMLP_REMAT_FORWARD_ONLY;
  // fp8_state: NULL (the plan's), a caller array for this call (the plan's stays), or the attached one.
  Buf caller;
  float* fp8 = nullptr;
  if (state_mode == 1) {
    caller = Buf(kQ * s.stride * 4, 16);
    auto* f = reinterpret_cast<float*>(caller.data());
    for (int q = 0; q < kQ; ++q) {
      f[q * s.stride] = std::ldexp(1.0f, static_cast<int>(r.u8() % 21) - 10);
      for (int64_t i = 1; i < s.stride; ++i) f[q * s.stride + i] = static_cast<float>(r.u8() % 8);
    }
    fp8 = f;
  } else if (state_mode == 2 && s.attached != nullptr) {
    fp8 = reinterpret_cast<float*>(s.attached->data());
  }
  Tensors t;
  for (int32_t id : {LNMLP_TENSOR_X, LNMLP_TENSOR_GAMMA, LNMLP_TENSOR_BETA, LNMLP_TENSOR_W1, LNMLP_TENSOR_B1,
                     LNMLP_TENSOR_W2, LNMLP_TENSOR_B2, LNMLP_TENSOR_DY})
    t.in.push_back(tensor(s.plan, id, tokens, &r));
  t.y = tensor(s.plan, LNMLP_TENSOR_Y, tokens, nullptr);
  t.saved = tensor(s.plan, LNMLP_TENSOR_SAVED, tokens, nullptr);

  const std::vector<uint32_t> before = s.current();
  const std::vector<uint8_t> caller_before = caller.snapshot();
  const int32_t flags = r.u8() & 1;
  int32_t st = API(lnmlp_plan_forward(s.plan, tokens, p(t.in[0]), p(t.in[1]), p(t.in[2]), p(t.in[3]), p(t.in[4]),
                                      p(t.in[5]), p(t.in[6]), p(t.y), p(t.saved), fp8, flags, nullptr));
  if (st != LNMLP_SUCCESS) {
    if (fuzz::verbose()) std::fprintf(stderr, "[fuzz_state] forward failed: %s\n", lnmlp_last_error());
    s.check_export("a failed forward");
    return;
  }
  const bool own = fp8 == nullptr || (s.attached != nullptr && fp8 == reinterpret_cast<float*>(s.attached->data()));
  ++s.forwards_ok;
  if (own) {
    s.resync();
    check_pass(s, before, s.current(), true, tokens);
  } else {
    s.check_export("a forward with a caller's state array");  // the plan's own state did not change
    std::vector<uint32_t> cb(before.size()), ca(before.size());
    std::memcpy(cb.data(), caller_before.data(), cb.size() * 4);
    std::memcpy(ca.data(), caller.data(), ca.size() * 4);
    check_pass(s, cb, ca, true, tokens);
  }
  if (!do_backward) return;

  t.dx = tensor(s.plan, LNMLP_TENSOR_DX, tokens, nullptr);
  t.dgamma = tensor(s.plan, LNMLP_TENSOR_DGAMMA, tokens, nullptr);
  t.dbeta = tensor(s.plan, LNMLP_TENSOR_DBETA, tokens, nullptr);
  t.dw1 = tensor(s.plan, LNMLP_TENSOR_DW1, tokens, nullptr);
  t.db1 = tensor(s.plan, LNMLP_TENSOR_DB1, tokens, nullptr);
  t.dw2 = tensor(s.plan, LNMLP_TENSOR_DW2, tokens, nullptr);
  t.db2 = tensor(s.plan, LNMLP_TENSOR_DB2, tokens, nullptr);
  const std::vector<uint32_t> before_b = own ? s.current() : std::vector<uint32_t>();
  std::vector<uint32_t> caller_b(own ? 0 : before.size());
  if (!own) std::memcpy(caller_b.data(), caller.data(), caller_b.size() * 4);
  st = API(lnmlp_plan_backward(s.plan, tokens, p(t.in[7]), p(t.in[0]), p(t.in[1]), p(t.in[2]), p(t.in[3]), p(t.in[4]),
                               p(t.in[5]), p(t.saved), p(t.dx), p(t.dgamma), p(t.dbeta), p(t.dw1), p(t.db1), p(t.dw2),
                               p(t.db2), fp8, flags, nullptr));
  if (st != LNMLP_SUCCESS) {
    if (fuzz::verbose()) std::fprintf(stderr, "[fuzz_state] backward failed: %s\n", lnmlp_last_error());
    s.check_export("a failed backward");
    return;
  }
  ++s.backwards_ok;
  if (own) {
    s.resync();
    check_pass(s, before_b, s.current(), false, tokens);
  } else {
    s.check_export("a backward with a caller's state array");
    std::vector<uint32_t> ca(caller_b.size());
    std::memcpy(ca.data(), caller.data(), ca.size() * 4);
    check_pass(s, caller_b, ca, false, tokens);
  }
}

// ---- the operations ------------------------------------------------------------------------------

void op_import_raw(State& s, Reader& r) {
  const int64_t len = r.u16() % 4096;
  Buf blob(len, 8);
  const size_t got = r.take(blob.data(), static_cast<size_t>(len));
  if (static_cast<int64_t>(got) < len) std::memset(blob.data() + got, 0, static_cast<size_t>(len) - got);
  const uint8_t t = r.u8();
  if (t == 0xFF) {
    do_import(s, nullptr, len, "NULL blob");
  } else if (t >= 0xF8) {
    const int64_t bad[7] = {-1, -24, std::numeric_limits<int64_t>::min(), 0, 1, 23, kHeader};
    do_import(s, blob.data(), std::min(bad[t - 0xF8], len), "a short or negative size");
  } else {
    do_import(s, blob.data(), len, "raw bytes");
  }
}

void op_import_mutated(State& s, Reader& r) {
  std::vector<uint8_t> b = s.export_blob();
  const int k = 1 + r.u8() % 4;
  for (int i = 0; i < k; ++i) {
    const size_t pos = r.u16() % b.size();
    b[pos] ^= r.u8();
  }
  const uint8_t t = r.u8();
  int64_t n = static_cast<int64_t>(b.size());
  if (t >= 0xF0) n = std::max<int64_t>(0, n + static_cast<int64_t>(t) - 0xF7);  // -7 .. +8 bytes
  Buf blob(n, 8);
  if (n > 0) {
    std::memset(blob.data(), 0, static_cast<size_t>(n));
    std::memcpy(blob.data(), b.data(), std::min<size_t>(b.size(), static_cast<size_t>(n)));
  }
  do_import(s, blob.data(), n, "a mutated export");
}

void op_import_crafted(State& s, Reader& r) {
  Buf blob(s.need, 8);
  uint8_t* b = blob.data();
  std::memcpy(b, "LNMLPQS1", 8);
  const uint8_t flags = r.u8();
  if (flags & 1) b[r.u8() % 8] ^= static_cast<uint8_t>(1 + r.u8() % 255);
  const int32_t h[4] = {
      (flags & 2) ? r.pick32(s.version, s.version) : s.version, (flags & 4) ? r.pick32(0, 4) : LNMLP_RECIPE_DELAYED,
      (flags & 8) ? r.pick32(static_cast<int32_t>(s.L), static_cast<int32_t>(s.L)) : static_cast<int32_t>(s.L),
      (flags & 16) ? r.pick32(5, 7) : kQ};
  std::memcpy(b + 8, h, 16);
  auto* f = reinterpret_cast<float*>(b + kHeader);
  for (int q = 0; q < kQ; ++q) {
    f[q * s.stride] = (flags & 32) ? r.pick_float() : std::ldexp(1.0f, static_cast<int>(r.u8() % 61) - 30);
    fill_history(r, f + q * s.stride + 1, s.L);
  }
  do_import(s, b, s.need, "a crafted blob");
}

void op_set_quantizer(State& s, Reader& r) {
  const int32_t q = r.pick32(0, kQ - 1);
  const float scale = r.pick_float();
  const int64_t len = r.pick(s.L, s.L);
  const bool null_history = (r.u8() & 15) == 15;
  // Exactly the plan's length: a read of a longer `len` is an AddressSanitizer report.
  Buf hist(s.L * 4, 4);
  auto* h = reinterpret_cast<float*>(hist.data());
  fill_history(r, h, s.L);
  const std::vector<uint8_t> before = s.export_blob();
  const int32_t st = API(lnmlp_plan_set_quantizer_state(s.plan, q, scale, null_history ? nullptr : h, len));
  bool ok = q >= 0 && q < kQ && !null_history && len == s.L && valid_scale(scale);
  for (int64_t i = 0; ok && i < s.L; ++i) ok = valid_amax(h[i]);
  if (ok) FUZZ_CHECK(st == LNMLP_SUCCESS, "set_quantizer_state with valid values failed: %s", lnmlp_status_string(st));
  else
    FUZZ_CHECK(st != LNMLP_SUCCESS, "set_quantizer_state accepted invalid values (q %d, scale %g, length %lld)", q,
               scale, static_cast<long long>(len));
  if (st != LNMLP_SUCCESS) {
    FUZZ_CHECK(s.export_blob() == before, "a failed set_quantizer_state changed the state");
    return;
  }
  std::vector<uint32_t> v = s.current();
  v[static_cast<size_t>(q * s.stride)] = lnmlp_test::to_bits(scale);
  std::memcpy(v.data() + q * s.stride + 1, h, static_cast<size_t>(s.L) * 4);
  s.set_current(v);
  // Read back, bit for bit.
  float got_scale = 0.0f;
  Buf got(s.L * 4, 4);
  EXPECT_STATUS(API(lnmlp_plan_get_quantizer_state(s.plan, q, &got_scale, reinterpret_cast<float*>(got.data()), s.L)),
                LNMLP_SUCCESS);
  FUZZ_CHECK(lnmlp_test::to_bits(got_scale) == lnmlp_test::to_bits(scale) && std::memcmp(got.data(), h, s.L * 4) == 0,
             "get_quantizer_state does not return what set_quantizer_state set");
}

void op_get_quantizer(State& s, Reader& r) {
  const int32_t q = r.pick32(0, kQ - 1);
  const int64_t len = r.pick(s.L, s.L);
  const uint8_t t = r.u8();
  const bool null_scale = (t & 15) == 15, null_history = (t & 0xF0) == 0xF0;
  float scale = -3.0f;
  Buf hist(s.L * 4, 4);
  hist.fill_byte(0xEE);
  const std::vector<uint8_t> hist_before = hist.snapshot();
  const int32_t st = API(lnmlp_plan_get_quantizer_state(
      s.plan, q, null_scale ? nullptr : &scale, null_history ? nullptr : reinterpret_cast<float*>(hist.data()), len));
  const bool ok = q >= 0 && q < kQ && !null_scale && (null_history || len == s.L);
  if (ok) FUZZ_CHECK(st == LNMLP_SUCCESS, "get_quantizer_state with valid arguments failed");
  else FUZZ_CHECK(st != LNMLP_SUCCESS, "get_quantizer_state with invalid arguments succeeded");
  if (st != LNMLP_SUCCESS) {
    FUZZ_CHECK(scale == -3.0f && hist.same(hist_before), "a failed get_quantizer_state wrote its outputs");
    return;
  }
  const std::vector<uint32_t> v = s.current();
  FUZZ_CHECK(lnmlp_test::to_bits(scale) == v[static_cast<size_t>(q * s.stride)], "get_quantizer_state: scale differs");
  if (!null_history)
    FUZZ_CHECK(std::memcmp(hist.data(), v.data() + q * s.stride + 1, s.L * 4) == 0,
               "get_quantizer_state: history differs from the export's");
}

void op_export(State& s, Reader& r) {
  const int64_t n = r.pick(s.need, s.need);
  const bool null_blob = (r.u8() & 31) == 31;
  if (n > s.need + 4096) return;  // never claim more bytes than the buffer has
  Buf blob(std::max<int64_t>(n, 0), 8);
  blob.fill_byte(0x3C);
  const std::vector<uint8_t> before = blob.snapshot();
  const int32_t st = API(lnmlp_plan_export_state(s.plan, null_blob ? nullptr : blob.data(), n));
  const bool ok = !null_blob && n >= s.need;
  if (ok)
    FUZZ_CHECK(st == LNMLP_SUCCESS, "export into %lld bytes (needs %lld) failed", static_cast<long long>(n),
               static_cast<long long>(s.need));
  else
    FUZZ_CHECK(st != LNMLP_SUCCESS, "export into %lld bytes (needs %lld, blob %s) succeeded", static_cast<long long>(n),
               static_cast<long long>(s.need), null_blob ? "NULL" : "given");
  if (st != LNMLP_SUCCESS) {
    FUZZ_CHECK(blob.same(before), "a failed export wrote its blob");
    return;
  }
  FUZZ_CHECK(std::memcmp(blob.data(), s.export_blob().data(), static_cast<size_t>(s.need)) == 0,
             "two exports of the same state differ");
  s.last_export.assign(blob.data(), blob.data() + s.need);
}

void op_attach(State& s, Reader& r) {
  const uint8_t mode = r.u8() % 4;
  if (mode == 2) {  // detach: the plan's own state again, as it was
    EXPECT_STATUS(API(lnmlp_plan_attach_fp8_state(s.plan, nullptr)), LNMLP_SUCCESS);
    s.attached = nullptr;
    return;
  }
  auto array = std::make_unique<Buf>(kQ * s.stride * 4 + 4, 16);
  auto* f = reinterpret_cast<float*>(array->data());
  if (mode == 0) {
    const std::vector<uint32_t> v = s.current();
    std::memcpy(f, v.data(), v.size() * 4);
  } else {
    for (int q = 0; q < kQ; ++q) {
      f[q * s.stride] = std::ldexp(1.0f, static_cast<int>(r.u8() % 41) - 20);
      for (int64_t i = 1; i < s.stride; ++i) f[q * s.stride + i] = static_cast<float>(r.u8() % 16);
    }
  }
  if (mode == 3) {  // misaligned for float: refused, nothing changes
    const std::vector<uint8_t> before = s.export_blob();
    EXPECT_STATUS(API(lnmlp_plan_attach_fp8_state(s.plan, array->data() + 1)), LNMLP_ERROR_MISALIGNED);
    FUZZ_CHECK(s.export_blob() == before, "a failed attach_fp8_state changed the state");
    return;
  }
  EXPECT_STATUS(API(lnmlp_plan_attach_fp8_state(s.plan, f)), LNMLP_SUCCESS);
  s.attached = array.get();
  s.in_attached.assign(static_cast<size_t>(kQ * s.stride), 0u);
  std::memcpy(s.in_attached.data(), f, s.in_attached.size() * 4);
  s.arrays.push_back(std::move(array));
}

void op_second_plan(State& s) {
  // A plan of another history length and one of another recipe refuse this plan's blob.
  lnmlp_desc* desc = nullptr;
  EXPECT_STATUS(API(lnmlp_desc_create(&desc)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_shape(desc, s.d.T, s.d.H, s.d.F)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_recipe(desc, LNMLP_RECIPE_DELAYED)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_delayed_scaling(desc, 0, s.L == 1 ? 2 : s.L - 1, 0)), LNMLP_SUCCESS);
  const std::vector<uint8_t> mine = s.export_blob();
  lnmlp_plan* other = nullptr;
  EXPECT_STATUS(API(lnmlp_plan_create(desc, &other)), LNMLP_SUCCESS);
  FUZZ_CHECK(API(lnmlp_plan_import_state(other, mine.data(), static_cast<int64_t>(mine.size()))) != LNMLP_SUCCESS,
             "a plan with another history length imported this plan's blob");
  int64_t n = 0;
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(other, &n)), LNMLP_SUCCESS);
  std::vector<uint8_t> theirs(static_cast<size_t>(n));
  EXPECT_STATUS(API(lnmlp_plan_export_state(other, theirs.data(), n)), LNMLP_SUCCESS);
  do_import(s, theirs.data(), n, "another plan's blob");
  EXPECT_STATUS(API(lnmlp_plan_destroy(other)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_recipe(desc, LNMLP_RECIPE_CURRENT)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_create(desc, &other)), LNMLP_SUCCESS);
  FUZZ_CHECK(API(lnmlp_plan_import_state(other, mine.data(), static_cast<int64_t>(mine.size()))) != LNMLP_SUCCESS,
             "a CURRENT plan imported a DELAYED plan's blob");
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(other, &n)), LNMLP_SUCCESS);
  FUZZ_CHECK(n == 0, "a stateless plan has %lld state bytes", static_cast<long long>(n));
  float scale = 0.0f;
  FUZZ_CHECK(API(lnmlp_plan_get_quantizer_state(other, 0, &scale, nullptr, 0)) == LNMLP_ERROR_INVALID_ARGUMENT,
             "a stateless plan answered get_quantizer_state");
  EXPECT_STATUS(API(lnmlp_plan_destroy(other)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_destroy(desc)), LNMLP_SUCCESS);
}

bool make_plan(State& s, Reader& r) {
  const uint8_t b0 = r.u8(), b1 = r.u8(), b2 = r.u8(), b3 = r.u8();
  s.d = kShapes[b0 % 8];
  s.dtype = b1 % 3;
  s.norm = (b1 >> 2) & 1;
  s.remat = (b1 >> 3) % 4;
  s.bias1 = (b1 >> 5) & 1;
  s.bias2 = (b1 >> 6) & 1;
  const int32_t format = b2 % 3 - 1;
  s.algo = (b2 >> 2) & 1;
  const int32_t margin = kMargins[b2 >> 3];
  s.L = b3 < 0xF0 ? 1 + b3 % 16 : kLongHistories[b3 - 0xF0];

  lnmlp_desc* desc = nullptr;
  EXPECT_STATUS(API(lnmlp_desc_create(&desc)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_shape(desc, s.d.T, s.d.H, s.d.F)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_dtype(desc, s.dtype)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_norm(desc, s.norm)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_remat(desc, s.remat)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_bias(desc, s.bias1, s.bias2)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_num_threads(desc, 1)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_recipe(desc, LNMLP_RECIPE_DELAYED)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_fp8_format(desc, format)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_desc_set_delayed_scaling(desc, margin, s.L, s.algo)), LNMLP_SUCCESS);
  const int32_t st = API(lnmlp_plan_create(desc, &s.plan));
  EXPECT_STATUS(API(lnmlp_desc_destroy(desc)), LNMLP_SUCCESS);
  if (st != LNMLP_SUCCESS) {
    if (fuzz::verbose()) std::fprintf(stderr, "[fuzz_state] plan_create refused: %s\n", lnmlp_last_error());
    return false;
  }
  s.stride = 1 + s.L;
  int64_t hist = -1;
  EXPECT_STATUS(API(lnmlp_plan_get_amax_history_length(s.plan, &hist)), LNMLP_SUCCESS);
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(s.plan, &s.need)), LNMLP_SUCCESS);
  FUZZ_CHECK(hist == s.L && s.need == kHeader + kQ * s.stride * 4, "history %lld, state bytes %lld for length %lld",
             static_cast<long long>(hist), static_cast<long long>(s.need), static_cast<long long>(s.L));
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(s.plan, nullptr)), LNMLP_ERROR_NULL_POINTER);
  // A fresh state: every scale 1, every history entry 0.
  s.owned.assign(static_cast<size_t>(kQ * s.stride), 0u);
  for (int q = 0; q < kQ; ++q) s.owned[static_cast<size_t>(q * s.stride)] = lnmlp_test::to_bits(1.0f);
  const std::vector<uint8_t> first = s.export_blob();
  std::memcpy(&s.version, first.data() + 8, 4);
  s.check_export("plan creation");
  s.last_export = first;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Reader r(data, size);
  State s;
  if (!make_plan(s, r)) return 0;
  bool second_done = false;
  for (int ops = 0; r.left() > 0 && ops < 48; ++ops) {
    switch (r.u8() % 10) {
      case 0: op_import_raw(s, r); break;
      case 1: op_import_mutated(s, r); break;
      case 2: op_import_crafted(s, r); break;
      case 3: op_set_quantizer(s, r); break;
      case 4: op_get_quantizer(s, r); break;
      case 5: op_export(s, r); break;
      case 6: op_attach(s, r); break;
      case 7: run_pass(s, r); break;
      case 8: do_import(s, s.last_export.data(), s.need, "an earlier export"); break;
      default:
        if (!second_done) op_second_plan(s);
        second_done = true;
        break;
    }
    s.check_export("an operation");
    // Whatever the operations did, the state is one its own import accepts.
    const std::vector<uint8_t> now = s.export_blob();
    FUZZ_CHECK(import_verdict(s, now.data(), s.need) == 1, "the plan's state exports as a blob import must refuse");
  }
  if (fuzz::verbose())
    std::fprintf(stderr, "[fuzz_state] history %lld: %d imports ok, %d refused, %d forwards, %d backwards\n",
                 static_cast<long long>(s.L), s.imports_ok, s.imports_refused, s.forwards_ok, s.backwards_ok);
  EXPECT_STATUS(API(lnmlp_plan_destroy(s.plan)), LNMLP_SUCCESS);
  int64_t n = 0;
  EXPECT_STATUS(API(lnmlp_plan_get_state_bytes(s.plan, &n)), LNMLP_ERROR_INVALID_HANDLE);
  EXPECT_STATUS(API(lnmlp_plan_import_state(s.plan, s.last_export.data(), s.need)), LNMLP_ERROR_INVALID_HANDLE);
  return 0;
}
