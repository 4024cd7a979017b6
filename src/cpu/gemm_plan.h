// How the CPU backend runs the six GEMMs of a plan (block/gemm_roles.h) with its GEMM library
// (gemm.h): the operand and output types, and whether the result goes through fp32 staging. One
// definition, used by the CPU backend (cpu_exec.cpp) and by lnmlp-bench's "GEMMs alone" peer.
//
// Plain operands: f32 and bf16 as they are (bf16 where the GEMM library multiplies bf16 on this
// CPU); f16, and bf16 elsewhere, on fp32 copies the backend makes (operand_type), since the CPU
// GEMM libraries have no f16. FP8 operands: decoded into bf16 or fp32 (fp8_operand_type).
// The library writes f32 and bf16 results directly, adds a forward GEMM's bias and adds into an
// accumulating weight gradient; an f16 result, a per-tensor FP8 GEMM's result in the I/O dtype
// (and its accumulating one), and a blocked FP8 GEMM's that the library cannot write in its types
// are staged in fp32, and a pass then applies the per-tensor scales and the bias, or adds it into the
// gradient, and rounds (cpu_exec.cpp).
#pragma once

#include "isa.h"

#include "block/gemm_roles.h"
#include "gemm.h"
#include "numerics/dtype.h"
#include "plan/fp8_recipe.h"

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {

using numerics::DType;

// The element type of the CPU's plain GEMM operand of an I/O-dtype tensor: fp32 for f16, and for
// bf16 where the GEMM library has no bf16 GEMM on this CPU (the producers then write the fp32
// copy in their own pass, and a weight's copy can be kept across calls, block/weight_copies.h).
inline DType operand_type(DType d) {
  return d == DType::F16 || (d == DType::BF16 && !gemm_native_bf16()) ? DType::F32 : d;
}

// The type FP8 codes are decoded into for the GEMM: bf16 holds every FP8 value, and every FP8
// value times a power-of-two scale, exactly; only BLOCK with arbitrary fp32 scales needs fp32.
// Where the CPU has no bf16 GEMM, fp32 (the same values) spares the GEMM a widening copy.
inline GemmType fp8_operand_type(const ResolvedRecipe& r) {
  if (!gemm_native_bf16()) return GemmType::F32;
  return r.recipe == Recipe::Block && !r.power_2_scale ? GemmType::F32 : GemmType::BF16;
}

struct CpuGemm {
  GemmShape shape;  // what the GEMM library runs
  bool staged;      // the result in fp32 staging, finished by an epilogue pass
};

inline CpuGemm cpu_gemm(const block::GemmSpec& s, const Config& c) {
  const ResolvedRecipe r = resolve_recipe(c.fp8);
  const bool quantized = r.recipe != Recipe::None;
  const GemmType io = c.dtype == DType::BF16 ? GemmType::BF16 : GemmType::F32;
  const GemmType in =
      quantized ? fp8_operand_type(r) : (operand_type(c.dtype) == DType::BF16 ? GemmType::BF16 : GemmType::F32);
  // An FP8 GEMM's result is staged where per-tensor scales apply to it (scale_inv_a * scale_inv_b,
  // NVFP4's alpha,
  // a pass after the product; for an accumulating GEMM too: they apply to the product, not to what
  // it is added into), and where the decoded operands' type is not the I/O dtype and the library
  // cannot write the result: its bias is of its input type, and it has no fp32 x fp32 -> bf16. The
  // blocked recipes fold their scales into the decoded operands, so the library writes their other
  // results itself, bias added.
  const bool scaled = quantized && r.scaled_gemms();
  const bool other_types = quantized && in != io && (s.bias || io == GemmType::BF16);
  const bool staged =
      (!s.out_f32 && (scaled || other_types || operand_type(c.dtype) != c.dtype)) || (s.accumulate && scaled);
  const GemmType out = s.out_f32 || staged ? GemmType::F32 : io;
  GemmShape shape{s.m, s.n, s.k, s.trans_a, s.trans_b, in, out, s.bias && !staged};
  shape.accumulate = s.accumulate && !staged;
  return {shape, staged};
}

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
