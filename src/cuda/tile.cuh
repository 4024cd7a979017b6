// The tile of the elementwise kernels that may write a transposed copy (kernels.h): kTileThreads
// threads cover kTileDim x kTileDim elements, thread (tx, ty) = (threadIdx.x % 16, threadIdx.x / 16)
// the 4 rows ty + 16 i (i < 4) and the 4 consecutive columns 4 tx .. 4 tx + 3, so that a warp
// reads and writes whole row segments; the transposed copy goes through shared memory and is
// written in whole row segments of the transposed tensor too.
#pragma once

#include "device_util.cuh"

namespace lnmlp::cuda {

constexpr int kTileRowStep = kTileThreads / 16;  // rows between a thread's four rows
static_assert(kTileRowStep * 4 == kTileDim, "a thread's four rows span the tile");
static_assert(16 * 4 == kTileDim, "16 threads of four columns span the tile");

struct TileThread {
  int tx, ty;
  __device__ TileThread() : tx(static_cast<int>(threadIdx.x & 15u)), ty(static_cast<int>(threadIdx.x >> 4)) {}
  __device__ int64_t row(int64_t r0, int i) const { return r0 + ty + kTileRowStep * i; }
  __device__ int64_t col(int64_t c0) const { return c0 + 4 * tx; }
};

// The codes of one tile, for the transposed write (4 bytes of padding per row).
using TileCodes = uint8_t[kTileDim][kTileDim + 4];

// A Dim x Dim tile's codes in smem (rows r0 .., columns c0 .. of a [rows, cols] block at column
// col_off) written transposed into codes_t [.., rows]: a thread writes four bytes of transposed row
// k (column k of the tile: its rows 4 g .. 4 g + 3). A warp takes 8 consecutive g of 4 columns
// k four apart, so that its shared reads fall in 32 distinct banks and its global writes are four
// runs of 32 bytes. Every thread of the block (Threads of them) must call it; it synchronizes
// before reading smem and after (the next tile may refill it).
template <int Dim, int Threads = kTileThreads>
__device__ __forceinline__ void write_transposed_codes(const uint8_t (&smem)[Dim][Dim + 4], int64_t r0, int64_t c0,
                                                       int64_t rows, int64_t cols, int64_t col_off, uint8_t* codes_t) {
  static_assert(Dim * Dim / 4 % Threads == 0 && Threads % 32 == 0, "whole passes of whole warps");
  // Row 4 g + i, word w is bank (4 g S + i S + w) mod 32 for rows of S words: with S odd, the 8 g
  // of a warp take 8 distinct multiples of 4, and its 4 words w the rest.
  static_assert(Dim % 32 == 0 && (Dim + 4) / 4 % 2 == 1, "the padded rows' banks");
  constexpr int kGroupsOf8 = Dim / 32;  // of the Dim / 4 groups g of four rows
  __syncthreads();
  const bool vec_t = rows % 4 == 0;
#pragma unroll
  for (int pass = 0; pass < Dim * Dim / 4 / Threads; ++pass) {
    const int idx = pass * Threads + static_cast<int>(threadIdx.x);
    const int lane = idx & 31, chunk = idx >> 5;  // a chunk: 8 g by 4 k, for one (kb, ks, gb)
    const int gb = chunk % kGroupsOf8, ks = (chunk / kGroupsOf8) % 4, kb = chunk / kGroupsOf8 / 4;
    const int k = 16 * kb + 4 * (lane >> 3) + ks, g = 8 * gb + (lane & 7);
    const int64_t r = r0 + 4 * g;
    if (c0 + k >= cols || r >= rows) continue;
    const uint8_t q[4] = {smem[4 * g][k], smem[4 * g + 1][k], smem[4 * g + 2][k], smem[4 * g + 3][k]};
    uint8_t* dst = codes_t + (col_off + c0 + k) * rows + r;
    if (vec_t) store_codes4<true>(dst, 4, q);
    else store_codes4<false>(dst, valid4(r, rows), q);
  }
  __syncthreads();
}

// Writes a tile of values (thread t's v[i][j] at row th.row(r0, i), column th.col(c0) + j) of one
// [rows, cols] block of a [rows, ld] output whose columns start at col_off (the second half of a
// gated dh starts at F) where the caller asks:
//  - out: the values in the dtype D (out_f32: fp32), row stride ld;
//  - o.codes / o.codes_t: their FP8 codes with *o.scale (passed in `scale`), rowwise at the same
//    places, and transposed into [ld, rows] (row col_off + c, column r) through `smem`;
//  - amax: the magnitude-bits max of the values, folded into the thread's running `amax`.
// Vec: cols and ld multiples of 4 (load4/store4). Every thread of the block must call it.
template <DType D, bool Vec>
__device__ __forceinline__ void write_tile(const float (&v)[4][4], int64_t r0, int64_t c0, int64_t rows, int64_t cols,
                                           int64_t ld, int64_t col_off, void* out, bool out_f32, const Fp8Out& o,
                                           float scale, uint32_t& amax, TileCodes& smem) {
  const TileThread th;
  const int64_t c = th.col(c0);
  const int n = valid4(c, cols);
  const bool quantize = o.codes != nullptr || o.codes_t != nullptr;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = th.row(r0, i);
    if (r >= rows || n == 0) continue;
    const int64_t at = r * ld + col_off + c;
    if (out != nullptr) {
      if (out_f32) store4<DType::F32, Vec>(static_cast<float*>(out) + at, n, v[i]);
      else store4<D, Vec>(static_cast<storage_t<D>*>(out) + at, n, v[i]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < n) amax = amax_bits_max(amax, magnitude_bits(v[i][j]));
    if (quantize) {
      uint8_t q[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) q[j] = fp8_code(v[i][j], scale, o.e5m2);
      if (o.codes != nullptr) store_codes4<Vec>(o.codes + at, n, q);
      store_codes4<true>(&smem[th.ty + kTileRowStep * i][4 * th.tx], 4, q);  // one 32-bit shared store
    }
  }
  if (o.codes_t != nullptr) write_transposed_codes<kTileDim>(smem, r0, c0, rows, cols, col_off, o.codes_t);  // uniform
}

}  // namespace lnmlp::cuda
