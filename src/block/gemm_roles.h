// The six GEMMs of one forward + backward of the block (docs/design.md, "What is computed"): one table, read by the
// schedule (schedule.cpp), by every backend when it creates its GEMMs, and by lnmlp-bench's
// "GEMMs alone" peer. Row-major:
//
//   C[m, n] = op(A) @ op(B),   op(A) [m, k]: A stored [m, k], or [k, m] when trans_a;
//                              op(B) [k, n]: B stored [k, n], or [n, k] when trans_b.
//
//   role   C             =  A            @ B              m    n    k
//   gemm1  h [T, A*F]    =  ln [T, H]    @ W1 [H, A*F]    T    A*F  H     + b1
//   gemm2  y [T, H]      =  act [T, F]   @ W2 [F, H]      T    H    F     + b2
//   dact   dact [T, F]   =  dy [T, H]    @ W2^T           T    F    H     fp32
//   dw2    dW2 [F, H]    =  act^T        @ dy             F    H    T
//   dn     dn [T, H]     =  dh [T, A*F]  @ W1^T           T    H    A*F   fp32
//   dw1    dW1 [H, A*F]  =  ln^T         @ dh             H    A*F  T
//
// With out x in weights (lnmlp_desc_set_weight_layout: W1 [A*F, H], W2 [H, F], PyTorch's) the
// forward GEMMs read W^T (trans_b), dact and dn read W as it is, and the weight gradients are the
// transposed products, dW2 [H, F] = dy^T @ act and dW1 [A*F, H] = dh^T @ ln (the gradient side
// first: the schedule passes each side by its quantizer, gemm_sides).
//
// T is the group's token count (every GEMM sees all tokens, sequence parallel or not) and F the
// shard's ffn. Under FP8 each side is one quantizer's tensor, quantized along the contracted
// dimension: a side whose contraction runs along its stored rows' length is read "rowwise"; one
// whose contraction runs down its stored columns is read "columnwise" (TransformerEngine's
// columnwise data: the transposed codes of a per-tensor quantization, or blocks down the columns).
#pragma once

#include <cstdint>

#include "plan/config.h"

namespace lnmlp::block {

enum class GemmRole : int32_t { Gemm1 = 0, Gemm2, Dact, Dw2, Dn, Dw1 };
constexpr int kGemmRoles = 6;
constexpr GemmRole kAllGemmRoles[kGemmRoles] = {GemmRole::Gemm1, GemmRole::Gemm2, GemmRole::Dact,
                                                GemmRole::Dw2,   GemmRole::Dn,    GemmRole::Dw1};

struct GemmSpec {
  GemmRole role;
  const char* name;  // for messages: "GEMM1 (ln @ W1)"
  int64_t m, n, k;
  bool trans_a, trans_b;
  int quantizer_a, quantizer_b;  // plan/fp8_recipe.h's Quantizer of each side
  bool out_f32;                  // C in fp32: dact, dn, GEMM2's partial sums when sharded, fp32 weight
                                 // gradients; else the I/O dtype
  bool bias;                     // GEMM1 adds b1; GEMM2 adds b2 unless sharded (then after the group's sum)
  bool accumulate = false;       // C += the product (dW1, dW2 under gradient accumulation)
};

// The GEMM `role` of the plan whose (shard's) Config is c.
GemmSpec gemm_spec(GemmRole role, const Config& c);

// Whether a plan runs the backward GEMMs (every remat policy but FORWARD_ONLY).
inline bool trains(const Config& c) { return c.remat != Remat::ForwardOnly; }

}  // namespace lnmlp::block
