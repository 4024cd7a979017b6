// The CPU kernels' FP8 decoding (src/cpu/fp8_operands.h's decode_operand) compiled at one ISA
// level, as the library compiles it (tests/CMakeLists.txt builds this file once per level, with
// that level's -march and LNMLP_CPU_ISA): what tests/test_fp8_decode.cpp calls, only on a CPU that
// has the level. Nothing here runs at load time.
#include "cpu/fp8_operands.h"

#include "decode_at_level.h"

namespace lnmlp::test {

void LNMLP_TEST_DECODE_FN(int threads, const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows,
                          int64_t cols, bool bf16, void* out) {
  cpu::decode_operand(threads, k, codes, scales, rows, cols, bf16 ? cpu::GemmType::BF16 : cpu::GemmType::F32, out);
}

}  // namespace lnmlp::test
