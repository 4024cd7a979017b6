// Device helpers shared by the CUDA kernels: a deterministic block sum, the amax reduction (one
// atomic per block), vector loads and stores of four elements, and grid sizes. The formulas and the
// dtype and activation dispatch are src/numerics/'s.
#pragma once

#include "check.h"
#include "kernels.h"
#include "numerics/activation.h"
#include "numerics/dtype.h"
#include "numerics/quantize.h"

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

// The max of magnitude bits over a warp (numerics/quantize.h: their integer max is the
// NaN-propagating amax, in any order).
__device__ __forceinline__ uint32_t warp_max_bits(uint32_t m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = amax_bits_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// Folds each thread's magnitude-bits max into *amax_bits (NULL: nothing) with one atomicMax per
// block (an integer max: order-independent). Every thread of the block must call it.
template <int Threads> __device__ __forceinline__ void block_amax_to(uint32_t m, uint32_t* amax_bits) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "whole warps");
  __shared__ uint32_t warps[Threads / 32];
  if (amax_bits == nullptr) return;  // uniform over the grid
  m = warp_max_bits(m);
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t b = 0;
#pragma unroll
    for (int w = 0; w < Threads / 32; ++w) b = amax_bits_max(b, warps[w]);
    if (b != 0) atomicMax(amax_bits, b);
  }
}

// How many of the four elements from index i on lie before n (0 to 4).
__device__ __forceinline__ int valid4(int64_t i, int64_t n) {
  return i >= n ? 0 : (n - i >= 4 ? 4 : static_cast<int>(n - i));
}

// Four consecutive elements of a row, as floats. Vec: one 8-byte (16-bit types) or 16-byte (fp32)
// access, which needs the element index a multiple of 4 and the row length too (then every row
// starts 8- or 16-byte aligned, the base pointers being 16-byte aligned); else element by element,
// the first n of them (the rest are 0).
template <DType D, bool Vec> __device__ __forceinline__ void load4(const storage_t<D>* p, int n, float v[4]) {
  if constexpr (Vec) {
    if constexpr (D == DType::F32) {
      const float4 q = *reinterpret_cast<const float4*>(p);
      v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(p);
      v[0] = load<D>(static_cast<uint16_t>(q.x & 0xffffu));
      v[1] = load<D>(static_cast<uint16_t>(q.x >> 16));
      v[2] = load<D>(static_cast<uint16_t>(q.y & 0xffffu));
      v[3] = load<D>(static_cast<uint16_t>(q.y >> 16));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = i < n ? load<D>(p[i]) : 0.0f;
  }
}

// Stores the first n of four values, rounded to D, as load4 reads them.
template <DType D, bool Vec> __device__ __forceinline__ void store4(storage_t<D>* p, int n, const float v[4]) {
  if constexpr (Vec) {
    if constexpr (D == DType::F32) {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      uint2 q;
      q.x = static_cast<uint32_t>(store<D>(v[0])) | (static_cast<uint32_t>(store<D>(v[1])) << 16);
      q.y = static_cast<uint32_t>(store<D>(v[2])) | (static_cast<uint32_t>(store<D>(v[3])) << 16);
      *reinterpret_cast<uint2*>(p) = q;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (i < n) p[i] = store<D>(v[i]);
  }
}

// Four FP8 codes (bytes) at p: one 4-byte store (Vec), or the first n bytes.
template <bool Vec> __device__ __forceinline__ void store_codes4(uint8_t* p, int n, const uint8_t q[4]) {
  if constexpr (Vec) {
    *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(q[0]) | (static_cast<uint32_t>(q[1]) << 8) |
                                      (static_cast<uint32_t>(q[2]) << 16) | (static_cast<uint32_t>(q[3]) << 24);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (i < n) p[i] = q[i];
  }
}

// The FP8 code of x * scale in the format (E5M2 when e5m2, else E4M3): numerics/fp8.h's cast.
__device__ __forceinline__ uint8_t fp8_code(float x, float scale, bool e5m2) {
  return e5m2 ? float_to_fp8<Fp8Format::E5M2>(x * scale) : float_to_fp8<Fp8Format::E4M3>(x * scale);
}

// Grid limits of every device lnmlp runs on (compute capability 8.0 and up): 2^31 - 1 blocks along
// x, 65535 along y.
constexpr int64_t kMaxGridY = 65535;
constexpr int64_t kDeviceMaxGridX = (int64_t{1} << 31) - 1;
// At most this many blocks along a grid-stride x dimension.
constexpr int64_t kMaxGridX = int64_t{1} << 20;

inline unsigned grid_dim(int64_t n, int64_t cap) { return static_cast<unsigned>(n < cap ? (n < 1 ? 1 : n) : cap); }

// A launch grid of x by y blocks (at least one each), checked against the device's limits: a grid
// beyond them fails here, naming the kernel, rather than as an invalid configuration that the
// pass reports at its end.
inline dim3 grid_2d(int64_t x, int64_t y, const char* kernel) {
  if (x > kDeviceMaxGridX || y > kMaxGridY)
    fail(LNMLP_ERROR_INTERNAL, "the grid of ", kernel, ", ", x, " x ", y, " blocks, is beyond the device's limits (",
         kDeviceMaxGridX, " x ", kMaxGridY, ")");
  return dim3(static_cast<unsigned>(x < 1 ? 1 : x), static_cast<unsigned>(y < 1 ? 1 : y));
}

inline unsigned column_blocks(int64_t cols) { return static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads); }

// Whether rows of `cols` elements take the Vec path of load4/store4 (every base pointer the
// kernels get is 16-byte aligned: the workspace's regions and the saved buffer's are 256-byte
// aligned, and the caller's pointers are checked against 16).
inline bool vec4(int64_t cols) { return cols % 4 == 0; }

}  // namespace lnmlp::cuda
