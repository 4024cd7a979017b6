// The CPU kernels' FP8 decoding (src/cpu/fp8_operands.h's decode_operand, and quantize_to_operand
// beside the quantize-then-decode it replaces) compiled at one ISA level, as the library compiles it
// (tests/CMakeLists.txt builds this file once per level, with that level's -march and LNMLP_CPU_ISA): what
// tests/test_fp8_decode.cpp calls, only on a CPU that has the level. Nothing here runs at load time.
#include "cpu/fp8_operands.h"

#include "decode_at_level.h"

#include <type_traits>

namespace lnmlp::test {

void LNMLP_TEST_DECODE_FN(int threads, const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows,
                          int64_t cols, bool bf16, void* out) {
  cpu::decode_operand(threads, k, codes, scales, rows, cols, bf16 ? cpu::GemmType::BF16 : cpu::GemmType::F32, out);
}

// (No standard containers here: their inline code would be shared with the other levels' copies.)
void LNMLP_TEST_QUANTIZE_FN(int threads, const QuantKind& k, const void* in, bool in_bf16, int64_t rows, int64_t cols,
                            float scale, uint8_t* codes, void* scales, bool bf16, void* out, uint32_t* work) {
  const cpu::GemmType type = bf16 ? cpu::GemmType::BF16 : cpu::GemmType::F32;
  auto run = [&](auto d) {
    constexpr numerics::DType D = decltype(d)::value;
    const auto* x = static_cast<const numerics::storage_t<D>*>(in);
    if (codes == nullptr) {
      cpu::quantize_to_operand<D>(threads, k, x, rows, cols, scale, scales, type, out, work);
    } else {
      cpu::quantize_operand<D>(threads, k, x, rows, cols, scale, codes, scales, work);
      cpu::decode_operand(threads, k, codes, scales, rows, cols, type, out);
    }
  };
  if (in_bf16) run(std::integral_constant<numerics::DType, numerics::DType::BF16>{});
  else run(std::integral_constant<numerics::DType, numerics::DType::F32>{});
}

}  // namespace lnmlp::test
