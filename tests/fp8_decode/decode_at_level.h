// decode_operand and quantize_to_operand at each ISA level this build compiles the CPU kernels for
// (decode_at_level.cpp).
#pragma once

#include <cstdint>

#include "plan/fp8_recipe.h"

namespace lnmlp::test {

// Decodes codes [rows, cols] with k's scales into bf16 (else fp32) out, as the CPU backend does
// for a GEMM operand.
using DecodeFn = void (*)(int threads, const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows,
                          int64_t cols, bool bf16, void* out);

// Quantizes in [rows, cols] (bf16 bits when in_bf16, else fp32) for k, with `scale` per tensor,
// into the bf16 (else fp32) GEMM operand out and the block scales: through codes [rows, cols] and
// decode_operand, or straight (quantize_to_operand) where codes is NULL. work: threads * cols.
using QuantizeToOperandFn = void (*)(int threads, const QuantKind& k, const void* in, bool in_bf16, int64_t rows,
                                     int64_t cols, float scale, uint8_t* codes, void* scales, bool bf16, void* out,
                                     uint32_t* work);

#define LNMLP_TEST_DECLARE_DECODE(ns)                                                                               \
  void decode_operand_##ns(int threads, const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows, \
                           int64_t cols, bool bf16, void* out);                                                     \
  void quantize_to_operand_##ns(int threads, const QuantKind& k, const void* in, bool in_bf16, int64_t rows,        \
                                int64_t cols, float scale, uint8_t* codes, void* scales, bool bf16, void* out,      \
                                uint32_t* work);
LNMLP_TEST_DECLARE_DECODE(x86_64)
LNMLP_TEST_DECLARE_DECODE(x86_64_v3)
LNMLP_TEST_DECLARE_DECODE(x86_64_v4)
LNMLP_TEST_DECLARE_DECODE(native)
LNMLP_TEST_DECLARE_DECODE(portable)
#undef LNMLP_TEST_DECLARE_DECODE

}  // namespace lnmlp::test
