// The counter-based random numbers of lnmlp's stochastic operations (NVFP4's stochastic rounding;
// docs/design.md, "NVFP4"): Philox4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers:
// as easy as 1, 2, 3", SC 2011), the generator of Random123 and cuRAND. Being counter-based, an
// element's random bits depend only on the key and the element's index, never on which thread or
// device draws them or in what order: the CPU and CUDA backends give the same bits, at any
// thread count.
//
// How lnmlp keys it (philox_bits): key = the call's 64-bit seed, counter = (index / 4 as 64 bits,
// the call's 64-bit offset), and element `index` takes word index % 4 of the result. Checked
// against Random123's published known-answer vectors (tests/test_philox.cpp).
#pragma once

#include <cstdint>

#include "hd.h"

namespace lnmlp::numerics {

struct Philox4x32 {
  uint32_t v[4];
};

// The high and low 32 bits of a * b.
LNMLP_HD void mul_hi_lo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds of counter `c` under key (k0, k1).
LNMLP_HD Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // the round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // the key schedule's increments
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mul_hi_lo(kMul0, c.v[0], &hi0, &lo0);
    mul_hi_lo(kMul1, c.v[2], &hi1, &lo1);
    c = Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

// The random bits of elements 4 * block .. 4 * block + 3 of a call keyed by (seed, offset).
LNMLP_HD Philox4x32 philox_block(uint64_t seed, uint64_t offset, uint64_t block) {
  return philox4x32_10(Philox4x32{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                   static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}},
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// The 32 random bits of element `index` of a call keyed by (seed, offset).
LNMLP_HD uint32_t philox_bits(uint64_t seed, uint64_t offset, uint64_t index) {
  return philox_block(seed, offset, index >> 2).v[index & 3];
}

// The bits of elements first .. first + n - 1 into bits[0 .. n-1]: philox_bits of each, one
// generator call per 4 elements.
LNMLP_HD void philox_span(uint64_t seed, uint64_t offset, uint64_t first, int64_t n, uint32_t* bits) {
  int64_t i = 0;
  while (i < n) {
    const uint64_t index = first + static_cast<uint64_t>(i);
    const Philox4x32 r = philox_block(seed, offset, index >> 2);
    for (uint64_t w = index & 3; w < 4 && i < n; ++w, ++i) bits[i] = r.v[w];
  }
}

}  // namespace lnmlp::numerics
