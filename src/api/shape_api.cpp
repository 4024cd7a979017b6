// lnmlp_plan_get_tensor_shape: the shape of every tensor of a call, from the plan's (shard's)
// Config, so that no binding repeats the arithmetic.
#include <cstdint>

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

Shape shape_of(const lnmlp_plan& plan, int32_t tensor, int64_t tokens) {
  const Config& c = plan.cfg;
  const int64_t H = c.hidden, F = c.ffn, A = c.num_acts;
  const int32_t io = static_cast<int32_t>(c.dtype);
  const int32_t wt = static_cast<int32_t>(c.weight_type());      // W1, W2
  const int32_t wg = static_cast<int32_t>(c.param_grad_type());  // dW1, db1, dW2, db2
  const auto make = [&](bool present, std::initializer_list<int64_t> dims, int32_t dtype) {
    Shape s;
    if (!present) return s;
    s.rank = static_cast<int64_t>(dims.size());
    int i = 0;
    for (int64_t d : dims) s.dims[i++] = d;
    s.dtype = dtype;
    return s;
  };
  // W1 and W2 (or their gradients, in `dtype`) in the plan's weight layout: in x out [H, A, F] and
  // [F, H], or out x in [A, F, H] and [H, F].
  const bool out_in = c.weights_out_in();
  const auto w1 = [&](int32_t dtype) { return out_in ? make(true, {A, F, H}, dtype) : make(true, {H, A, F}, dtype); };
  const auto w2 = [&](int32_t dtype) { return out_in ? make(true, {H, F}, dtype) : make(true, {F, H}, dtype); };
  switch (tensor) {
    case LNMLP_TENSOR_X:
    case LNMLP_TENSOR_Y:
    case LNMLP_TENSOR_DY:
    case LNMLP_TENSOR_DX: return make(true, {tokens, H}, io);
    case LNMLP_TENSOR_GAMMA:
    case LNMLP_TENSOR_DGAMMA: return make(true, {H}, io);
    case LNMLP_TENSOR_BETA:
    case LNMLP_TENSOR_DBETA: return make(c.has_beta(), {H}, io);
    case LNMLP_TENSOR_W1: return w1(wt);
    case LNMLP_TENSOR_DW1: return w1(wg);
    case LNMLP_TENSOR_B1: return make(c.has_bias1, {A, F}, io);
    case LNMLP_TENSOR_DB1: return make(c.has_bias1, {A, F}, wg);
    case LNMLP_TENSOR_W2: return w2(wt);
    case LNMLP_TENSOR_DW2: return w2(wg);
    case LNMLP_TENSOR_B2: return make(c.has_bias2, {H}, io);
    case LNMLP_TENSOR_DB2: return make(c.has_bias2, {H}, wg);
    case LNMLP_TENSOR_SAVED: {
      const int64_t bytes =
          tokens == c.rows() ? plan.saved.total_bytes : make_saved_layout(c.for_call(tokens)).total_bytes;
      return make(plan.saved.total_bytes > 0, {bytes}, LNMLP_DTYPE_U8);
    }
    case LNMLP_TENSOR_FP8_STATE:
      return make(plan.recipe.stateful(), {kQuantizerCount, plan.recipe.state_stride()}, LNMLP_DTYPE_F32);
    default: fail(LNMLP_ERROR_INVALID_ARGUMENT, "unknown tensor ", tensor, " (expected an LNMLP_TENSOR_* value)");
  }
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
    const int64_t most = plan->cfg.rows();
    if (tokens == LNMLP_TOKENS_MAX) tokens = most;
    if (tokens < 0 || tokens > most)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "tokens must be in [0, ", most, "] or LNMLP_TOKENS_MAX, got ", tokens);
    const Shape s = shape_of(*plan, tensor, tokens);
    *rank = s.rank;
    for (int i = 0; i < LNMLP_MAX_TENSOR_RANK; ++i) dims[i] = s.dims[i];
    *dtype = s.dtype;
  });
}

}  // extern "C"
