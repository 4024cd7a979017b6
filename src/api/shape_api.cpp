// lnmlp_plan_get_tensor_shape and lnmlp_plan_get_saved_section: the shape of every tensor of a
// call and where each section of the saved buffer is, from the plan's (shard's) Config, so that no
// binding repeats the arithmetic.
#include <cstdint>
#include <initializer_list>
#include <tuple>

#include "common/error.h"
#include "handles.h"
#include "lnmlp.h"
#include "plan.h"
#include "plan/layout.h"

using namespace lnmlp;

namespace {

struct Shape {
  int64_t rank = -1;  // -1: the plan does not take this tensor
  int64_t dims[LNMLP_MAX_TENSOR_RANK] = {0, 0, 0};
  int32_t dtype = LNMLP_DTYPE_F32;
};

// The shape `dims` of element type `dtype`, or none where the plan does not take the tensor.
Shape make_shape(bool present, std::initializer_list<int64_t> dims, int32_t dtype) {
  Shape s;
  if (!present) return s;
  s.rank = static_cast<int64_t>(dims.size());
  int i = 0;
  for (int64_t d : dims) s.dims[i++] = d;
  s.dtype = dtype;
  return s;
}

Shape shape_of(const lnmlp_plan& plan, int32_t tensor, int64_t tokens) {
  const Config& c = plan.cfg;
  const int64_t H = c.hidden, F = c.ffn, A = c.num_acts;
  const int32_t io = static_cast<int32_t>(c.dtype);
  const int32_t wt = static_cast<int32_t>(c.weight_type());      // W1, W2
  const int32_t wg = static_cast<int32_t>(c.param_grad_type());  // dW1, db1, dW2, db2
  // W1 and W2 (or their gradients, in `dtype`) in the plan's weight layout: in x out [H, A, F] and
  // [F, H], or out x in [A, F, H] and [H, F].
  const bool out_in = c.weights_out_in();
  const auto w1 = [&](int32_t dtype) {
    return out_in ? make_shape(true, {A, F, H}, dtype) : make_shape(true, {H, A, F}, dtype);
  };
  const auto w2 = [&](int32_t dtype) {
    return out_in ? make_shape(true, {H, F}, dtype) : make_shape(true, {F, H}, dtype);
  };
  switch (tensor) {
    case LNMLP_TENSOR_X:
    case LNMLP_TENSOR_Y:
    case LNMLP_TENSOR_DY:
    case LNMLP_TENSOR_DX: return make_shape(true, {tokens, H}, io);
    case LNMLP_TENSOR_GAMMA:
    case LNMLP_TENSOR_DGAMMA: return make_shape(true, {H}, io);
    case LNMLP_TENSOR_BETA:
    case LNMLP_TENSOR_DBETA: return make_shape(c.has_beta(), {H}, io);
    case LNMLP_TENSOR_W1: return w1(wt);
    case LNMLP_TENSOR_DW1: return w1(wg);
    case LNMLP_TENSOR_B1: return make_shape(c.has_bias1, {A, F}, io);
    case LNMLP_TENSOR_DB1: return make_shape(c.has_bias1, {A, F}, wg);
    case LNMLP_TENSOR_W2: return w2(wt);
    case LNMLP_TENSOR_DW2: return w2(wg);
    case LNMLP_TENSOR_B2: return make_shape(c.has_bias2, {H}, io);
    case LNMLP_TENSOR_DB2: return make_shape(c.has_bias2, {H}, wg);
    case LNMLP_TENSOR_SAVED: {
      return make_shape(plan.saved.total_bytes > 0, {plan.saved_of_call(tokens).total_bytes}, LNMLP_DTYPE_U8);
    }
    case LNMLP_TENSOR_FP8_STATE:
      return make_shape(plan.recipe.stateful(), {kQuantizerCount, plan.recipe.state_stride()}, LNMLP_DTYPE_F32);
    default: fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown tensor ", tensor, " (expected an LNMLP_TENSOR_* value)");
  }
}

// Where section `section` of the saved buffer is for a call with `tokens` rows of x (its region
// in the call's layout), with its shape.
Shape section_of(const lnmlp_plan& plan, int32_t section, int64_t tokens, int64_t* offset) {
  if (section < 0 || section >= LNMLP_SAVED_COUNT)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown section ", section, " (expected an LNMLP_SAVED_* value)");
  const Config& c = plan.cfg;
  const Config call = c.for_call(tokens);
  const SavedLayout layout = plan.saved_of_call(tokens);
  static_assert(std::tuple_size<decltype(layout.regions())>::value == LNMLP_SAVED_COUNT,
                "SavedLayout::regions() lists the LNMLP_SAVED_* sections, in their order");
  const Region& r = *layout.regions()[static_cast<size_t>(section)];
  *offset = r.present() ? r.offset : -1;
  const bool p = r.present();
  const int64_t T = call.tokens, H = c.hidden, F = c.ffn, A = c.num_acts;
  const int32_t io = static_cast<int32_t>(c.dtype);
  switch (section) {
    case LNMLP_SAVED_MEAN:
    case LNMLP_SAVED_RSTD: return make_shape(p, {call.rows()}, LNMLP_DTYPE_F32);
    case LNMLP_SAVED_NORM_OUTPUT: return make_shape(p, {T, H}, io);
    case LNMLP_SAVED_FFN1: return make_shape(p, {T, A, F}, io);
    case LNMLP_SAVED_ACT_OUT: return make_shape(p, {T, F}, io);
    case LNMLP_SAVED_FP8_SCALES: return make_shape(p, {4}, LNMLP_DTYPE_F32);
    default: return make_shape(p, {r.bytes}, LNMLP_DTYPE_U8);  // FP8 codes and block scales, as their operands lie
  }
}

// The call's token count from the API's `tokens` (LNMLP_TOKENS_MAX: the plan's most), checked.
int64_t call_tokens(const lnmlp_plan& plan, int64_t tokens) {
  const int64_t most = plan.cfg.rows();
  if (tokens == LNMLP_TOKENS_MAX) return most;
  if (tokens < 0 || tokens > most)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "tokens must be in [0, ", most, "] or LNMLP_TOKENS_MAX, got ", tokens);
  return tokens;
}

void write_shape(const Shape& s, int64_t* rank, int64_t* dims, int32_t* dtype) {
  *rank = s.rank;
  for (int i = 0; i < LNMLP_MAX_TENSOR_RANK; ++i) dims[i] = s.dims[i];
  *dtype = s.dtype;
}

}  // namespace

extern "C" {

LNMLP_API int32_t lnmlp_plan_get_tensor_shape(const lnmlp_plan* plan, int32_t tensor, int64_t tokens, int64_t* rank,
                                              int64_t* dims, int32_t* dtype) {
  return api_guard(__func__, [&] {
    const Held<lnmlp_plan> held(plan, "plan");
    if (rank == nullptr || dims == nullptr || dtype == nullptr)
      fail(LNMLP_ERROR_NULL_POINTER,
           rank == nullptr   ? "rank"
           : dims == nullptr ? "dims"
                             : "dtype",
           " is NULL; pass where to write the result");
    write_shape(shape_of(*plan, tensor, call_tokens(*plan, tokens)), rank, dims, dtype);
  });
}

LNMLP_API int32_t lnmlp_plan_get_saved_section(const lnmlp_plan* plan, int32_t section, int64_t tokens, int64_t* offset,
                                               int64_t* rank, int64_t* dims, int32_t* dtype) {
  return api_guard(__func__, [&] {
    const Held<lnmlp_plan> held(plan, "plan");
    if (offset == nullptr || rank == nullptr || dims == nullptr || dtype == nullptr)
      fail(LNMLP_ERROR_NULL_POINTER,
           offset == nullptr ? "offset"
           : rank == nullptr ? "rank"
           : dims == nullptr ? "dims"
                             : "dtype",
           " is NULL; pass where to write the result");
    int64_t at = -1;
    const Shape s = section_of(*plan, section, call_tokens(*plan, tokens), &at);
    *offset = at;
    write_shape(s, rank, dims, dtype);
  });
}

LNMLP_API int32_t lnmlp_plan_get_deferred_bytes(const lnmlp_plan* plan, int64_t tokens, int64_t* bytes) {
  return api_guard(__func__, [&] {
    const Held<lnmlp_plan> held(plan, "plan");
    if (bytes == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "bytes is NULL; pass where to write the result");
    *bytes = plan->deferred_bytes(call_tokens(*plan, tokens));
  });
}

}  // extern "C"
