// Helpers of the numerics tests: seeded random inputs, dtype conversions written independently of
// the library (our own bf16 round-to-nearest-even; the compiler's _Float16 for f16), running a plan
// through the public C API, and comparing tensors with the worst element named on failure.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtype_convert.h"
#include "lnmlp.h"
#include "reference.h"
#include "tolerances.h"

namespace lnmlp_test {

using lnmlp_ref::bf16_from_double;
using lnmlp_ref::bf16_to_double;
using lnmlp_ref::f16_from_double;
using lnmlp_ref::f16_to_double;

// ---------------------------------------------------------------------------------------------
// Random numbers: a fixed-algorithm generator (mt19937_64 is specified bit for bit by the
// standard) and our own mapping to doubles, so inputs are the same on every platform.
// ---------------------------------------------------------------------------------------------
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_(seed) {}
  double uniform() { return static_cast<double>(g_() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  std::vector<double> uniform_vec(size_t n, double lo, double hi) {
    std::vector<double> v(n);
    for (auto& e : v) e = uniform(lo, hi);
    return v;
  }

 private:
  std::mt19937_64 g_;
};

// FNV-1a, for deriving a stable seed from a test's name.
inline uint64_t hash_name(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// gtest's test-name generator for parameters that name themselves (a name() method).
struct NamedParam {
  template <typename P> std::string operator()(const ::testing::TestParamInfo<P>& info) const {
    return info.param.name();
  }
};

// The two activation choices most tests cover: a gated pair (SwiGLU's silu * linear) or gelu.
inline std::vector<int> swiglu_or_gelu(bool gated) {
  return gated ? std::vector<int>{LNMLP_ACT_SILU, LNMLP_ACT_LINEAR} : std::vector<int>{LNMLP_ACT_GELU};
}

// ---------------------------------------------------------------------------------------------
// dtype conversions (independent of src/numerics).
// ---------------------------------------------------------------------------------------------
inline int64_t dtype_size(int32_t dtype) { return dtype == LNMLP_DTYPE_F32 ? 4 : 2; }

// The most tokens a call of the plan may take (this rank's rows under sequence parallelism); -1
// for an invalid handle.
inline int64_t plan_tokens(const lnmlp_plan* plan) {
  int64_t rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {0, 0, 0};
  int32_t dtype = 0;
  if (lnmlp_plan_get_tensor_shape(plan, LNMLP_TENSOR_X, LNMLP_TOKENS_MAX, &rank, dims, &dtype) != LNMLP_SUCCESS)
    return -1;
  return dims[0];
}

inline const char* dtype_label(int32_t dtype) {
  return dtype == LNMLP_DTYPE_F32 ? "f32" : dtype == LNMLP_DTYPE_BF16 ? "bf16" : "f16";
}

inline double round_to_dtype(double v, int32_t dtype) {
  switch (dtype) {
    case LNMLP_DTYPE_BF16: return bf16_to_double(bf16_from_double(v));
    case LNMLP_DTYPE_F16: return f16_to_double(f16_from_double(v));
    default: return static_cast<double>(static_cast<float>(v));
  }
}

// A tensor in the plan's dtype, as raw bytes.
struct Buffer {
  int32_t dtype = LNMLP_DTYPE_F32;
  std::vector<unsigned char> bytes;

  Buffer() = default;
  Buffer(int32_t dt, size_t n) : dtype(dt), bytes(n * static_cast<size_t>(dtype_size(dt))) {}

  size_t size() const { return bytes.size() / static_cast<size_t>(dtype_size(dtype)); }
  bool empty() const { return bytes.empty(); }
  void* data() { return bytes.empty() ? nullptr : bytes.data(); }
  const void* data() const { return bytes.empty() ? nullptr : bytes.data(); }

  // Stores v rounded to the dtype.
  static Buffer from(const std::vector<double>& v, int32_t dt) {
    Buffer b(dt, v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == LNMLP_DTYPE_F32) {
        const float f = static_cast<float>(v[i]);
        std::memcpy(b.bytes.data() + 4 * i, &f, 4);
      } else {
        const uint16_t h = dt == LNMLP_DTYPE_BF16 ? bf16_from_double(v[i]) : f16_from_double(v[i]);
        std::memcpy(b.bytes.data() + 2 * i, &h, 2);
      }
    }
    return b;
  }

  std::vector<double> to_doubles() const {
    std::vector<double> v(size());
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype == LNMLP_DTYPE_F32) {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        v[i] = f;
      } else {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        v[i] = dtype == LNMLP_DTYPE_BF16 ? bf16_to_double(h) : f16_to_double(h);
      }
    }
    return v;
  }

  // The buffer as a [rows, cols] matrix, transposed into [cols, rows].
  Buffer transposed(size_t rows, size_t cols) const {
    Buffer t(dtype, rows * cols);
    const size_t es = static_cast<size_t>(dtype_size(dtype));
    for (size_t r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) std::memcpy(&t.bytes[(c * rows + r) * es], &bytes[(r * cols + c) * es], es);
    return t;
  }

  // Poisons the buffer (all bytes 0xFF: a NaN in every dtype), so an element the library forgets
  // to write cannot pass a comparison.
  void poison() { std::fill(bytes.begin(), bytes.end(), static_cast<unsigned char>(0xFF)); }
};

// Memory with a given alignment (saved buffers, external workspace).
struct AlignedMemory {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> ptr;
  int64_t bytes = 0;

  AlignedMemory() = default;
  AlignedMemory(int64_t n, int64_t align, unsigned char fill) : bytes(n) {
    if (n <= 0) return;
    const int64_t a = align < 64 ? 64 : align;
    const size_t rounded = static_cast<size_t>((n + a - 1) / a * a);
    ptr.reset(std::aligned_alloc(static_cast<size_t>(a), rounded));
    if (!ptr) throw std::bad_alloc();
    std::memset(ptr.get(), fill, rounded);
  }
  void* get() const { return ptr.get(); }
};

// ---------------------------------------------------------------------------------------------
// The weight layout (lnmlp_desc_set_weight_layout) the tests run under: LNMLP_TEST_WEIGHT_LAYOUT=
// out_in gives every plan of a suite out x in weights (W1 [A*F, H], W2 [H, F]), and CTest runs the
// numerics, FP8, call, sharding and emulated CUDA suites that way too. The reference and every
// comparison keep the in x out layout: a problem's weight buffers are converted into the layout,
// and run_library converts dW1 and dW2 back.
// ---------------------------------------------------------------------------------------------
inline int32_t weight_layout_under_test() {
  const char* v = std::getenv("LNMLP_TEST_WEIGHT_LAYOUT");
  return v != nullptr && std::string(v) == "out_in" ? LNMLP_WEIGHT_LAYOUT_OUT_IN : LNMLP_WEIGHT_LAYOUT_IN_OUT;
}

// A weight (or its gradient) of `in` x `out` features, [in, out], in `layout`; and back.
inline Buffer weight_in_layout(const Buffer& in_out, size_t in, size_t out, int32_t layout) {
  return layout == LNMLP_WEIGHT_LAYOUT_OUT_IN ? in_out.transposed(in, out) : in_out;
}
inline Buffer weight_in_out(const Buffer& b, size_t in, size_t out, int32_t layout) {
  return layout == LNMLP_WEIGHT_LAYOUT_OUT_IN ? b.transposed(out, in) : b;
}

// ---------------------------------------------------------------------------------------------
// A problem: the configuration, and inputs rounded to the dtype, as bits (for the library) and as
// the same values in double (for the reference).
// ---------------------------------------------------------------------------------------------
struct Problem {
  lnmlp_ref::Config cfg;
  int32_t dtype = LNMLP_DTYPE_F32;
  std::vector<double> x, dy;
  lnmlp_ref::Params p;
  Buffer bx, bdy, bgamma, bbeta, bw1, bb1, bw2, bb2;  // empty when absent; bw1, bw2 in weight_layout
  int32_t weight_layout = LNMLP_WEIGHT_LAYOUT_IN_OUT;

  size_t H() const { return static_cast<size_t>(cfg.hidden); }
  size_t F() const { return static_cast<size_t>(cfg.ffn); }
  size_t AF() const { return cfg.acts.size() * F(); }
};

// bw1 and bw2 from the doubles p.w1 [H, A*F] and p.w2 [F, H], in `dtype` and the problem's layout.
inline void set_weights(Problem& pr, int32_t dtype) {
  pr.bw1 = weight_in_layout(Buffer::from(pr.p.w1, dtype), pr.H(), pr.AF(), pr.weight_layout);
  pr.bw2 = weight_in_layout(Buffer::from(pr.p.w2, dtype), pr.F(), pr.H(), pr.weight_layout);
}

// pr with `from`'s parameters: another micro-batch (pr's x, dy) of the same weights.
inline Problem with_parameters(Problem pr, const Problem& from) {
  pr.p = from.p;
  pr.bgamma = from.bgamma;
  pr.bbeta = from.bbeta;
  pr.bw1 = from.bw1;
  pr.bb1 = from.bb1;
  pr.bw2 = from.bw2;
  pr.bb2 = from.bb2;
  return pr;
}

struct InputScales {
  double h_std = 1.5;  // the standard deviation GEMM1's output gets (roughly): how far into the activations
};

inline std::vector<double> rounded(std::vector<double> v, int32_t dtype) {
  for (auto& e : v) e = round_to_dtype(e, dtype);
  return v;
}

inline Problem make_problem(const lnmlp_ref::Config& cfg, int32_t dtype, uint64_t seed, InputScales s = {}) {
  Problem pr;
  pr.cfg = cfg;
  pr.dtype = dtype;
  Rng rng(seed);
  const size_t T = static_cast<size_t>(cfg.tokens), H = static_cast<size_t>(cfg.hidden),
               F = static_cast<size_t>(cfg.ffn), AF = cfg.acts.size() * F;
  // x: a per-row offset (which layernorm removes and rmsnorm does not) plus spread.
  pr.x.resize(T * H);
  for (size_t t = 0; t < T; ++t) {
    const double off = rng.uniform(-1.0, 1.0);
    for (size_t j = 0; j < H; ++j) pr.x[t * H + j] = off + rng.uniform(-2.0, 2.0);
  }
  pr.p.gamma = rng.uniform_vec(H, -0.3, 0.3);
  if (!cfg.zero_centered_gamma)
    for (auto& g : pr.p.gamma) g += 1.0;
  if (cfg.norm == lnmlp_ref::Norm::LayerNorm) pr.p.beta = rng.uniform_vec(H, -0.2, 0.2);
  // W1 ~ U(-a, a) has variance a^2/3; with n of unit RMS, h = n W1 has variance H a^2 / 3.
  const double a1 = s.h_std * std::sqrt(3.0 / static_cast<double>(H));
  pr.p.w1 = rng.uniform_vec(H * AF, -a1, a1);
  if (cfg.has_bias1) pr.p.b1 = rng.uniform_vec(AF, -0.3 * s.h_std, 0.3 * s.h_std);
  const double a2 = std::sqrt(3.0 / static_cast<double>(F));
  pr.p.w2 = rng.uniform_vec(F * H, -a2, a2);
  if (cfg.has_bias2) pr.p.b2 = rng.uniform_vec(H, -0.5, 0.5);
  pr.dy = rng.uniform_vec(T * H, -1.0, 1.0);

  for (auto* v : {&pr.x, &pr.dy, &pr.p.gamma, &pr.p.beta, &pr.p.w1, &pr.p.b1, &pr.p.w2, &pr.p.b2})
    *v = rounded(*v, dtype);
  pr.bx = Buffer::from(pr.x, dtype);
  pr.bdy = Buffer::from(pr.dy, dtype);
  pr.bgamma = Buffer::from(pr.p.gamma, dtype);
  pr.bbeta = Buffer::from(pr.p.beta, dtype);
  pr.weight_layout = weight_layout_under_test();
  set_weights(pr, dtype);
  pr.bb1 = Buffer::from(pr.p.b1, dtype);
  pr.bb2 = Buffer::from(pr.p.b2, dtype);
  return pr;
}

// ---------------------------------------------------------------------------------------------
// Running the library through the C API.
// ---------------------------------------------------------------------------------------------
#define LNMLP_TEST_CHECK(call)                                                                        \
  do {                                                                                                \
    const int32_t st_ = (call);                                                                       \
    if (st_ != LNMLP_SUCCESS)                                                                         \
      throw std::runtime_error(std::string(#call) + " returned " + lnmlp_status_string(st_) + ": " + \
                               lnmlp_last_error());                                                   \
  } while (0)

// The saved buffer's bytes of a plan (at its most tokens); throws on failure.
inline int64_t saved_bytes_of(const lnmlp_plan* plan) {
  int64_t bytes = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(plan, &bytes));
  return bytes;
}

// The descriptor settings a Problem fixes: norm, zero-centered gamma, epsilon, activations (with
// the clamped SwiGLU's parameters), biases, dtype and weight layout.
inline void set_block(lnmlp_desc* d, const Problem& pr) {
  const auto& c = pr.cfg;
  LNMLP_TEST_CHECK(
      lnmlp_desc_set_norm(d, c.norm == lnmlp_ref::Norm::LayerNorm ? LNMLP_NORM_LAYERNORM : LNMLP_NORM_RMSNORM));
  LNMLP_TEST_CHECK(lnmlp_desc_set_zero_centered_gamma(d, c.zero_centered_gamma ? 1 : 0));
  LNMLP_TEST_CHECK(lnmlp_desc_set_epsilon(d, static_cast<float>(c.epsilon)));
  std::vector<int32_t> acts(c.acts.begin(), c.acts.end());
  LNMLP_TEST_CHECK(lnmlp_desc_set_activations(d, static_cast<int32_t>(acts.size()), acts.data()));
  LNMLP_TEST_CHECK(lnmlp_desc_set_clamped_swiglu(d, static_cast<float>(c.limit), static_cast<float>(c.alpha),
                                                 static_cast<float>(c.offset)));
  LNMLP_TEST_CHECK(lnmlp_desc_set_bias(d, c.has_bias1 ? 1 : 0, c.has_bias2 ? 1 : 0));
  LNMLP_TEST_CHECK(lnmlp_desc_set_dtype(d, pr.dtype));
  LNMLP_TEST_CHECK(lnmlp_desc_set_weight_layout(d, pr.weight_layout));
}

struct RunOptions {
  int32_t remat = LNMLP_REMAT_SAVE_ALL;
  int32_t num_threads = 1;
  bool external_workspace = false;
  bool backward = true;
  int32_t recipe = LNMLP_RECIPE_NONE;  // FP8 recipe, with its defaults unless set below
  int32_t fp8_format = LNMLP_FP8_FORMAT_DEFAULT;
  int32_t power_2_scale = -1;
  int32_t amax_history_len = 1024;
  bool nvfp4_disable_2d = false;  // NVFP4: 1x16 weight blocks instead of 16x16 tiles
  bool nvfp4_disable_sr = false;  // NVFP4: dy and dh rounded to nearest even
  int32_t margin = 0;
  int32_t amax_algo = LNMLP_AMAX_ALGO_MAX;
  // Sharding (tests/sharding_util.h): this plan is rank `rank` of `group_size` over `comm`.
  int32_t group_size = 1, rank = 0, sequence_parallel = 0;
  lnmlp_comm* comm = nullptr;
  int32_t steps = 1;  // forward (+ backward) this many times on the same plan (delayed scaling moves on)
  // The plan's most tokens (the group's), when larger than the problem's: every call then has
  // fewer tokens than the plan was made for. 0: the problem's.
  int64_t max_tokens = 0;
  // Delayed scaling's state in a caller-owned array (lnmlp.h's layout) instead of the plan's:
  // passed to every call, or attached to the plan.
  enum class State { Plan, PerCall, Attached } state = State::Plan;
  bool norm_output = false;  // lnmlp_desc_set_norm_output
  // Token counts (a call's) whose GEMMs plan creation makes (lnmlp_desc_set_prepared_tokens).
  std::vector<int64_t> prepared_tokens;
  // Backward in two calls: lnmlp_plan_backward_data, then lnmlp_plan_backward_weights (with an
  // external workspace, scribbled over between them: the weights call must need nothing the data
  // call left there).
  bool split_backward = false;
  // The saved buffer's sections apart (LNMLP_CALL_SAVED_SECTIONS): each section the plan saves in
  // memory of its own, poisoned at first, passed to every call.
  bool saved_sections = false;
  // Every call flagged LNMLP_CALL_WEIGHTS_UNCHANGED (the first one makes the copies it keeps).
  bool weights_unchanged = false;
};

struct RunResult {
  Buffer y, dx, dgamma, dbeta, dw1, db1, dw2, db2;
  int64_t saved_bytes = 0, saved_bytes_per_token = 0;
  std::vector<unsigned char> state;  // the plan's exported FP8 state after the last step (delayed)
  // The saved buffer's LNMLP_SAVED_NORM_OUTPUT section after the last forward (empty where the
  // plan has none), and the offsets of every LNMLP_SAVED_* section (-1: absent) with the call's
  // saved bytes (LNMLP_TENSOR_SAVED).
  Buffer norm_output;
  std::vector<int64_t> section_offsets, section_bytes;
  std::vector<std::vector<unsigned char>> section_contents;  // each section's bytes (empty: absent)
  int64_t call_saved_bytes = 0;
  int64_t deferred_bytes = 0;  // the last call's (RunOptions::split_backward)
};

class Plan {
 public:
  Plan(const Problem& pr, const RunOptions& o) {
    const auto& c = pr.cfg;
    lnmlp_desc* d = nullptr;
    LNMLP_TEST_CHECK(lnmlp_desc_create(&d));
    std::unique_ptr<lnmlp_desc, int32_t (*)(lnmlp_desc*)> guard(d, lnmlp_desc_destroy);
    LNMLP_TEST_CHECK(lnmlp_desc_set_shape(d, o.max_tokens > 0 ? o.max_tokens : c.tokens, c.hidden, c.ffn));
    set_block(d, pr);
    LNMLP_TEST_CHECK(lnmlp_desc_set_remat(d, o.remat));
    LNMLP_TEST_CHECK(lnmlp_desc_set_norm_output(d, o.norm_output ? 1 : 0));
    LNMLP_TEST_CHECK(
        lnmlp_desc_set_prepared_tokens(d, static_cast<int32_t>(o.prepared_tokens.size()), o.prepared_tokens.data()));
    LNMLP_TEST_CHECK(lnmlp_desc_set_num_threads(d, o.num_threads));
    LNMLP_TEST_CHECK(lnmlp_desc_set_external_workspace(d, o.external_workspace ? 1 : 0));
    LNMLP_TEST_CHECK(lnmlp_desc_set_recipe(d, o.recipe));
    LNMLP_TEST_CHECK(lnmlp_desc_set_fp8_format(d, o.fp8_format));
    LNMLP_TEST_CHECK(lnmlp_desc_set_scaling_options(d, o.power_2_scale, 0.0f));
    LNMLP_TEST_CHECK(lnmlp_desc_set_delayed_scaling(d, o.margin, o.amax_history_len, o.amax_algo));
    LNMLP_TEST_CHECK(lnmlp_desc_set_nvfp4_options(d, 0, o.nvfp4_disable_sr ? 1 : 0, o.nvfp4_disable_2d ? 1 : 0));
    if (o.comm != nullptr) LNMLP_TEST_CHECK(lnmlp_desc_set_communicator(d, o.comm));
    LNMLP_TEST_CHECK(lnmlp_desc_set_sharding(d, o.group_size, o.rank, o.sequence_parallel));
    LNMLP_TEST_CHECK(lnmlp_plan_create(d, &plan_));
    LNMLP_TEST_CHECK(lnmlp_plan_get_alignment(plan_, &align_));
    if (o.external_workspace) {
      int64_t ws = 0;
      LNMLP_TEST_CHECK(lnmlp_plan_get_workspace_bytes(plan_, &ws));
      workspace_ = AlignedMemory(ws, align_, 0xFF);  // garbage: the plan must not rely on zeroed memory
      LNMLP_TEST_CHECK(lnmlp_plan_attach_workspace(plan_, workspace_.get(), ws));
    }
  }
  ~Plan() { lnmlp_plan_destroy(plan_); }
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  lnmlp_plan* get() const { return plan_; }
  int64_t alignment() const { return align_; }
  // Overwrites an attached workspace with garbage (nothing without one).
  void scribble_workspace() {
    if (workspace_.get() != nullptr) std::memset(workspace_.get(), 0xA5, static_cast<size_t>(workspace_.bytes));
  }

 private:
  lnmlp_plan* plan_ = nullptr;
  int64_t align_ = 64;
  AlignedMemory workspace_;
};

// The saved buffer's sections for a call of `tokens` rows (lnmlp_plan_get_saved_section) into r:
// every section's offset, bytes and contents, and a copy of the norm output's. The sections are in
// the buffer `saved`, or apart at parts[LNMLP_SAVED_*] where parts is not NULL.
inline void read_saved_sections(const lnmlp_plan* plan, int64_t tokens, const void* saved, const void* const* parts,
                                RunResult* r) {
  int64_t rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {0, 0, 0};
  int32_t type = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_tensor_shape(plan, LNMLP_TENSOR_SAVED, tokens, &rank, dims, &type));
  r->call_saved_bytes = rank == 1 ? dims[0] : 0;
  r->section_offsets.clear();
  r->section_bytes.clear();
  for (int32_t s = 0; s < LNMLP_SAVED_COUNT; ++s) {
    int64_t offset = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_saved_section(plan, s, tokens, &offset, &rank, dims, &type));
    int64_t bytes = rank < 0 ? 0 : (type == LNMLP_DTYPE_U8 ? 1 : dtype_size(type));
    for (int64_t i = 0; i < rank; ++i) bytes *= dims[i];
    r->section_offsets.push_back(offset);
    r->section_bytes.push_back(bytes);
    const auto* at = offset < 0         ? nullptr
                     : parts != nullptr ? static_cast<const unsigned char*>(parts[s])
                                        : static_cast<const unsigned char*>(saved) + offset;
    r->section_contents.emplace_back(at, at == nullptr ? at : at + bytes);
    if (s == LNMLP_SAVED_NORM_OUTPUT && at != nullptr) {
      r->norm_output = Buffer(type, static_cast<size_t>(bytes / dtype_size(type)));
      std::memcpy(r->norm_output.data(), at, static_cast<size_t>(bytes));
    }
  }
}

// Memory of its own for each section a call of `tokens` rows saves, poisoned, and the array of
// them a call with LNMLP_CALL_SAVED_SECTIONS takes (NULL for a section the plan does not save).
struct SavedSections {
  std::vector<AlignedMemory> memory;
  std::vector<void*> pointers;
  SavedSections() = default;
  SavedSections(const lnmlp_plan* plan, int64_t tokens, int64_t alignment)
      : memory(LNMLP_SAVED_COUNT), pointers(LNMLP_SAVED_COUNT, nullptr) {
    for (int32_t s = 0; s < LNMLP_SAVED_COUNT; ++s) {
      int64_t offset = 0, rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {0, 0, 0};
      int32_t type = 0;
      LNMLP_TEST_CHECK(lnmlp_plan_get_saved_section(plan, s, tokens, &offset, &rank, dims, &type));
      if (offset < 0) continue;
      int64_t bytes = type == LNMLP_DTYPE_U8 ? 1 : dtype_size(type);
      for (int64_t i = 0; i < rank; ++i) bytes *= dims[i];
      memory[static_cast<size_t>(s)] = AlignedMemory(bytes, alignment, 0xFF);
      pointers[static_cast<size_t>(s)] = memory[static_cast<size_t>(s)].get();
    }
  }
};

// (Re)makes r's output buffers for a call with `tokens` tokens of a plan of pr's block over `ffn`
// columns of F (a shard's under tensor parallelism): y [tokens, H] and, with `backward`, dx
// [tokens, H] and the parameter gradients the plan has (dbeta only for LayerNorm, db1 and db2 only
// with their bias), each poisoned, so that an output the library leaves unwritten shows.
inline void make_output_buffers(RunResult& r, const Problem& pr, size_t tokens, size_t ffn, bool backward) {
  const auto& c = pr.cfg;
  const size_t H = pr.H(), AF = c.acts.size() * ffn;
  r.y = Buffer(pr.dtype, tokens * H);
  r.y.poison();
  if (!backward) return;
  r.dx = Buffer(pr.dtype, tokens * H);
  r.dgamma = Buffer(pr.dtype, H);
  if (c.norm == lnmlp_ref::Norm::LayerNorm) r.dbeta = Buffer(pr.dtype, H);
  r.dw1 = Buffer(pr.dtype, H * AF);
  if (c.has_bias1) r.db1 = Buffer(pr.dtype, AF);
  r.dw2 = Buffer(pr.dtype, ffn * H);
  if (c.has_bias2) r.db2 = Buffer(pr.dtype, H);
  for (Buffer* b : {&r.dx, &r.dgamma, &r.dbeta, &r.dw1, &r.db1, &r.dw2, &r.db2}) b->poison();
}

// The output buffers of a call of pr's (unsharded) plan with `tokens` tokens (make_output_buffers).
inline RunResult output_buffers(const Problem& pr, int64_t tokens, bool backward = true) {
  RunResult r;
  make_output_buffers(r, pr, static_cast<size_t>(tokens), pr.F(), backward);
  return r;
}

// Forward (and backward) of one plan; every output buffer starts poisoned.
inline RunResult run_library(const Problem& pr, const RunOptions& o) {
  const auto& c = pr.cfg;
  // A sharded plan's tensors are its shard's: F/P, and T/P rows under sequence parallelism.
  const size_t P = static_cast<size_t>(o.group_size);
  const size_t T = static_cast<size_t>(c.tokens) / (o.sequence_parallel ? P : 1), H = static_cast<size_t>(c.hidden),
               F = static_cast<size_t>(c.ffn) / P, AF = c.acts.size() * F;
  Plan plan(pr, o);
  RunResult r;
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(plan.get(), &r.saved_bytes));
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes_per_token(plan.get(), &r.saved_bytes_per_token));
  AlignedMemory saved(r.saved_bytes, plan.alignment(), 0xFF);
  SavedSections parts =
      o.saved_sections ? SavedSections(plan.get(), static_cast<int64_t>(T), plan.alignment()) : SavedSections();
  void* saved_arg = o.saved_sections ? static_cast<void*>(parts.pointers.data()) : saved.get();
  const int32_t flags = (o.saved_sections ? LNMLP_CALL_SAVED_SECTIONS : LNMLP_CALL_DEFAULT) |
                        (o.weights_unchanged ? LNMLP_CALL_WEIGHTS_UNCHANGED : LNMLP_CALL_DEFAULT);
  // A caller-owned FP8 state: a fresh one (every scale 1, every history entry 0).
  std::vector<float> state;
  if (o.state != RunOptions::State::Plan) {
    int64_t rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {0, 0, 0};
    int32_t type = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_tensor_shape(plan.get(), LNMLP_TENSOR_FP8_STATE, 0, &rank, dims, &type));
    if (rank != 2 || type != LNMLP_DTYPE_F32) throw std::runtime_error("the FP8 state is not a float32 matrix");
    state.assign(static_cast<size_t>(dims[0] * dims[1]), 0.0f);
    for (int64_t q = 0; q < dims[0]; ++q) state[static_cast<size_t>(q * dims[1])] = 1.0f;
    if (o.state == RunOptions::State::Attached) LNMLP_TEST_CHECK(lnmlp_plan_attach_fp8_state(plan.get(), state.data()));
  }
  float* call_state = o.state == RunOptions::State::PerCall ? state.data() : nullptr;

  for (int32_t step = 0; step < o.steps; ++step) {
    make_output_buffers(r, pr, T, F, o.backward);
    LNMLP_TEST_CHECK(lnmlp_plan_forward(plan.get(), static_cast<int64_t>(T), pr.bx.data(), pr.bgamma.data(),
                                        pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), pr.bb2.data(),
                                        r.y.data(), saved_arg, call_state, flags, nullptr));
    if (!o.backward) continue;
    if (!o.split_backward) {
      LNMLP_TEST_CHECK(lnmlp_plan_backward(
          plan.get(), static_cast<int64_t>(T), pr.bdy.data(), pr.bx.data(), pr.bgamma.data(), pr.bbeta.data(),
          pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), saved_arg, r.dx.data(), r.dgamma.data(), r.dbeta.data(),
          r.dw1.data(), r.db1.data(), r.dw2.data(), r.db2.data(), call_state, flags, nullptr));
      continue;
    }
    LNMLP_TEST_CHECK(lnmlp_plan_get_deferred_bytes(plan.get(), static_cast<int64_t>(T), &r.deferred_bytes));
    AlignedMemory deferred(r.deferred_bytes, plan.alignment(), 0xFF);
    LNMLP_TEST_CHECK(lnmlp_plan_backward_data(plan.get(), static_cast<int64_t>(T), pr.bdy.data(), pr.bx.data(),
                                              pr.bgamma.data(), pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(),
                                              pr.bw2.data(), saved_arg, r.dx.data(), r.dgamma.data(), r.dbeta.data(),
                                              r.db1.data(), r.db2.data(), deferred.get(), call_state, flags, nullptr));
    plan.scribble_workspace();
    LNMLP_TEST_CHECK(lnmlp_plan_backward_weights(plan.get(), static_cast<int64_t>(T), pr.bdy.data(), saved_arg,
                                                 deferred.get(), r.dw1.data(), r.dw2.data(), flags, nullptr));
  }
  read_saved_sections(plan.get(), static_cast<int64_t>(T), saved.get(),
                      o.saved_sections ? parts.pointers.data() : nullptr, &r);
  // dW1 and dW2 in x out, as the reference has them.
  if (o.backward) {
    r.dw1 = weight_in_out(r.dw1, H, AF, pr.weight_layout);
    r.dw2 = weight_in_out(r.dw2, F, H, pr.weight_layout);
  }
  // The state the run left, exported as a blob: a caller's array is attached first, so the export
  // reads it.
  if (call_state != nullptr) LNMLP_TEST_CHECK(lnmlp_plan_attach_fp8_state(plan.get(), call_state));
  int64_t state_bytes = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_state_bytes(plan.get(), &state_bytes));
  r.state.resize(static_cast<size_t>(state_bytes));
  if (state_bytes > 0) LNMLP_TEST_CHECK(lnmlp_plan_export_state(plan.get(), r.state.data(), state_bytes));
  return r;
}

// The tensors of a result with their names, in one order (y first).
struct NamedBuffer {
  const char* name;
  const Buffer* buf;
};
inline std::vector<NamedBuffer> named(const RunResult& r) {
  return {{"y", &r.y},     {"dx", &r.dx},   {"dgamma", &r.dgamma}, {"dbeta", &r.dbeta},
          {"dW1", &r.dw1}, {"db1", &r.db1}, {"dW2", &r.dw2},       {"db2", &r.db2}};
}

// The float64 reference's outputs in named() order -- y, dx, dgamma, dbeta, dw1, db1, dw2, db2 --
// the gradients empty without backward.
inline std::vector<std::vector<double>> reference_outputs(const Problem& pr, bool backward = true) {
  lnmlp_ref::Grads g;
  if (backward) g = lnmlp_ref::backward(pr.cfg, pr.x, pr.p, pr.dy);
  return {lnmlp_ref::forward(pr.cfg, pr.x, pr.p), g.dx, g.dgamma, g.dbeta, g.dw1, g.db1, g.dw2, g.db2};
}

// ---------------------------------------------------------------------------------------------
// Comparison.
// ---------------------------------------------------------------------------------------------
struct Comparison {
  double max_ref = 0.0;      // max |ref|
  double worst_excess = 0.0; // max (|got - ref| - allow), NaN-aware (a NaN is +inf)
  size_t worst = 0;          // index of the worst element
  double got = 0.0, ref = 0.0, allow = 0.0;
  double normalised() const { return max_ref > 0.0 ? worst_excess / max_ref : worst_excess; }
};

inline Comparison compare(const std::vector<double>& got, const std::vector<double>& ref,
                          const std::vector<double>* allow = nullptr) {
  Comparison c;
  for (double r : ref) c.max_ref = std::max(c.max_ref, std::fabs(r));
  c.worst_excess = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < ref.size(); ++i) {
    const double al = allow ? (*allow)[i] : 0.0;
    double e = std::fabs(got[i] - ref[i]) - al;
    if (std::isnan(e)) e = std::numeric_limits<double>::infinity();
    if (e > c.worst_excess) {
      c.worst_excess = e;
      c.worst = i;
      c.got = got[i];
      c.ref = ref[i];
      c.allow = al;
    }
  }
  if (ref.empty()) c.worst_excess = 0.0;
  return c;
}

// Passes when the worst excess is within atol + rtol * max|ref| (see tolerances.h); the failure
// message names the worst element.
inline ::testing::AssertionResult within_tolerance(const char* name, const std::vector<double>& got,
                                                   const std::vector<double>& ref, const std::vector<double>* allow,
                                                   Tolerance tol, Comparison* out = nullptr) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << name << ": size " << got.size() << " != reference " << ref.size();
  const Comparison c = compare(got, ref, allow);
  if (out) *out = c;
  const double bound = tol.atol + tol.rtol * c.max_ref;
  if (c.worst_excess <= bound) return ::testing::AssertionSuccess();
  std::ostringstream m;
  m.precision(9);
  m << name << ": worst element [" << c.worst << "] got " << c.got << ", reference " << c.ref << " (|diff| "
    << std::fabs(c.got - c.ref) << ", kink allowance " << c.allow << "); normalised error " << c.normalised()
    << " exceeds the bound " << bound << " = atol " << tol.atol << " + rtol " << tol.rtol << " * max|ref| "
    << c.max_ref;
  return ::testing::AssertionFailure() << m.str();
}

// The outputs of `got` that `names` lists (named()'s names) against the float64 reference, all at
// `tol`; the failure message gives each one off.
inline ::testing::AssertionResult matches_reference(const Problem& pr, const RunResult& got, Tolerance tol,
                                                    std::initializer_list<const char*> names) {
  const auto outputs = named(got);
  const auto ref = reference_outputs(pr);
  std::string off;
  for (const char* want : names) {
    size_t i = 0;
    while (i < outputs.size() && std::strcmp(outputs[i].name, want) != 0) ++i;
    if (i == outputs.size()) return ::testing::AssertionFailure() << "no output is named " << want;
    const ::testing::AssertionResult r = within_tolerance(want, outputs[i].buf->to_doubles(), ref[i], nullptr, tol);
    if (!r) off += (off.empty() ? "" : "; ") + std::string(r.message());
  }
  if (off.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << off;
}

// Bit-identity of two buffers; the failure message names the first differing element.
inline ::testing::AssertionResult same_bits(const char* name, const Buffer& a, const Buffer& b) {
  if (a.bytes.size() != b.bytes.size())
    return ::testing::AssertionFailure() << name << ": " << a.bytes.size() << " vs " << b.bytes.size() << " bytes";
  if (a.bytes.empty() || std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0)
    return ::testing::AssertionSuccess();
  const auto va = a.to_doubles(), vb = b.to_doubles();
  const size_t es = static_cast<size_t>(dtype_size(a.dtype));
  size_t n_diff = 0, first = 0;
  for (size_t i = 0; i < va.size(); ++i)
    if (std::memcmp(a.bytes.data() + i * es, b.bytes.data() + i * es, es) != 0) {
      if (n_diff++ == 0) first = i;
    }
  std::ostringstream m;
  m.precision(9);
  m << name << ": " << n_diff << " of " << va.size() << " elements differ in their bits; first [" << first << "] "
    << va[first] << " vs " << vb[first];
  return ::testing::AssertionFailure() << m.str();
}

// Every output of `got` bit for bit the same as `want`'s (named() order); the failure message gives
// each tensor that differs, as same_bits does.
inline ::testing::AssertionResult same_outputs(const RunResult& got, const RunResult& want) {
  const auto a = named(got), b = named(want);
  std::string differ;
  for (size_t i = 0; i < a.size(); ++i) {
    const ::testing::AssertionResult r = same_bits(a[i].name, *a[i].buf, *b[i].buf);
    if (!r) differ += (differ.empty() ? "" : "; ") + std::string(r.message());
  }
  if (differ.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << differ;
}

}  // namespace lnmlp_test
