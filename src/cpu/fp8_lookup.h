// FP8 decoding by table lookup, where the CPU kernels are compiled with AVX-512BW (the x86-64-v4
// level, src/cpu/isa.h): 32 codes at a time through vpermt2w over a 256-word table held in eight
// registers. The table is filled from numerics/fp8.h's fp8_to_float, so it decodes every code to
// the same bits; it replaces only the arithmetic, which takes some 20 vector instructions per 16
// codes where the lookup takes about 10 per 32. Below AVX-512 the kernels decode arithmetically.
//
// Two tables per format: the bf16 a code decodes to (an operand with no block scale: per-tensor
// recipes multiply their scale_inv in the GEMM's epilogue), and the high half of its fp32 value,
// whose low half is zero for every fp8 code (3 or 2 mantissa bits).
#pragma once

#include "isa.h"

#include <cstdint>

#if defined(__AVX512BW__)
#include <immintrin.h>
#define LNMLP_CPU_FP8_LOOKUP 1
#else
#define LNMLP_CPU_FP8_LOOKUP 0
#endif

#include "numerics/dtype.h"
#include "numerics/fp8.h"

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {

#if LNMLP_CPU_FP8_LOOKUP

// Codes decoded 32 at a time.
constexpr int64_t kFp8LookupWidth = 32;

// The 256 codes' words: bf16_words, numerics::store<BF16>(fp8_to_float(code)) (a NaN becomes
// bf16's canonical NaN, as there); otherwise float_bits(fp8_to_float(code)) >> 16.
struct Fp8Words {
  alignas(64) uint16_t w[256];
};
template <numerics::Fp8Format F, bool bf16_words> const Fp8Words& fp8_words() {
  static const Fp8Words table = [] {
    Fp8Words t;
    for (int c = 0; c < 256; ++c) {
      const float v = numerics::fp8_to_float<F>(static_cast<uint8_t>(c));
      t.w[c] =
          bf16_words ? numerics::store<numerics::DType::BF16>(v) : static_cast<uint16_t>(numerics::float_bits(v) >> 16);
    }
    return t;
  }();
  return table;
}

// The lanes of the first n (<= 32) of 32 16-bit lanes.
inline __mmask32 first_lanes(int64_t n) {
  return n >= kFp8LookupWidth ? ~__mmask32{0} : static_cast<__mmask32>((uint32_t{1} << n) - 1u);
}

// The table in eight registers (codes 32 i .. 32 i + 31 in w[i]): held by value, so that the
// compiler need not reload it after each store (a store through any pointer may alias the table).
struct Fp8WordLookup {
  __m512i w[8];
  explicit Fp8WordLookup(const Fp8Words& t) {
    for (int i = 0; i < 8; ++i) w[i] = _mm512_load_si512(t.w + 32 * i);
  }
  // The words of 32 codes (zero-extended to 16 bits).
  __m512i operator()(__m512i code) const {
    // vpermt2w picks among 64 words by the index's low 6 bits; bits 6 and 7 pick the pair of registers.
    const __m512i w0 = _mm512_permutex2var_epi16(w[0], code, w[1]);
    const __m512i w1 = _mm512_permutex2var_epi16(w[2], code, w[3]);
    const __m512i w2 = _mm512_permutex2var_epi16(w[4], code, w[5]);
    const __m512i w3 = _mm512_permutex2var_epi16(w[6], code, w[7]);
    const __mmask32 bit6 = _mm512_test_epi16_mask(code, _mm512_set1_epi16(0x40));
    const __mmask32 bit7 = _mm512_test_epi16_mask(code, _mm512_set1_epi16(0x80));
    return _mm512_mask_blend_epi16(bit7, _mm512_mask_blend_epi16(bit6, w0, w1), _mm512_mask_blend_epi16(bit6, w2, w3));
  }
};

// 32 codes from q, the lanes past n (< 32) zero. (The zero-masked forms of the widening
// intrinsics throughout: GCC 12 reports their plain forms' "undefined" pass-through operand as
// maybe-uninitialized.)
inline __m512i load_codes(const uint8_t* q, int64_t n) {
  const __m256i bytes = n >= kFp8LookupWidth ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))
                                             : _mm256_maskz_loadu_epi8(first_lanes(n), q);
  return _mm512_maskz_cvtepu8_epi16(~__mmask32{0}, bytes);
}

// out[i] = store<BF16>(fp8_to_float(q[i])) for i < n. Whole groups of 32 are stored unmasked
// (masked stores are slow on AMD's AVX-512), the tail masked.
template <numerics::Fp8Format F> void fp8_to_bf16_lookup(const uint8_t* q, int64_t n, uint16_t* out) {
  const Fp8WordLookup lookup(fp8_words<F, true>());
  int64_t i = 0;
  for (; i + kFp8LookupWidth <= n; i += kFp8LookupWidth)
    _mm512_storeu_si512(out + i, lookup(load_codes(q + i, kFp8LookupWidth)));
  if (i < n) _mm512_mask_storeu_epi16(out + i, first_lanes(n - i), lookup(load_codes(q + i, n - i)));
}

// out[i] = fp8_to_float(q[i]) for i < n, written in whole groups of 32 (out has room for n rounded
// up to a multiple of 32).
template <numerics::Fp8Format F> void fp8_to_float_lookup(const uint8_t* q, int64_t n, float* out) {
  const Fp8WordLookup lookup(fp8_words<F, false>());
  const __mmask16 all = 0xffff;
  for (int64_t i = 0; i < n; i += kFp8LookupWidth) {
    const __m512i w = lookup(load_codes(q + i, n - i));
    const __m512i low =
        _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, _mm512_maskz_extracti64x4_epi64(0xf, w, 0)), 16);
    const __m512i high =
        _mm512_maskz_slli_epi32(all, _mm512_maskz_cvtepu16_epi32(all, _mm512_maskz_extracti64x4_epi64(0xf, w, 1)), 16);
    _mm512_storeu_si512(out + i, low);
    _mm512_storeu_si512(out + i + 16, high);
  }
}

#endif  // LNMLP_CPU_FP8_LOOKUP

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
