// The counter-based generator of src/numerics/philox.h against Random123's published known-answer
// vectors for Philox4x32-10 (tests/kat_vectors of github.com/DEShawResearch/random123: counter,
// key, result), and lnmlp's keying of it (philox_bits) against the definition in that header.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "numerics/philox.h"

namespace {

using lnmlp::numerics::Philox4x32;
using lnmlp::numerics::philox4x32_10;
using lnmlp::numerics::philox_bits;
using lnmlp::numerics::philox_block;
using lnmlp::numerics::philox_blocks;

struct Kat {
  Philox4x32 counter;
  uint32_t key[2];
  uint32_t result[4];
};

TEST(Philox, KnownAnswerVectors) {
  const Kat kats[] = {
      {{{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}},
       {0x00000000u, 0x00000000u},
       {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Philox4x32 r = philox4x32_10(k.counter, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], k.result[i]) << "word " << i << " of key " << std::hex << k.key[0];
  }
}

TEST(Philox, ElementBitsAreTheWordsOfTheirBlock) {
  const uint64_t seed = 0x0123456789abcdefull, offset = 0xfedcba9876543210ull;
  for (uint64_t index : {uint64_t{0}, uint64_t{5}, uint64_t{1} << 33, (uint64_t{1} << 40) + 7}) {
    const uint64_t block = index / 4;
    const Philox4x32 r = philox4x32_10(
        Philox4x32{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0x76543210u, 0xfedcba98u}},
        0x89abcdefu, 0x01234567u);
    EXPECT_EQ(philox_bits(seed, offset, index), r.v[index % 4]) << index;
  }
  // Different seeds, offsets and indices give different streams (no word repeats in a few thousand).
  std::set<uint32_t> seen;
  for (uint64_t i = 0; i < 1024; ++i) {
    seen.insert(philox_bits(1, 0, i));
    seen.insert(philox_bits(2, 0, i));
    seen.insert(philox_bits(1, 1, i));
  }
  EXPECT_EQ(seen.size(), 3u * 1024u);
}

// The batched generator the CPU quantizer draws with gives philox_block's words for every block
// number, at every batch length (a vectorized loop's body and its remainder).
TEST(Philox, BlocksAtOnceAreEachBlocksWords) {
  const uint64_t seed = 0x0123456789abcdefull, offset = 0xfedcba9876543210ull;
  uint64_t blocks[lnmlp::numerics::kPhiloxBatch];
  for (int i = 0; i < lnmlp::numerics::kPhiloxBatch; ++i)
    blocks[i] = (uint64_t{0x9e3779b97f4a7c15} * static_cast<uint64_t>(i + 1)) >> (i % 40);
  for (int m : {1, 3, 8, 17, 80, lnmlp::numerics::kPhiloxBatch}) {
    uint32_t words[4][lnmlp::numerics::kPhiloxBatch];
    philox_blocks(seed, offset, blocks, m, words);
    for (int i = 0; i < m; ++i) {
      const Philox4x32 want = philox_block(seed, offset, blocks[i]);
      for (int w = 0; w < 4; ++w) ASSERT_EQ(words[w][i], want.v[w]) << "block " << i << " of " << m << ", word " << w;
    }
  }
}

}  // namespace
