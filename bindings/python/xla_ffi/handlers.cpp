// The XLA FFI handlers of lnmlp.jax: forward and backward of the block as custom calls, for XLA's
// "cpu" platform (the CPU backend) and its "CUDA" platform (the CUDA backend, on XLA's stream).
//
// Each handler has two stages. Instantiate (once per executable and call site) reads the call's
// attributes -- the plan's configuration, see PlanConfig -- and takes the shared plan for it
// (plan_cache.h). Execute makes sure the plan takes the call's tokens (on the CPU a plan grows to
// the largest call) and runs it on XLA's buffers: the tensors, the saved buffer, the workspace
// (on a GPU an XLA buffer, one more output of the call, sized by lnmlp/jax/_layernorm_mlp.py as
// the plan's workspace bytes plus its alignment, since XLA promises less alignment than a plan
// needs; empty on the CPU, where the plan owns its workspace), and, for delayed scaling, the FP8
// state, an input aliased to an output and updated in place. Tensors a configuration does not
// take (beta for RMSNorm, a disabled bias, the state of a stateless recipe) are zero-element
// arrays and reach lnmlp as NULL.
//
// No exception leaves a handler: failures become an ffi::Error carrying lnmlp's message, which JAX
// raises as an exception.
#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "lnmlp.h"
#include "plan_cache.h"
#include "xla/ffi/api/ffi.h"

#define LNMLP_XLA_API extern "C" __attribute__((visibility("default")))

namespace ffi = xla::ffi;

namespace lnmlp_xla {
namespace {

// The FFI state of one instantiated call site: its plan, and on GPUs the plan of each other GPU
// the executable runs on (an executable over a mesh runs the call site on every device of it).
struct PlanState {
  static ffi::TypeId id;
  PlanConfig config;
  std::shared_ptr<SharedPlan> shared;  // the plan on config.device
  // The call's LNMLP_CALL_AMAX_* flags (current scaling in stages, lnmlp/jax/_sharding.py): its
  // fp8 state operand and result are then the amax array. Not the plan's: one plan serves every stage.
  int32_t amax_flags = 0;
  // The saved buffer's sections apart (LNMLP_CALL_SAVED_SECTIONS): forward's results and backward's
  // operands have one array per section in place of the one saved buffer (lnmlp/jax/_calls.py).
  bool saved_apart = false;

  // The call's LNMLP_CALL_* flags.
  int32_t flags() const { return amax_flags | (saved_apart ? LNMLP_CALL_SAVED_SECTIONS : 0); }

  // The plan for the device XLA runs this call on (other GPUs' plans are kept here, so that an
  // execution does not look the process-wide cache up).
  SharedPlan& on_device(int32_t device) {
    if (device == config.device) return *shared;
    std::lock_guard<std::mutex> lock(devices_mutex);
    std::shared_ptr<SharedPlan>& plan = other_devices[device];
    if (!plan) {
      PlanConfig c = config;
      c.device = device;
      plan = shared_plan(c);
    }
    return *plan;
  }

 private:
  std::mutex devices_mutex;
  std::map<int32_t, std::shared_ptr<SharedPlan>> other_devices;
};
ffi::TypeId PlanState::id = {};
const XLA_FFI_TypeInfo kPlanStateInfo = ffi::MakeTypeInfo<PlanState>();

struct Failure {
  ffi::ErrorCode code;
  std::string message;
};

[[noreturn]] void fail(ffi::ErrorCode code, std::string message) { throw Failure{code, std::move(message)}; }

void check(int32_t status) {
  if (status == LNMLP_SUCCESS) return;
  const bool bad_input = status == LNMLP_ERROR_INVALID_ARGUMENT || status == LNMLP_ERROR_NULL_POINTER ||
                         status == LNMLP_ERROR_MISALIGNED || status == LNMLP_ERROR_SIZE_OVERFLOW ||
                         status == LNMLP_ERROR_WORKSPACE_TOO_SMALL;
  fail(bad_input ? ffi::ErrorCode::kInvalidArgument : ffi::ErrorCode::kInternal,
       std::string("lnmlp: ") + lnmlp_last_error() + " [" + lnmlp_status_string(status) + "]");
}

// Runs fn, turning what it throws into the handler's error.
template <typename Fn> ffi::Error guarded(Fn&& fn) {
  try {
    fn();
    return ffi::Error::Success();
  } catch (const Failure& f) {
    return ffi::Error(f.code, f.message);
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, e.what());
  } catch (...) {
    return ffi::Error::Internal("lnmlp: an unknown C++ exception in the XLA FFI handler");
  }
}

template <typename T> T attr(const ffi::Dictionary& attrs, std::string_view name) {
  ffi::ErrorOr<T> v = attrs.get<T>(name);
  if (!v.has_value())
    fail(ffi::ErrorCode::kInvalidArgument,
         "lnmlp: the custom call's attribute '" + std::string(name) + "' is missing or of the wrong type");
  return *v;
}

PlanConfig config_of(const ffi::Dictionary& a) {
  PlanConfig c;
  c.tokens = attr<int64_t>(a, "tokens");
  c.hidden = attr<int64_t>(a, "hidden");
  c.ffn = attr<int64_t>(a, "ffn");
  c.norm = attr<int32_t>(a, "norm");
  c.zero_centered_gamma = attr<int32_t>(a, "zero_centered_gamma");
  c.epsilon = attr<float>(a, "epsilon");
  c.act0 = attr<int32_t>(a, "act0");
  c.act1 = attr<int32_t>(a, "act1");
  c.clamp_limit = attr<float>(a, "clamp_limit");
  c.clamp_alpha = attr<float>(a, "clamp_alpha");
  c.clamp_offset = attr<float>(a, "clamp_offset");
  c.has_bias1 = attr<int32_t>(a, "has_bias1");
  c.has_bias2 = attr<int32_t>(a, "has_bias2");
  c.dtype = attr<int32_t>(a, "dtype");
  c.remat = attr<int32_t>(a, "remat");
  c.recipe = attr<int32_t>(a, "recipe");
  c.fp8_format = attr<int32_t>(a, "fp8_format");
  c.margin = attr<int32_t>(a, "margin");
  c.amax_history_len = attr<int64_t>(a, "amax_history_len");
  c.amax_compute_algo = attr<int32_t>(a, "amax_compute_algo");
  c.power_2_scale = attr<int32_t>(a, "power_2_scale");
  c.amax_epsilon = attr<float>(a, "amax_epsilon");
  c.backend = attr<int32_t>(a, "backend");
  c.device = attr<int32_t>(a, "device");
  c.weight_dtype = attr<int32_t>(a, "weight_dtype");
  c.norm_output = attr<int32_t>(a, "norm_output");
  c.nvfp4_options = attr<int32_t>(a, "nvfp4_options");
  return c;
}

ffi::ErrorOr<std::unique_ptr<PlanState>> instantiate(int32_t backend, ffi::Dictionary attrs) {
  auto state = std::make_unique<PlanState>();
  ffi::Error e = guarded([&] {
    state->config = config_of(attrs);
    state->amax_flags = attr<int32_t>(attrs, "amax_flags");
    state->saved_apart = attr<int32_t>(attrs, "saved_apart") != 0;
    if (state->config.backend != backend)
      fail(ffi::ErrorCode::kInvalidArgument, "lnmlp: the call's backend attribute does not match XLA's platform");
    state->shared = shared_plan(state->config);
  });
  if (e.failure()) return ffi::Unexpected(std::move(e));
  return state;
}

// A tensor the configuration takes, or NULL for the zero-element stand-in of one it does not.
const void* in_ptr(const ffi::AnyBuffer& b) { return b.element_count() == 0 ? nullptr : b.untyped_data(); }
void* out_ptr(ffi::Result<ffi::AnyBuffer>& b) { return b->element_count() == 0 ? nullptr : b->untyped_data(); }

int64_t tokens_of(const PlanState& s, const ffi::AnyBuffer& x) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  if (n % s.config.hidden != 0)
    fail(ffi::ErrorCode::kInvalidArgument,
         "lnmlp: x has " + std::to_string(n) + " elements, not a multiple of H = " + std::to_string(s.config.hidden));
  return n / s.config.hidden;
}

// ---- the buffers' checks: XLA hands over whatever a custom call was given, and a direct call
// (jax.ffi.ffi_call with other shapes than lnmlp.jax's) must not make lnmlp read or write out of
// bounds. Each buffer is checked against what the plan takes for the call's tokens
// (lnmlp_plan_get_tensor_shape), before anything runs.

const char* type_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::U8: return "uint8";
    case ffi::DataType::U32: return "uint32";
    default: return "another element type";
  }
}

ffi::DataType xla_type(int32_t lnmlp_dtype) {
  switch (lnmlp_dtype) {
    case LNMLP_DTYPE_F32: return ffi::DataType::F32;
    case LNMLP_DTYPE_BF16: return ffi::DataType::BF16;
    case LNMLP_DTYPE_F16: return ffi::DataType::F16;
    case LNMLP_DTYPE_U8: return ffi::DataType::U8;
    default: fail(ffi::ErrorCode::kInternal, "lnmlp: a tensor of an element type the XLA handlers do not know");
  }
}

std::string dims_string(const int64_t* dims, size_t rank) {
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// The plan's shapes for a call of `tokens` tokens, and the check of each buffer against them.
class Expected {
 public:
  Expected(const lnmlp_plan* plan, int64_t tokens, const char* call) : plan_(plan), tokens_(tokens), call_(call) {}

  // A buffer of exactly the plan's dims and element type for `tensor` (a zero-element stand-in
  // where the plan takes none). The saved buffer, flat bytes, may be longer than the call's.
  void expect(int32_t tensor, const char* name, ffi::DataType type, ffi::Span<const int64_t> dims) const {
    int64_t rank = 0, want[LNMLP_MAX_TENSOR_RANK] = {};
    int32_t dtype = 0;
    check(lnmlp_plan_get_tensor_shape(plan_, tensor, tokens_, &rank, want, &dtype));
    int64_t count = 1;
    for (int64_t d : dims) count *= d;
    if (rank < 0) {
      if (count != 0) mismatch(name, "a zero-element array (the plan does not take it)", type, dims);
      return;
    }
    const ffi::DataType want_type = xla_type(dtype);
    const std::string want_text = std::string(type_name(want_type)) + " " + dims_string(want, rank);
    if (type != want_type) mismatch(name, want_text, type, dims);
    if (tensor == LNMLP_TENSOR_SAVED) {
      if (count < want[0]) mismatch(name, "at least " + want_text, type, dims);
      return;
    }
    if (dims.size() != static_cast<size_t>(rank) || !std::equal(dims.begin(), dims.end(), want))
      mismatch(name, want_text, type, dims);
  }
  void expect(int32_t tensor, const char* name, const ffi::AnyBuffer& b) const {
    expect(tensor, name, b.element_type(), b.dimensions());
  }
  void expect(int32_t tensor, const char* name, ffi::Result<ffi::AnyBuffer>& b) const {
    expect(tensor, name, b->element_type(), b->dimensions());
  }
  // Saved section `section` (LNMLP_SAVED_*) as an array of its own: the section's element type and
  // element count (any shape: the caller lays it out as it shards it), or a zero-element stand-in
  // where the plan does not save it.
  void expect_section(int32_t section, ffi::DataType type, ffi::Span<const int64_t> dims) const {
    int64_t offset = 0, rank = 0, want[LNMLP_MAX_TENSOR_RANK] = {};
    int32_t dtype = 0;
    check(lnmlp_plan_get_saved_section(plan_, section, tokens_, &offset, &rank, want, &dtype));
    int64_t count = 1, want_count = 1;
    for (int64_t d : dims) count *= d;
    for (int64_t i = 0; i < rank; ++i) want_count *= want[i];
    const std::string name = "saved section " + std::to_string(section);
    if (rank < 0) {
      if (count != 0) mismatch(name.c_str(), "a zero-element array (the plan does not save it)", type, dims);
      return;
    }
    const ffi::DataType want_type = xla_type(dtype);
    if (type != want_type || count != want_count)
      mismatch(name.c_str(), std::string(type_name(want_type)) + " of " + std::to_string(want_count) + " elements",
               type, dims);
  }

  // The fp8 state operand or result: the plan's state, or with LNMLP_CALL_AMAX_* flags the amax
  // array, float32 [LNMLP_QUANTIZER_COUNT] (NVFP4: [LNMLP_QUANTIZER_COUNT * 2], two per quantizer).
  void expect_state(const PlanConfig& config, int32_t amax_flags, const char* name, ffi::DataType type,
                    ffi::Span<const int64_t> dims) const {
    if (amax_flags == 0) return expect(LNMLP_TENSOR_FP8_STATE, name, type, dims);
    const int64_t floats = LNMLP_QUANTIZER_COUNT * (config.recipe == LNMLP_RECIPE_NVFP4 ? 2 : 1);
    if (type != ffi::DataType::F32 || dims.size() != 1 || dims[0] != floats)
      mismatch(name, "float32 [" + std::to_string(floats) + "] (the amax array)", type, dims);
  }

 private:
  [[noreturn]] void mismatch(const char* name, const std::string& want, ffi::DataType type,
                             ffi::Span<const int64_t> dims) const {
    fail(ffi::ErrorCode::kInvalidArgument, std::string("lnmlp: the ") + call_ + " custom call's " + name + " is " +
                                               type_name(type) + " " + dims_string(dims.begin(), dims.size()) +
                                               ", but the plan takes " + want + " for " + std::to_string(tokens_) +
                                               " tokens");
  }

  const lnmlp_plan* plan_;
  int64_t tokens_;
  const char* call_;
};

// Attaches XLA's workspace output, its start rounded up to the plan's alignment (the buffer has
// that much to spare), for a plan that takes its workspace from XLA (see plan_cache.cpp).
void attach_workspace(const SharedPlan& p, ffi::Result<ffi::AnyBuffer>& ws) {
  if (!p.external_workspace) return;
  const auto base = reinterpret_cast<uintptr_t>(ws->untyped_data());
  const auto align = static_cast<uintptr_t>(p.alignment);
  const size_t skip = static_cast<size_t>((align - base % align) % align);
  if (ws->size_bytes() < skip)
    fail(ffi::ErrorCode::kInvalidArgument, "lnmlp: the custom call's workspace is " + std::to_string(ws->size_bytes()) +
                                               " bytes, smaller than its alignment");
  void* start = static_cast<char*>(ws->untyped_data()) + skip;
  check(lnmlp_plan_attach_workspace(p.plan, start, static_cast<int64_t>(ws->size_bytes() - skip)));
}

// A backward call's random operand, uint32 [10], for a plan that rounds stochastically
// (PlanConfig::draws_random; lnmlp/jax/_calls.py's random_operand): the random state -- the seed's
// low and high words, then the offset's -- and the call's place in the whole tensors
// (lnmlp_plan_set_rng_place) -- first_token's words, whole_tokens', ffn_part, ffn_parts. It is read
// on the host: the CPU platform's buffers are host memory; on a GPU it would need a copy to the
// host and a wait for XLA's stream, which the handlers do not make (the Python side refuses the
// case first).
void set_random_stream(const SharedPlan& p, const ffi::AnyBuffer& rng) {
  const ffi::Span<const int64_t> dims = rng.dimensions();
  constexpr int64_t kWords = 10;
  if (rng.element_type() != ffi::DataType::U32 || dims.size() != 1 || dims[0] != kWords)
    fail(ffi::ErrorCode::kInvalidArgument,
         std::string("lnmlp: the backward custom call's random operand is ") + type_name(rng.element_type()) + " " +
             dims_string(dims.begin(), dims.size()) + ", but a plan that rounds stochastically takes uint32 [10]");
  if (p.config.backend != LNMLP_BACKEND_CPU)
    fail(ffi::ErrorCode::kUnimplemented,
         "lnmlp: NVFP4's stochastic rounding under lnmlp.jax runs on the CPU platform only in this version");
  uint32_t w[kWords];
  std::memcpy(w, rng.untyped_data(), sizeof w);
  const auto word64 = [&](int i) { return w[i] | uint64_t{w[i + 1]} << 32; };
  check(lnmlp_plan_set_rng_state(p.plan, word64(0), word64(2)));
  check(lnmlp_plan_set_rng_place(p.plan, static_cast<int64_t>(word64(4)), static_cast<int64_t>(word64(6)),
                                 static_cast<int32_t>(w[8]), static_cast<int32_t>(w[9])));
}

// The state array forward / backward update in place: the output XLA aliases to the input. On the
// CPU, should XLA ever hand over two buffers, the input's values are copied over first.
void* fp8_state(const ffi::AnyBuffer& in, ffi::Result<ffi::AnyBuffer>& out, int32_t backend) {
  if (out->element_count() == 0) return nullptr;
  if (in.untyped_data() != out->untyped_data()) {
    if (backend != LNMLP_BACKEND_CPU)
      fail(ffi::ErrorCode::kInternal, "lnmlp: XLA did not alias the FP8 state's input and output");
    std::memcpy(out->untyped_data(), in.untyped_data(), out->size_bytes());
  }
  return out->untyped_data();
}

// The call's buffers, in the order lnmlp/jax/_layernorm_mlp.py passes them.
class Buffers {
 public:
  Buffers(const char* call, size_t n_args, size_t n_rets, ffi::RemainingArgs args, ffi::RemainingRets rets)
      : args_(args), rets_(rets) {
    if (args.size() != n_args || rets.size() != n_rets)
      fail(ffi::ErrorCode::kInvalidArgument, std::string("lnmlp: the ") + call + " custom call takes " +
                                                 std::to_string(n_args) + " operands and " + std::to_string(n_rets) +
                                                 " results, got " + std::to_string(args.size()) + " and " +
                                                 std::to_string(rets.size()));
  }
  ffi::AnyBuffer in(size_t i) const { return *args_.get<ffi::AnyBuffer>(i); }
  ffi::Result<ffi::AnyBuffer> out(size_t i) const { return *rets_.get<ffi::AnyBuffer>(i); }

 private:
  ffi::RemainingArgs args_;
  ffi::RemainingRets rets_;
};

// The saved sections of a call whose saved buffer is apart: the array of them the library takes,
// NULL for each zero-element stand-in.
struct Sections {
  void* at[LNMLP_SAVED_COUNT] = {};
};

// Operands x, gamma, beta, w1, b1, w2, b2, fp8 state; results y, saved (with saved_apart: the
// LNMLP_SAVED_COUNT sections), workspace, fp8 state.
ffi::Error forward(PlanState* s, void* stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return guarded([&] {
    const size_t n_saved = s->saved_apart ? LNMLP_SAVED_COUNT : 1;
    const Buffers b("forward", 8, 3 + n_saved, args, rets);
    const ffi::AnyBuffer x = b.in(0);
    ffi::Result<ffi::AnyBuffer> y = b.out(0), saved = b.out(1), workspace = b.out(1 + n_saved),
                                state = b.out(2 + n_saved);
    const int64_t t = tokens_of(*s, x);
    SharedPlan& p = s->on_device(device);
    std::lock_guard<std::mutex> lock(p.mutex);
    p.reserve(t);
    const Expected want(p.plan, t, "forward");
    const int32_t inputs[] = {LNMLP_TENSOR_X,  LNMLP_TENSOR_GAMMA, LNMLP_TENSOR_BETA, LNMLP_TENSOR_W1,
                              LNMLP_TENSOR_B1, LNMLP_TENSOR_W2,    LNMLP_TENSOR_B2,   LNMLP_TENSOR_FP8_STATE};
    const char* names[] = {"x", "gamma", "beta", "kernel_1", "bias_1", "kernel_2", "bias_2", "fp8 state"};
    for (size_t i = 0; i < 7; ++i) want.expect(inputs[i], names[i], b.in(i));
    want.expect_state(s->config, s->amax_flags, names[7], b.in(7).element_type(), b.in(7).dimensions());
    want.expect(LNMLP_TENSOR_Y, "y", y);
    Sections sections;
    if (s->saved_apart) {
      for (int32_t i = 0; i < LNMLP_SAVED_COUNT; ++i) {
        ffi::Result<ffi::AnyBuffer> section = b.out(1 + static_cast<size_t>(i));
        want.expect_section(i, section->element_type(), section->dimensions());
        sections.at[i] = out_ptr(section);
      }
    } else {
      want.expect(LNMLP_TENSOR_SAVED, "saved", saved);
    }
    want.expect_state(s->config, s->amax_flags, "fp8 state (result)", state->element_type(), state->dimensions());
    attach_workspace(p, workspace);
    void* st = fp8_state(b.in(7), state, s->config.backend);
    check(lnmlp_plan_forward(p.plan, t, x.untyped_data(), b.in(1).untyped_data(), in_ptr(b.in(2)),
                             b.in(3).untyped_data(), in_ptr(b.in(4)), b.in(5).untyped_data(), in_ptr(b.in(6)),
                             out_ptr(y), s->saved_apart ? sections.at : out_ptr(saved), st, s->flags(), stream));
  });
}

// Operands dy, x, gamma, beta, w1, b1, w2, saved (with saved_apart: the LNMLP_SAVED_COUNT
// sections), fp8 state, and for a plan that rounds stochastically the random operand; results dx,
// dgamma, dbeta, dw1, db1, dw2, db2, workspace, fp8 state.
ffi::Error backward(PlanState* s, void* stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return guarded([&] {
    const size_t n_saved = s->saved_apart ? LNMLP_SAVED_COUNT : 1, state_at = 7 + n_saved;
    const bool rng = s->config.draws_random();  // the random operand follows the state
    const Buffers b("backward", 8 + n_saved + (rng ? 1 : 0), 9, args, rets);
    const ffi::AnyBuffer x = b.in(1);
    ffi::Result<ffi::AnyBuffer> g[7] = {b.out(0), b.out(1), b.out(2), b.out(3), b.out(4), b.out(5), b.out(6)};
    ffi::Result<ffi::AnyBuffer> workspace = b.out(7), state = b.out(8);
    const int64_t t = tokens_of(*s, x);
    SharedPlan& p = s->on_device(device);
    std::lock_guard<std::mutex> lock(p.mutex);
    p.reserve(t);
    const Expected want(p.plan, t, "backward");
    const int32_t inputs[] = {LNMLP_TENSOR_DY,   LNMLP_TENSOR_X,     LNMLP_TENSOR_GAMMA,
                              LNMLP_TENSOR_BETA, LNMLP_TENSOR_W1,    LNMLP_TENSOR_B1,
                              LNMLP_TENSOR_W2,   LNMLP_TENSOR_SAVED, LNMLP_TENSOR_FP8_STATE};
    const char* in_names[] = {"dy", "x", "gamma", "beta", "kernel_1", "bias_1", "kernel_2", "saved", "fp8 state"};
    for (size_t i = 0; i < 7; ++i) want.expect(inputs[i], in_names[i], b.in(i));
    Sections sections;
    if (s->saved_apart) {
      for (int32_t i = 0; i < LNMLP_SAVED_COUNT; ++i) {
        const ffi::AnyBuffer section = b.in(7 + static_cast<size_t>(i));
        want.expect_section(i, section.element_type(), section.dimensions());
        sections.at[i] = const_cast<void*>(in_ptr(section));
      }
    } else {
      want.expect(inputs[7], in_names[7], b.in(7));
    }
    const ffi::AnyBuffer state_in = b.in(state_at);
    want.expect_state(s->config, s->amax_flags, in_names[8], state_in.element_type(), state_in.dimensions());
    const int32_t grads[] = {LNMLP_TENSOR_DX,  LNMLP_TENSOR_DGAMMA, LNMLP_TENSOR_DBETA, LNMLP_TENSOR_DW1,
                             LNMLP_TENSOR_DB1, LNMLP_TENSOR_DW2,    LNMLP_TENSOR_DB2};
    const char* grad_names[] = {"dx", "dgamma", "dbeta", "dkernel_1", "dbias_1", "dkernel_2", "dbias_2"};
    for (size_t i = 0; i < 7; ++i) want.expect(grads[i], grad_names[i], g[i]);
    want.expect_state(s->config, s->amax_flags, "fp8 state (result)", state->element_type(), state->dimensions());
    attach_workspace(p, workspace);
    if (rng) set_random_stream(p, b.in(state_at + 1));
    void* st = fp8_state(state_in, state, s->config.backend);
    check(lnmlp_plan_backward(p.plan, t, b.in(0).untyped_data(), x.untyped_data(), b.in(2).untyped_data(),
                              in_ptr(b.in(3)), b.in(4).untyped_data(), in_ptr(b.in(5)), b.in(6).untyped_data(),
                              s->saved_apart ? sections.at : in_ptr(b.in(7)), out_ptr(g[0]), out_ptr(g[1]),
                              out_ptr(g[2]), out_ptr(g[3]), out_ptr(g[4]), out_ptr(g[5]), out_ptr(g[6]), st, s->flags(),
                              stream));
  });
}

}  // namespace
}  // namespace lnmlp_xla

using lnmlp_xla::PlanState;

// ---- exported: the state type and the handlers (jax.ffi.register_ffi_type / _target) ----------

LNMLP_XLA_API const void* lnmlp_xla_state_type_id(void) { return &PlanState::id; }
LNMLP_XLA_API const void* lnmlp_xla_state_type_info(void) { return &lnmlp_xla::kPlanStateInfo; }
// How many lnmlp plans the handlers hold (lnmlp.jax.plan_count(), for tests).
LNMLP_XLA_API int64_t lnmlp_xla_plan_count(void) { return lnmlp_xla::plan_count(); }

LNMLP_XLA_API XLA_FFI_Error* lnmlp_xla_instantiate_cpu(XLA_FFI_CallFrame*);
LNMLP_XLA_API XLA_FFI_Error* lnmlp_xla_instantiate_cuda(XLA_FFI_CallFrame*);
LNMLP_XLA_API XLA_FFI_Error* lnmlp_xla_forward_cpu(XLA_FFI_CallFrame*);
LNMLP_XLA_API XLA_FFI_Error* lnmlp_xla_forward_cuda(XLA_FFI_CallFrame*);
LNMLP_XLA_API XLA_FFI_Error* lnmlp_xla_backward_cpu(XLA_FFI_CallFrame*);
LNMLP_XLA_API XLA_FFI_Error* lnmlp_xla_backward_cuda(XLA_FFI_CallFrame*);

// Instantiation binds the attributes only (XLA gives that stage no buffers); forward and backward
// share one instantiate handler per platform.
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    lnmlp_xla_instantiate_cpu, [](ffi::Dictionary attrs) { return lnmlp_xla::instantiate(LNMLP_BACKEND_CPU, attrs); },
    ffi::Ffi::BindInstantiate().Attrs<ffi::Dictionary>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    lnmlp_xla_instantiate_cuda, [](ffi::Dictionary attrs) { return lnmlp_xla::instantiate(LNMLP_BACKEND_CUDA, attrs); },
    ffi::Ffi::BindInstantiate().Attrs<ffi::Dictionary>());

// The CPU handlers pass no stream; the CUDA ones pass XLA's (a cudaStream_t, as void*) and the GPU
// it belongs to (the plan on that GPU runs), enqueue and return: no synchronisation, so XLA may
// capture them into a command buffer (CUDA graph).
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    lnmlp_xla_forward_cpu,
    [](PlanState* s, ffi::RemainingArgs a, ffi::RemainingRets r) {
      return lnmlp_xla::forward(s, nullptr, s->config.device, a, r);
    },
    ffi::Ffi::Bind().Ctx<ffi::State<PlanState>>().RemainingArgs().RemainingRets());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    lnmlp_xla_backward_cpu,
    [](PlanState* s, ffi::RemainingArgs a, ffi::RemainingRets r) {
      return lnmlp_xla::backward(s, nullptr, s->config.device, a, r);
    },
    ffi::Ffi::Bind().Ctx<ffi::State<PlanState>>().RemainingArgs().RemainingRets());

namespace lnmlp_xla {
namespace {
// The CUDA handlers' context: XLA's stream, the GPU it belongs to, the call site's state.
auto cuda_binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<void*>>()
      .Ctx<ffi::DeviceOrdinal>()
      .Ctx<ffi::State<PlanState>>()
      .RemainingArgs()
      .RemainingRets();
}
}  // namespace
}  // namespace lnmlp_xla

XLA_FFI_DEFINE_HANDLER_SYMBOL(lnmlp_xla_forward_cuda,
                              [](void* stream, int32_t device, PlanState* s, ffi::RemainingArgs a,
                                 ffi::RemainingRets r) { return lnmlp_xla::forward(s, stream, device, a, r); },
                              lnmlp_xla::cuda_binding(), {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(lnmlp_xla_backward_cuda,
                              [](void* stream, int32_t device, PlanState* s, ffi::RemainingArgs a,
                                 ffi::RemainingRets r) { return lnmlp_xla::backward(s, stream, device, a, r); },
                              lnmlp_xla::cuda_binding(), {ffi::Traits::kCmdBufferCompatible});
