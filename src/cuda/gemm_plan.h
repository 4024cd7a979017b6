// How the CUDA backend runs the six GEMMs of a plan (block/gemm_roles.h) with cuBLASLt
// (gemm_cublaslt.h): one definition, used by the backend (cuda_exec.cpp) and by lnmlp-gpu-bench's
// "GEMMs alone" peer.
//
// Unquantized: operands and result in the I/O dtype (fp32 for dact, dn and sharded GEMM2's
// partial sums), the forward GEMMs' bias in the epilogue. Per-tensor FP8: K-major codes (A [m, k],
// B [n, k]) in the quantizers' formats; blocked FP8: decoded bf16 (fp32 for BLOCK without
// power-of-2 scales) in the role's own orientation. FP8 results in the I/O dtype are staged in
// fp32 and rounded, with the bias, by a second kernel.
#pragma once

#include "block/gemm_roles.h"
#include "gemm_cublaslt.h"
#include "plan/fp8_recipe.h"

namespace lnmlp::cuda {

inline LtType lt_type(numerics::DType d) {
  return d == numerics::DType::BF16 ? LtType::BF16 : d == numerics::DType::F16 ? LtType::F16 : LtType::F32;
}
inline LtType lt_type(numerics::Fp8Format f) { return f == numerics::Fp8Format::E4M3 ? LtType::E4M3 : LtType::E5M2; }

struct CudaGemm {
  LtShape shape;
  bool staged;  // the result in fp32 staging, then rounded into the I/O dtype
};

inline CudaGemm cuda_gemm(const block::GemmSpec& s, const Config& c) {
  const LtType io = lt_type(c.dtype);
  CudaGemm g{{s.m, s.n, s.k, s.trans_a, s.trans_b, io, io, s.out_f32 ? LtType::F32 : io, s.bias}, false};
  const ResolvedRecipe r = resolve_recipe(c.fp8);
  if (r.recipe == Recipe::None) return g;
  g.staged = !s.out_f32;
  g.shape.c = LtType::F32;
  g.shape.bias = false;
  if (r.per_tensor()) {
    g.shape.trans_a = false;
    g.shape.trans_b = true;
    g.shape.a = lt_type(r.formats[s.quantizer_a]);
    g.shape.b = lt_type(r.formats[s.quantizer_b]);
  } else {
    g.shape.a = g.shape.b = r.recipe == Recipe::Block && !r.power_2_scale ? LtType::F32 : LtType::BF16;
  }
  return g;
}

}  // namespace lnmlp::cuda
