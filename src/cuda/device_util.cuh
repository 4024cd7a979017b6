// Device helpers shared by the CUDA kernels: dtype dispatch, a deterministic block sum, the
// activation chosen at run time (the formulas are src/numerics/activation.h's).
#pragma once

#include "numerics/activation.h"
#include "numerics/dtype.h"
#include "kernels.h"

namespace lnmlp::cuda {

using namespace lnmlp::numerics;

// Calls fn(std::integral_constant<DType, D>{}) for the runtime dtype.
template <typename Fn> void with_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::F32: fn(std::integral_constant<DType, DType::F32>{}); return;
    case DType::BF16: fn(std::integral_constant<DType, DType::BF16>{}); return;
    case DType::F16: fn(std::integral_constant<DType, DType::F16>{}); return;
  }
}

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

// f(x) and f'(x) for an activation known at run time (uniform across the grid, so no divergence).
__device__ __forceinline__ float act_value_rt(Act a, float x, const ActParams& p) {
  switch (a) {
    case Act::Relu: return act_value<Act::Relu>(x, p);
    case Act::Gelu: return act_value<Act::Gelu>(x, p);
    case Act::Silu: return act_value<Act::Silu>(x, p);
    case Act::QuickGelu: return act_value<Act::QuickGelu>(x, p);
    case Act::SquaredRelu: return act_value<Act::SquaredRelu>(x, p);
    case Act::Sigmoid: return act_value<Act::Sigmoid>(x, p);
    case Act::ClampedSilu: return act_value<Act::ClampedSilu>(x, p);
    case Act::ClampedLinear: return act_value<Act::ClampedLinear>(x, p);
    case Act::Linear: break;
  }
  return act_value<Act::Linear>(x, p);
}

__device__ __forceinline__ float act_grad_rt(Act a, float x, const ActParams& p) {
  switch (a) {
    case Act::Relu: return act_grad<Act::Relu>(x, p);
    case Act::Gelu: return act_grad<Act::Gelu>(x, p);
    case Act::Silu: return act_grad<Act::Silu>(x, p);
    case Act::QuickGelu: return act_grad<Act::QuickGelu>(x, p);
    case Act::SquaredRelu: return act_grad<Act::SquaredRelu>(x, p);
    case Act::Sigmoid: return act_grad<Act::Sigmoid>(x, p);
    case Act::ClampedSilu: return act_grad<Act::ClampedSilu>(x, p);
    case Act::ClampedLinear: return act_grad<Act::ClampedLinear>(x, p);
    case Act::Linear: break;
  }
  return act_grad<Act::Linear>(x, p);
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
