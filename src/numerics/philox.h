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

constexpr uint32_t kPhiloxMul0 = 0xD2511F53u, kPhiloxMul1 = 0xCD9E8D57u;    // the round multipliers
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u, kPhiloxWeyl1 = 0xBB67AE85u;  // the key schedule's increments

// One Philox4x32 round of the counter words (c0, c1, c2, c3) under the round key (k0, k1).
LNMLP_HD void philox_round(uint32_t& c0, uint32_t& c1, uint32_t& c2, uint32_t& c3, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxMul0) * c0, p1 = static_cast<uint64_t>(kPhiloxMul1) * c2;
  const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
  c0 = n0;
  c1 = static_cast<uint32_t>(p1);
  c2 = n2;
  c3 = static_cast<uint32_t>(p0);
}

// Philox4x32 with 10 rounds of counter `c` under key (k0, k1).
LNMLP_HD Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    philox_round(c.v[0], c.v[1], c.v[2], c.v[3], k0, k1);
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
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

// philox_block of m block numbers at once (m <= kPhiloxBatch): word w of blocks[i]'s result into
// out[w][i]. The lanes' rounds run side by side over arrays, which the host compiler vectorizes
// (the 32x32 -> 64-bit products as vector multiplies), where philox_block's one block at a time
// does not; the bits are philox_block's.
constexpr int kPhiloxBatch = 128;
LNMLP_HOST_INLINE void philox_blocks(uint64_t seed, uint64_t offset, const uint64_t* blocks, int m,
                                     uint32_t out[4][kPhiloxBatch]) {
  uint32_t *c0 = out[0], *c1 = out[1], *c2 = out[2], *c3 = out[3];
  for (int i = 0; i < m; ++i) {
    c0[i] = static_cast<uint32_t>(blocks[i]);
    c1[i] = static_cast<uint32_t>(blocks[i] >> 32);
    c2[i] = static_cast<uint32_t>(offset);
    c3[i] = static_cast<uint32_t>(offset >> 32);
  }
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
#if defined(_OPENMP) && !defined(__CUDA_ARCH__)  // as quantize.h's LNMLP_QUANT_SIMD
#pragma omp simd
#endif
    for (int i = 0; i < m; ++i) philox_round(c0[i], c1[i], c2[i], c3[i], k0, k1);
    k0 += kPhiloxWeyl0;
    k1 += kPhiloxWeyl1;
  }
}

}  // namespace lnmlp::numerics
