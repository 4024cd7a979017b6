// How the CUDA backend runs the six GEMMs of a plan (block/gemm_roles.h) with cuBLASLt
// (gemm_cublaslt.h): one definition, used by the backend (cuda_exec.cpp) and by lnmlp-gpu-bench's
// "GEMMs alone" peer.
//
// Operands. Unquantized: the I/O dtype (fp32 results for dact, dn and sharded GEMM2's partial
// sums). Per-tensor FP8: K-major codes (A [m, k], B [n, k]) in the quantizers' formats, with
// per-tensor scale_invs. BLOCK on cuBLASLt's block-scaled GEMMs (native_blocked: sm_90, cuBLASLt
// 12.9, every dimension a multiple of 16): K-major codes too, with 1 x 128 block scales, or
// 128 x 128 tile scales for the weights. Emulated blocked recipes (MXFP8; BLOCK elsewhere): codes
// decoded into bf16 (fp32 for BLOCK without power-of-2 scales), in the role's own orientation.
// NVFP4 on FP4 GEMMs (native_blocked: sm_100, cuBLASLt 12.8, every dimension a multiple of 32):
// K-major E2M1 codes with their E4M3 block scales in cuBLASLt's tiled layout; elsewhere decoded
// into bf16 (e2m1 * s_block, exact). Either way every result is staged in fp32 for its alpha.
//
// Results. Written by cuBLASLt in their own type, with the forward GEMMs' bias in its epilogue
// where it takes one: the result and the bias in bf16 or f16, or an unquantized fp32 plan. An FP8
// GEMM of an fp32 plan takes no fp32 bias, so its bias is added after, in place (bias_after).
// Where cuBLASLt has no algorithm for that result type or that bias epilogue (fused_epilogue
// false, the backend's fallback), a bf16/f16 result goes to fp32 staging and a kernel rounds it,
// with the bias, into the dtype (staged); an fp32 result gets its bias after (bias_after).
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
  bool staged = false;      // the result in fp32 staging, then rounded (with the bias) into the I/O dtype
  bool bias_after = false;  // the bias added by a kernel after the GEMM, in place
};

// Whether the plan's quantized GEMMs read codes: per-tensor recipes; BLOCK and NVFP4 where they
// run natively (native_blocked: cuBLASLt's block-scaled FP8 GEMMs, or its FP4 GEMMs).
inline bool fp8_codes_gemm(const ResolvedRecipe& r, bool native_blocked) {
  return r.per_tensor() || ((r.recipe == Recipe::Block || r.nvfp4()) && native_blocked);
}

inline CudaGemm cuda_gemm(const block::GemmSpec& s, const Config& c, bool native_blocked = false,
                          bool fused_epilogue = true) {
  const LtType io = lt_type(c.dtype);
  CudaGemm g;
  g.shape = {s.m, s.n, s.k, s.trans_a, s.trans_b, io, io, s.out_f32 ? LtType::F32 : io, s.bias};
  g.shape.accumulate = s.accumulate;
  const ResolvedRecipe r = resolve_recipe(c.fp8);
  const bool codes = r.recipe != Recipe::None && fp8_codes_gemm(r, native_blocked);
  if (codes) {  // K-major sides, as FP8 and FP4 tensor cores take them
    g.shape.trans_a = false;
    g.shape.trans_b = true;
  }
  if (codes && r.nvfp4()) {
    g.shape.a = g.shape.b = LtType::E2M1;
    g.shape.scale_a = g.shape.scale_b = LtScale::Vec16;
  } else if (codes) {
    g.shape.a = lt_type(r.formats[s.quantizer_a]);
    g.shape.b = lt_type(r.formats[s.quantizer_b]);
    // lnmlp_desc_set_gemm_math: the forward GEMMs of per-tensor recipes only.
    g.shape.fast_accumulation = c.fp8_fast_accumulation && r.per_tensor() &&
                                (s.role == block::GemmRole::Gemm1 || s.role == block::GemmRole::Gemm2);
    if (r.recipe == Recipe::Block) {
      const auto weight = [](int q) { return q == kW1 || q == kW2; };
      g.shape.scale_a = weight(s.quantizer_a) ? LtScale::Blk128 : LtScale::Vec128;
      g.shape.scale_b = weight(s.quantizer_b) ? LtScale::Blk128 : LtScale::Vec128;
    }
  } else if (r.recipe != Recipe::None) {
    g.shape.a = g.shape.b = r.recipe == Recipe::Block && !r.power_2_scale ? LtType::F32 : LtType::BF16;
  }
  g.shape.tf32 = c.allow_tf32 && g.shape.a == LtType::F32 && g.shape.b == LtType::F32;
  if (r.nvfp4()) {
    // NVFP4's alpha (from the operands' global amaxes, on the device) scales the fp32 sum before
    // the bias, the accumulation and the rounding: every result is staged in fp32 and finished by
    // the epilogue kernel (fp8_kernels.h's bias_round).
    g.staged = true;
    g.shape.c = LtType::F32;
    g.shape.bias = false;
    g.shape.accumulate = false;
    return g;
  }
  if (!fused_epilogue) {
    // An fp32 result is written where it goes and gets its bias after, in place; a bf16/f16 one
    // is staged in fp32 and rounded, with the bias, by the kernel.
    const bool f32_result = g.shape.c == LtType::F32;
    g.staged = !f32_result;
    g.bias_after = f32_result && g.shape.bias;
    g.shape.c = LtType::F32;
    g.shape.bias = false;
    g.shape.accumulate = s.accumulate && !g.staged;  // staged: the epilogue adds into the result
  } else if (codes && g.shape.bias && g.shape.c == LtType::F32) {
    g.shape.bias = false;
    g.bias_after = true;
  }
  return g;
}

}  // namespace lnmlp::cuda
