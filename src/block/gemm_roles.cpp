#include "gemm_roles.h"

#include "plan/fp8_recipe.h"

namespace lnmlp::block {

GemmSpec gemm_spec(GemmRole role, const Config& c) {
  const int64_t T = c.tokens, H = c.hidden, F = c.ffn, AF = c.act_width();
  const bool sharded = c.sharded();
  const bool wgrad_f32 = c.param_grad_type() == numerics::DType::F32;
  switch (role) {
    case GemmRole::Gemm1: return {role, "GEMM1 (ln @ W1)", T, AF, H, false, false, kLnOut, kW1, false, c.has_bias1};
    case GemmRole::Gemm2:
      return {role, "GEMM2 (act @ W2)", T, H, F, false, false, kActOut, kW2, sharded, c.has_bias2 && !sharded};
    case GemmRole::Dact: return {role, "dact (dy @ W2^T)", T, F, H, false, true, kDy, kW2, true, false};
    case GemmRole::Dw2:
      return {role, "dW2 (act^T @ dy)", F, H, T, true, false, kActOut, kDy, wgrad_f32, false, c.accumulate_grads};
    case GemmRole::Dn: return {role, "dln (dh @ W1^T)", T, H, AF, false, true, kDh, kW1, true, false};
    case GemmRole::Dw1: break;
  }
  return {GemmRole::Dw1, "dW1 (ln^T @ dh)", H, AF, T, true, false, kLnOut, kDh, wgrad_f32, false, c.accumulate_grads};
}

}  // namespace lnmlp::block
