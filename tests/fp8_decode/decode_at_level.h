// decode_operand at each ISA level this build compiles the CPU kernels for (decode_at_level.cpp).
#pragma once

#include <cstdint>

#include "plan/fp8_recipe.h"

namespace lnmlp::test {

// Decodes codes [rows, cols] with k's scales into bf16 (else fp32) out, as the CPU backend does
// for a GEMM operand.
using DecodeFn = void (*)(int threads, const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows,
                          int64_t cols, bool bf16, void* out);

#define LNMLP_TEST_DECLARE_DECODE(ns)                                                                               \
  void decode_operand_##ns(int threads, const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows, \
                           int64_t cols, bool bf16, void* out);
LNMLP_TEST_DECLARE_DECODE(x86_64)
LNMLP_TEST_DECLARE_DECODE(x86_64_v3)
LNMLP_TEST_DECLARE_DECODE(x86_64_v4)
LNMLP_TEST_DECLARE_DECODE(native)
LNMLP_TEST_DECLARE_DECODE(portable)
#undef LNMLP_TEST_DECLARE_DECODE

}  // namespace lnmlp::test
