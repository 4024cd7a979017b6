// How the CPU backend runs the six GEMMs of a plan (block/gemm_roles.h) with its GEMM library
// (gemm.h): the operand and output types, and whether the result goes through fp32 staging. One
// definition, used by the CPU backend (cpu_exec.cpp) and by lnmlp-bench's "GEMMs alone" peer.
//
// Plain operands: f32 and bf16 as they are (bf16 natively where the CPU has bf16 instructions,
// else on fp32 copies inside the GEMM layer, gemm_bf16_on_f32.h); f16 on fp32 copies, since the
// CPU GEMM libraries have no f16. FP8 operands: decoded into bf16 or fp32 (fp8_operand_type).
// The library writes f32 and bf16 results directly and adds a forward GEMM's bias; an f16 or an
// FP8 GEMM's result in the I/O dtype is staged in fp32, and a pass then applies the per-tensor
// scales and the bias and rounds (cpu_exec.cpp).
#pragma once

#include "isa.h"

#include "block/gemm_roles.h"
#include "gemm.h"
#include "numerics/dtype.h"
#include "plan/fp8_recipe.h"

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {

using numerics::DType;

// The element type of the CPU's plain GEMM operand of an I/O-dtype tensor.
constexpr DType operand_type(DType d) { return d == DType::F16 ? DType::F32 : d; }

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
  const bool staged = !s.out_f32 && (quantized || c.dtype == DType::F16);
  const GemmType out = s.out_f32 || staged ? GemmType::F32 : io;
  return {{s.m, s.n, s.k, s.trans_a, s.trans_b, in, out, s.bias && !staged}, staged};
}

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
