// Device helpers shared by the CUDA kernels: a deterministic block sum and grid sizes. The
// formulas and the dtype and activation dispatch are src/numerics/'s.
#pragma once

#include "kernels.h"
#include "numerics/activation.h"
#include "numerics/dtype.h"

namespace lnmlp::cuda {

using namespace lnmlp::numerics;

// The one dtype switch (numerics/dtype.h), for the launchers.
template <typename Fn> void with_dtype(DType d, Fn&& fn) { dispatch_dtype(d, fn); }

// Sum of v over the block (blockDim.x == Threads), the same value in every thread. The order is
// fixed (a butterfly in each warp, then the warps in order), so the result is deterministic.
// Every thread of the block must call it.
template <int Threads> __device__ __forceinline__ float block_sum(float v, float* shm) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "whole warps");
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // shm may still be read by a previous call
  if ((threadIdx.x & 31) == 0) shm[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < Threads / 32; ++w) s += shm[w];
  return s;
}

// Grid sizes: at most this many blocks along a grid-stride dimension.
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kMaxGridX = int64_t{1} << 20;
// Rows each thread of a grid-stride column kernel handles (at least): several independent loads in
// flight per thread, which the memory system needs to approach its bandwidth.
constexpr int64_t kRowsPerThread = 4;

inline unsigned grid_dim(int64_t n, int64_t cap) { return static_cast<unsigned>(n < cap ? (n < 1 ? 1 : n) : cap); }

inline unsigned column_blocks(int64_t cols) { return static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads); }

}  // namespace lnmlp::cuda
