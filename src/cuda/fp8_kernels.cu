// FP8 kernels of the CUDA backend (see fp8_kernels.h). The scale arithmetic and the casts are
// src/numerics/scaling.h's and fp8.h's; the block layouts are the CPU backend's, so the codes and
// scales a plan saves are the same bits on both backends.
#include "device_util.cuh"
#include "fp8_kernels.h"
#include "numerics/fp8.h"
#include "numerics/quantize.h"
#include "numerics/scaling.h"

namespace lnmlp::cuda {
namespace {

using numerics::Fp8Format;

template <typename Fn> void with_fp8(Fp8Format f, Fn&& fn) { numerics::dispatch_fp8(f, fn); }

constexpr int kThreads = 256;

// ---- amax ----------------------------------------------------------------------------------

// max over a warp of magnitude bits (numerics/quantize.h: their integer max is the
// NaN-propagating amax, in any order).
__device__ __forceinline__ uint32_t warp_max(uint32_t m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = numerics::amax_bits_max(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// Warps' maxima, then atomicMax on integers (order-independent).
template <DType D> __global__ void __launch_bounds__(kThreads)
    amax_kernel(const storage_t<D>* __restrict__ x, int64_t n, uint32_t* amax_bits) {
  uint32_t m = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    m = numerics::amax_bits_max(m, numerics::magnitude_bits(load<D>(x[i])));
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(amax_bits, m);
}

__global__ void per_tensor_scale_kernel(const float* given, const float* state_scale, const uint32_t* amax_bits,
                                        float fmt_max, bool pow2, float eps, float* scale_out, float* used_out) {
  const float amax = amax_bits != nullptr ? numerics::amax_from_bits(*amax_bits) : 0.0f;
  const float s = numerics::per_tensor_scale(given, state_scale, amax, fmt_max, pow2, eps);
  scale_out[0] = s;
  scale_out[1] = 1.0f / s;
  if (used_out != nullptr) *used_out = s;
}

__global__ void delayed_update_kernel(float* state_q, int32_t len, const uint32_t* amax_bits, bool use_max,
                                      float fmt_max, int32_t margin) {
  state_q[0] = numerics::delayed_record_and_update(state_q + 1, len, numerics::amax_from_bits(*amax_bits), state_q[0],
                                                   use_max, fmt_max, margin);
}

// ---- per-tensor quantization, with the transposed copy -----------------------------------------

constexpr int kTile = 32, kTileRows = 8;

template <DType D, Fp8Format F> __global__ void __launch_bounds__(kTile* kTileRows)
    quantize_per_tensor_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols,
                               const float* __restrict__ scale, uint8_t* __restrict__ codes,
                               uint8_t* __restrict__ codes_t) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const float s = scale[0];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const uint8_t q = numerics::float_to_fp8<F>(load<D>(x[r * cols + c]) * s);
        if (codes != nullptr) codes[r * cols + c] = q;
        tile[i][threadIdx.x] = q;
      }
    }
    if (codes_t == nullptr) continue;  // uniform over the block
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) codes_t[c * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kTile* kTileRows)
    transpose_codes_kernel(const uint8_t* __restrict__ codes, int64_t rows, int64_t cols, uint8_t* __restrict__ out) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTile; r0 < rows; r0 += static_cast<int64_t>(gridDim.y) * kTile) {
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = codes[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][i];
    }
    __syncthreads();
  }
}

// ---- blocked quantization (BLOCK, MXFP8) ------------------------------------------------------

// A block's scale from its amax, and what its scale slot holds: the fp32 scale_inv (BLOCK) or
// the E8M0 byte (MXFP8), numerics/scaling.h's choice, as the CPU backend makes it.
template <Fp8Format F> struct BlockScaler {
  bool mx, pow2;
  float eps;
  __device__ numerics::BlockScaleChoice choose(float amax) const {
    return numerics::choose_block_scale(amax, numerics::Fp8Traits<F>::max, mx, pow2, eps);
  }
  __device__ void store(void* scales, int64_t i, const numerics::BlockScaleChoice& c) const {
    if (mx) static_cast<uint8_t*>(scales)[i] = c.e8m0;
    else static_cast<float*>(scales)[i] = c.scale_inv;
  }
};

// 1 x b blocks along rows: one warp per block (b = 32 or 128).
template <DType D, Fp8Format F> __global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, int64_t b, BlockScaler<F> sc,
                         uint8_t* __restrict__ codes, void* scales) {
  const int64_t nb = (cols + b - 1) / b, blocks = rows * nb;
  const int warps = kThreads / 32, lane = threadIdx.x & 31;
  for (int64_t blk = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5); blk < blocks;
       blk += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t r = blk / nb, c0 = (blk % nb) * b, w = cols - c0 < b ? cols - c0 : b;
    const storage_t<D>* xr = x + r * cols + c0;
    uint32_t m = 0;
    for (int64_t i = lane; i < w; i += 32) m = numerics::amax_bits_max(m, numerics::magnitude_bits(load<D>(xr[i])));
    const numerics::BlockScaleChoice ch = sc.choose(numerics::amax_from_bits(warp_max(m)));
    if (lane == 0) sc.store(scales, blk, ch);
    for (int64_t i = lane; i < w; i += 32)
      codes[r * cols + c0 + i] = numerics::float_to_fp8<F>(load<D>(xr[i]) * ch.scale);
  }
}

// b x 1 blocks down columns: one thread per (band, column), adjacent threads adjacent columns.
template <DType D, Fp8Format F> __global__ void __launch_bounds__(kThreads)
    quantize_cols_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, int64_t b, BlockScaler<F> sc,
                         uint8_t* __restrict__ codes, void* scales) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  for (int64_t band = blockIdx.y; band * b < rows; band += gridDim.y) {
    const int64_t r0 = band * b, r1 = r0 + b < rows ? r0 + b : rows;
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; ++r)
      m = numerics::amax_bits_max(m, numerics::magnitude_bits(load<D>(x[r * cols + c])));
    const numerics::BlockScaleChoice ch = sc.choose(numerics::amax_from_bits(m));
    sc.store(scales, band * cols + c, ch);
    for (int64_t r = r0; r < r1; ++r)
      codes[r * cols + c] = numerics::float_to_fp8<F>(load<D>(x[r * cols + c]) * ch.scale);
  }
}

// 128 x 128 weight tiles (BLOCK): one thread block per tile.
template <DType D, Fp8Format F> __global__ void __launch_bounds__(kThreads)
    quantize_tiles_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, int64_t b, BlockScaler<F> sc,
                          uint8_t* __restrict__ codes, void* scales) {
  __shared__ uint32_t warp_m[kThreads / 32];
  const int64_t nbc = (cols + b - 1) / b;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * b, c0 = static_cast<int64_t>(blockIdx.x) * b;
  const int64_t h = rows - r0 < b ? rows - r0 : b, w = cols - c0 < b ? cols - c0 : b;
  uint32_t m = 0;
  for (int64_t i = threadIdx.x; i < h * w; i += kThreads)
    m = numerics::amax_bits_max(m, numerics::magnitude_bits(load<D>(x[(r0 + i / w) * cols + c0 + i % w])));
  m = warp_max(m);
  if ((threadIdx.x & 31) == 0) warp_m[threadIdx.x >> 5] = m;
  __syncthreads();
  m = 0;
  for (int i = 0; i < kThreads / 32; ++i) m = numerics::amax_bits_max(m, warp_m[i]);
  const numerics::BlockScaleChoice ch = sc.choose(numerics::amax_from_bits(m));
  if (threadIdx.x == 0) sc.store(scales, static_cast<int64_t>(blockIdx.y) * nbc + blockIdx.x, ch);
  for (int64_t i = threadIdx.x; i < h * w; i += kThreads) {
    const int64_t idx = (r0 + i / w) * cols + c0 + i % w;
    codes[idx] = numerics::float_to_fp8<F>(load<D>(x[idx]) * ch.scale);
  }
}

// ---- decoding into GEMM operands ----------------------------------------------------------------

// fp8 value times the scale_inv of its block (numerics/quantize.h's block_scale_index).
template <Fp8Format F, bool F32Out> __global__ void __launch_bounds__(kThreads)
    decode_kernel(numerics::ScaleLayout layout, int64_t b, bool e8m0, const uint8_t* __restrict__ codes,
                  const void* __restrict__ scales, int64_t rows, int64_t cols, void* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    float s = 1.0f;
    if (layout != numerics::ScaleLayout::PerTensor) {
      const int64_t si = numerics::block_scale_index(layout, i / cols, i % cols, cols, b);
      s = e8m0 ? numerics::e8m0_to_float(static_cast<const uint8_t*>(scales)[si])
               : static_cast<const float*>(scales)[si];
    }
    const float v = numerics::fp8_to_float<F>(codes[i]) * s;
    if (F32Out) static_cast<float*>(out)[i] = v;
    else static_cast<uint16_t*>(out)[i] = store<DType::BF16>(v);
  }
}

template <DType D> __global__ void __launch_bounds__(kThreads)
    bias_round_kernel(const float* __restrict__ acc, int64_t rows, int64_t cols, const storage_t<D>* __restrict__ bias,
                      storage_t<D>* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    out[i] = store<D>(acc[i] + (bias != nullptr ? load<D>(bias[i % cols]) : 0.0f));
}

unsigned flat_grid(int64_t n) { return grid_dim((n + kThreads - 1) / kThreads, 8192); }

}  // namespace

void fp8_amax(DType in, const void* x, int64_t n, uint32_t* amax_bits, cudaStream_t stream) {
  cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream);
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    amax_kernel<D><<<flat_grid(n), kThreads, 0, stream>>>(static_cast<const storage_t<D>*>(x), n, amax_bits);
  });
}

void fp8_per_tensor_scale(const float* given, const float* state_scale, const uint32_t* amax_bits, float fmt_max,
                          bool power_2_scale, float amax_epsilon, float* scale_out, float* used_out,
                          cudaStream_t stream) {
  per_tensor_scale_kernel<<<1, 1, 0, stream>>>(given, state_scale, amax_bits, fmt_max, power_2_scale, amax_epsilon,
                                               scale_out, used_out);
}

void fp8_quantize_per_tensor(DType in, Fp8Format f, const void* x, int64_t rows, int64_t cols, const float* scale,
                             uint8_t* codes, uint8_t* codes_t, cudaStream_t stream) {
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    with_fp8(f, [&](auto ft) {
      constexpr Fp8Format F = decltype(ft)::value;
      const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), grid_dim((rows + kTile - 1) / kTile, kMaxGridY));
      quantize_per_tensor_kernel<D, F><<<grid, dim3(kTile, kTileRows), 0, stream>>>(
          static_cast<const storage_t<D>*>(x), rows, cols, scale, codes, codes_t);
    });
  });
}

void fp8_transpose_codes(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), grid_dim((rows + kTile - 1) / kTile, kMaxGridY));
  transpose_codes_kernel<<<grid, dim3(kTile, kTileRows), 0, stream>>>(codes, rows, cols, out);
}

void fp8_delayed_update(float* state_q, int32_t history_len, const uint32_t* amax_bits, bool use_max, float fmt_max,
                        int32_t margin, cudaStream_t stream) {
  delayed_update_kernel<<<1, 1, 0, stream>>>(state_q, history_len, amax_bits, use_max, fmt_max, margin);
}

void fp8_quantize_blocked(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols, uint8_t* codes,
                          void* scales, cudaStream_t stream) {
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    with_fp8(k.format, [&](auto ft) {
      constexpr Fp8Format F = decltype(ft)::value;
      const BlockScaler<F> sc{k.recipe == Recipe::Mxfp8, k.power_2_scale, k.amax_epsilon};
      const auto* xs = static_cast<const storage_t<D>*>(x);
      const int64_t b = k.block();
      if (k.tiles()) {
        const dim3 grid(static_cast<unsigned>((cols + b - 1) / b), static_cast<unsigned>((rows + b - 1) / b));
        quantize_tiles_kernel<D, F><<<grid, kThreads, 0, stream>>>(xs, rows, cols, b, sc, codes, scales);
      } else if (k.contract == Contract::Cols) {
        const int64_t blocks = rows * ((cols + b - 1) / b);
        quantize_rows_kernel<D, F><<<grid_dim((blocks + 7) / 8, 8192), kThreads, 0, stream>>>(xs, rows, cols, b, sc,
                                                                                              codes, scales);
      } else {
        const dim3 grid(column_blocks(cols), grid_dim((rows + b - 1) / b, kMaxGridY));
        quantize_cols_kernel<D, F><<<grid, kThreads, 0, stream>>>(xs, rows, cols, b, sc, codes, scales);
      }
    });
  });
}

void fp8_decode_operand(const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                        bool f32_out, void* out, cudaStream_t stream) {
  const numerics::ScaleLayout layout = k.scale_layout();
  const bool e8m0 = k.recipe == Recipe::Mxfp8;
  with_fp8(k.format, [&](auto ft) {
    constexpr Fp8Format F = decltype(ft)::value;
    const unsigned grid = flat_grid(rows * cols);
    if (f32_out)
      decode_kernel<F, true><<<grid, kThreads, 0, stream>>>(layout, k.block(), e8m0, codes, scales, rows, cols, out);
    else
      decode_kernel<F, false><<<grid, kThreads, 0, stream>>>(layout, k.block(), e8m0, codes, scales, rows, cols, out);
  });
}

void bias_round(DType d, const float* acc, int64_t rows, int64_t cols, const void* bias, void* out,
                cudaStream_t stream) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    bias_round_kernel<D><<<flat_grid(rows * cols), kThreads, 0, stream>>>(
        acc, rows, cols, static_cast<const storage_t<D>*>(bias), static_cast<storage_t<D>*>(out));
  });
}

}  // namespace lnmlp::cuda
