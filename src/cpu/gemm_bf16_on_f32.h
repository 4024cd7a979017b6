// bf16 GEMMs for CPUs on which the GEMM library has no bf16 matmul (oneDNN 2.x has none below
// AVX-512, e.g. on AMD Zen 3): the operands are widened to fp32 copies in the GEMM's scratch (exact),
// an fp32 GEMM runs on them, and a bf16 output is rounded from its fp32 result. The values equal
// those of a native bf16 GEMM with fp32 accumulation, up to the order of the accumulation.
#pragma once

#include <memory>

#include "gemm.h"

namespace lnmlp::cpu {

// shape.input must be BF16; make_f32 creates the library's GEMM for an all-fp32 shape.
std::unique_ptr<Gemm> make_bf16_on_f32_gemm(const GemmShape& shape,
                                            std::unique_ptr<Gemm> (*make_f32)(const GemmShape&));

}  // namespace lnmlp::cpu
