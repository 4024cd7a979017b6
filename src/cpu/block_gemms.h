// The six GEMMs of one forward + backward of the block, as the CPU backend runs them: one
// definition, used by the backend and by lnmlp-bench's "GEMMs alone" peer.
//
// bf16 GEMMs run natively where the CPU has bf16 instructions (else on fp32 copies inside the GEMM,
// gemm_bf16_on_f32.h); f16 ones on fp32 copies (the CPU libraries have no f16 path). For f32
// and bf16 the forward GEMMs and the weight gradients write the I/O dtype directly and the forward
// GEMMs add their bias; for f16 they write fp32 and the following pass adds the bias and rounds.
#pragma once

#include <cstdint>

#include "numerics/dtype.h"
#include "gemm.h"

namespace lnmlp::cpu {

struct BlockGemmShapes {
  GemmShape gemm1;  // h[T, A*F]  = ln[T, H] @ W1[H, A*F] (+ b1)
  GemmShape gemm2;  // y[T, H]    = act[T, F] @ W2[F, H] (+ b2)
  GemmShape dact;   // dact[T, F] = dy[T, H] @ W2^T        (fp32)
  GemmShape dw2;    // dW2[F, H]  = act^T @ dy
  GemmShape dn;     // dn[T, H]   = dh[T, A*F] @ W1^T      (fp32)
  GemmShape dw1;    // dW1[H, A*F] = ln^T @ dh
};

// The operand type of the GEMMs for an I/O dtype.
constexpr GemmType gemm_input_type(numerics::DType d) {
  return d == numerics::DType::BF16 ? GemmType::BF16 : GemmType::F32;
}
// Whether the GEMMs run on fp32 copies of the operands (f16).
constexpr bool gemm_widens(numerics::DType d) { return d == numerics::DType::F16; }

// partial_gemm2: GEMM2 writes fp32 without its bias (a rank's partial sums under sharding, reduced
// over the group before b2 is added and the result rounded).
inline BlockGemmShapes block_gemm_shapes(int64_t T, int64_t H, int64_t F, int64_t A, numerics::DType d,
                                         bool has_bias1, bool has_bias2, bool partial_gemm2 = false) {
  const GemmType in = gemm_input_type(d);
  const GemmType out = gemm_widens(d) ? GemmType::F32 : in;
  const GemmType out2 = partial_gemm2 ? GemmType::F32 : out;
  const bool fuse_bias = !gemm_widens(d);
  const int64_t AF = A * F;
  return {
      {T, AF, H, false, false, in, out, has_bias1 && fuse_bias},
      {T, H, F, false, false, in, out2, has_bias2 && fuse_bias && !partial_gemm2},
      {T, F, H, false, true, in, GemmType::F32, false},
      {F, H, T, true, false, in, out, false},
      {T, H, AF, false, true, in, GemmType::F32, false},
      {H, AF, T, true, false, in, out, false},
  };
}

}  // namespace lnmlp::cpu
