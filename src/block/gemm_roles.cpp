#include "gemm_roles.h"

#include "plan/fp8_recipe.h"

namespace lnmlp::block {

GemmSpec gemm_spec(GemmRole role, const Config& c) {
  const int64_t T = c.tokens, H = c.hidden, F = c.ffn, AF = c.act_width();
  const bool sharded = c.sharded();
  const bool wgrad_f32 = c.param_grad_type() == numerics::DType::F32;
  const bool acc = c.accumulate_grads;
  // Out x in weights (PyTorch's) are the in x out ones transposed: the forward GEMMs read them
  // transposed, the data-gradient GEMMs as they are, and a weight gradient is the transposed
  // product, its two sides swapped.
  const bool oi = c.weights_out_in();
  switch (role) {
    case GemmRole::Gemm1:
      return {role, oi ? "GEMM1 (ln @ W1^T)" : "GEMM1 (ln @ W1)", T, AF, H, false, oi, kLnOut, kW1, false, c.has_bias1};
    case GemmRole::Gemm2:
      return {role,
              oi ? "GEMM2 (act @ W2^T)" : "GEMM2 (act @ W2)",
              T,
              H,
              F,
              false,
              oi,
              kActOut,
              kW2,
              sharded,
              c.has_bias2 && !sharded};
    case GemmRole::Dact:
      return {role, oi ? "dact (dy @ W2)" : "dact (dy @ W2^T)", T, F, H, false, !oi, kDy, kW2, true, false};
    case GemmRole::Dw2:
      if (oi) return {role, "dW2 (dy^T @ act)", H, F, T, true, false, kDy, kActOut, wgrad_f32, false, acc};
      return {role, "dW2 (act^T @ dy)", F, H, T, true, false, kActOut, kDy, wgrad_f32, false, acc};
    case GemmRole::Dn:
      return {role, oi ? "dln (dh @ W1)" : "dln (dh @ W1^T)", T, H, AF, false, !oi, kDh, kW1, true, false};
    case GemmRole::Dw1: break;
  }
  if (oi) return {GemmRole::Dw1, "dW1 (dh^T @ ln)", AF, H, T, true, false, kDh, kLnOut, wgrad_f32, false, acc};
  return {GemmRole::Dw1, "dW1 (ln^T @ dh)", H, AF, T, true, false, kLnOut, kDh, wgrad_f32, false, acc};
}

}  // namespace lnmlp::block
