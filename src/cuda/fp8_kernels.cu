// FP8 kernels of the CUDA backend (see fp8_kernels.h). The scale arithmetic and the casts are
// src/numerics/scaling.h's and fp8.h's; the emulated recipes' block layouts are the CPU backend's,
// so the codes and scales a plan saves are the same bits on both backends. Reads and writes go
// four elements at a time where the row length allows (device_util.cuh), amaxes fold into one
// atomic per block, and no kernel divides 64-bit integers per element.
#include "fp8_kernels.h"
#include "numerics/fp8.h"
#include "numerics/quantize.h"
#include "numerics/quantize_nvfp4.h"
#include "numerics/scaling.h"
#include "tile.cuh"

namespace lnmlp::cuda {
namespace {

using numerics::Fp8Format;

template <typename Fn> void with_fp8(Fp8Format f, Fn&& fn) { numerics::dispatch_fp8(f, fn); }

constexpr int kThreads = 256;

// ---- amax, scales, the delayed update ----------------------------------------------------------

template <DType D, bool Vec> __global__ void __launch_bounds__(kThreads)
    amax_kernel(const storage_t<D>* __restrict__ x, int64_t n, uint32_t* amax_bits) {
  uint32_t m = 0;
  for (int64_t i = 4 * (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x); i < n;
       i += 4 * static_cast<int64_t>(gridDim.x) * kThreads) {
    float v[4];
    const int k = valid4(i, n);
    load4<D, Vec>(x + i, k, v);
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (j < k) m = amax_bits_max(m, magnitude_bits(v[j]));
  }
  block_amax_to<kThreads>(m, amax_bits);
}

__global__ void per_tensor_scale_kernel(const float* given, const float* state_scale, const uint32_t* amax_bits,
                                        float fmt_max, bool pow2, float eps, float* scale_out, float* used_out) {
  const float amax = amax_bits != nullptr ? numerics::amax_from_bits(*amax_bits) : 0.0f;
  const float s = numerics::per_tensor_scale(given, state_scale, amax, fmt_max, pow2, eps);
  scale_out[0] = s;
  scale_out[1] = 1.0f / s;
  if (used_out != nullptr) *used_out = s;
}

// numerics::delayed_record_and_update with the history's entries in parallel: the push moves
// segments of kHistoryThreads entries, oldest segment first, each entry reading its new value
// (history_pushed_entry: the entry before it) before any entry of its segment is written, so the
// shift is in place without a race; the reduction is the max of the new entries' magnitude bits
// (history_reduce's value: the same max, NaN if any entry is NaN), or the newest entry.
constexpr int kHistoryThreads = 1024;

__global__ void __launch_bounds__(kHistoryThreads)
    delayed_update_kernel(float* state_q, int32_t len, const uint32_t* amax_bits, bool use_max, float fmt_max,
                          int32_t margin) {
  __shared__ uint32_t warps[kHistoryThreads / 32];
  float* hist = state_q + 1;
  const float newest = numerics::amax_from_bits(*amax_bits);
  uint32_t m = 0;
  for (int base = (len - 1) / kHistoryThreads * kHistoryThreads; base >= 0; base -= kHistoryThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    const float v = i < len ? numerics::history_pushed_entry(hist, i, newest) : 0.0f;
    __syncthreads();
    if (i < len) {
      hist[i] = v;
      m = amax_bits_max(m, magnitude_bits(v));
    }
    __syncthreads();
  }
  m = warp_max_bits(m);
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x != 0) return;
  uint32_t all = 0;
  for (int w = 0; w < kHistoryThreads / 32; ++w) all = amax_bits_max(all, warps[w]);
  const float amax_h = use_max ? numerics::amax_from_bits(all) : newest;
  state_q[0] = numerics::delayed_scale_update(state_q[0], amax_h, fmt_max, margin);
}

// ---- per-tensor quantization, with the transposed copy -----------------------------------------

template <DType D, bool Vec> __global__ void __launch_bounds__(kTileThreads)
    quantize_tile_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, Fp8Out o) {
  __shared__ TileCodes smem;
  const float scale = *o.scale;
  const TileThread th;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileDim, c = th.col(c0);
  const int n = valid4(c, cols);
  uint32_t amax = 0;  // not wanted (o.amax_bits is NULL): the amax came first
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTileDim; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTileDim) {
    float v[4][4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = th.row(r0, i);
      if (r < rows && n > 0) load4<D, Vec>(x + r * cols + c, n, v[i]);
    }
    write_tile<D, Vec>(v, r0, c0, rows, cols, cols, 0, nullptr, false, o, scale, amax, smem);
  }
}

template <bool Vec> __global__ void __launch_bounds__(kTileThreads)
    transpose_codes_kernel(const uint8_t* __restrict__ codes, int64_t rows, int64_t cols, uint8_t* __restrict__ out) {
  __shared__ TileCodes smem;
  const TileThread th;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileDim, c = th.col(c0);
  const int n = valid4(c, cols);
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTileDim; r0 < rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTileDim) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = th.row(r0, i);
      if (r >= rows || n == 0) continue;
      const uint8_t* src = codes + r * cols + c;
      uint32_t w = 0;
      if (Vec) {
        w = *reinterpret_cast<const uint32_t*>(src);
      } else {
        for (int j = 0; j < n; ++j) w |= static_cast<uint32_t>(src[j]) << (8 * j);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) smem[th.ty + kTileRowStep * i][4 * th.tx + j] = static_cast<uint8_t>(w >> (8 * j));
    }
    write_transposed_codes<kTileDim>(smem, r0, c0, rows, cols, 0, out);
  }
}

// ---- blocked quantization ----------------------------------------------------------------------

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

// 1 x B blocks along rows, one warp per block (B = 32: a lane per element; B = 128: four), block
// kb of row r's scale at r * s_row + kb * s_block: the CPU backend's layout (s_row = blocks per
// row, s_block = 1) or cuBLASLt's (s_row = 1, s_block = rows rounded up to 4).
template <DType D, Fp8Format F, int B, bool Vec> __global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, BlockScaler<F> sc,
                         uint8_t* __restrict__ codes, void* scales, int64_t s_row, int64_t s_block) {
  static_assert(B == 32 || B == 128, "the recipes' block lengths");
  constexpr int E = B / 32;  // elements per lane
  const int64_t nb = (cols + B - 1) / B, blocks = rows * nb;
  const int warps = kThreads / 32, lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t blk = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5); blk < blocks;
       blk += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t r = blk / nb, kb = blk - r * nb, c0 = kb * B, w = cols - c0 < B ? cols - c0 : B;
    const int64_t at = r * cols + c0 + E * lane;
    const int n = min(valid4(E * lane, w), E);
    float v[4] = {};
    if (n > 0) {  // a lane past a partial block's end reads and writes nothing
      if constexpr (E == 4) load4<D, Vec>(x + at, n, v);
      else v[0] = load<D>(x[at]);
    }
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < E; ++j)
      if (j < n) m = amax_bits_max(m, magnitude_bits(v[j]));
    const numerics::BlockScaleChoice ch = sc.choose(numerics::amax_from_bits(warp_max_bits(m)));
    if (lane == 0) sc.store(scales, r * s_row + kb * s_block, ch);
    uint8_t q[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) q[j] = numerics::float_to_fp8<F>(v[j] * ch.scale);
    if (n > 0) {
      if constexpr (E == 4) store_codes4<Vec>(codes + at, n, q);
      else codes[at] = q[0];
    }
  }
}

// b x 1 blocks down columns, in place (the CPU backend's columnwise layout, emulated recipes): one
// thread per (band, column), adjacent threads adjacent columns.
template <DType D, Fp8Format F> __global__ void __launch_bounds__(kThreads)
    quantize_cols_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, int64_t b, BlockScaler<F> sc,
                         uint8_t* __restrict__ codes, void* scales) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  for (int64_t band = blockIdx.y; band * b < rows; band += gridDim.y) {
    const int64_t r0 = band * b, r1 = r0 + b < rows ? r0 + b : rows;
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; ++r) m = amax_bits_max(m, magnitude_bits(load<D>(x[r * cols + c])));
    const numerics::BlockScaleChoice ch = sc.choose(numerics::amax_from_bits(m));
    sc.store(scales, band * cols + c, ch);
    for (int64_t r = r0; r < r1; ++r)
      codes[r * cols + c] = numerics::float_to_fp8<F>(load<D>(x[r * cols + c]) * ch.scale);
  }
}

// 128 x 1 blocks down columns, written transposed (cuBLASLt's K-major columnwise operand): a block
// of threads takes bands of 128 rows by 32 columns through shared memory (grid-stride over the
// bands: the grid's y is capped); column c of band b gets its scale at b * s_band + c and its 128
// codes at codes_t[c * rows + 128 b ..], 16 bytes a thread.
constexpr int kBandCols = 32;
// Where element (row, col) of a band sits in its tile: the row padded to 33 floats, and the
// column rotated by 4 per 16 rows, so that neither the rowwise writes (a warp: 4 rows x 32
// columns) nor the column reads (a warp: 4 columns x rows 16 g + e, g = 0..7) meet two addresses
// in one bank: the banks are (row + col + 4 (row / 16)) mod 32.
__device__ __forceinline__ int band_col(int row, int col) { return (col + 4 * ((row >> 4) & 7)) & (kBandCols - 1); }
template <DType D, Fp8Format F, bool Vec> __global__ void __launch_bounds__(kThreads)
    quantize_cols_transposed_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, BlockScaler<F> sc,
                                    uint8_t* __restrict__ codes_t, void* scales_t, int64_t s_band) {
  constexpr int B = static_cast<int>(numerics::kBlockScalingLength);
  __shared__ float tile[B][kBandCols + 1];
  const int t = static_cast<int>(threadIdx.x);
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kBandCols;
  for (int64_t band = blockIdx.y; band * B < rows; band += gridDim.y) {
    const int64_t r0 = band * B;
    {  // 8 threads read a row's 32 columns, four each; 32 rows per step
      const int64_t c = c0 + 4 * (t & 7);
      const int n = valid4(c, cols);
#pragma unroll
      for (int i = 0; i < B / 32; ++i) {
        const int tr = (t >> 3) + 32 * i;
        const int64_t r = r0 + tr;
        float v[4] = {};
        if (r < rows && n > 0) load4<D, Vec>(x + r * cols + c, n, v);
#pragma unroll
        for (int j = 0; j < 4; ++j) tile[tr][band_col(tr, 4 * (t & 7) + j)] = v[j];  // outside the tensor: 0
      }
    }
    __syncthreads();
    const int k = t >> 3, g = t & 7;  // column k of the band, rows 16 g .. 16 g + 15
    uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) m = amax_bits_max(m, magnitude_bits(tile[16 * g + e][band_col(16 * g + e, k)]));
#pragma unroll
    for (int o = 1; o < 8; o <<= 1) m = amax_bits_max(m, __shfl_xor_sync(0xffffffffu, m, o));  // the column's 8
    const numerics::BlockScaleChoice ch = sc.choose(numerics::amax_from_bits(m));
    const int64_t c = c0 + k, r = r0 + 16 * g;
    if (c < cols && r < rows) {
      if (g == 0) sc.store(scales_t, band * s_band + c, ch);
      alignas(16) uint8_t q[16];
#pragma unroll
      for (int e = 0; e < 16; ++e)
        q[e] = numerics::float_to_fp8<F>(tile[16 * g + e][band_col(16 * g + e, k)] * ch.scale);
      uint8_t* dst = codes_t + c * rows + r;
      if (rows % 16 == 0) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(q);
      } else {
        for (int e = 0; e < 16 && r + e < rows; ++e) dst[e] = q[e];
      }
    }
    __syncthreads();  // the tile is read before the next band refills it
  }
}

// 128 x 128 weight tiles (BLOCK), one block of threads per tile (grid-stride over the tile rows:
// the grid's y is capped): its codes in place (codes, the scale at tile_row * s_tile_row +
// tile_col) and/or transposed (codes_t, the scale at tile_col * s_tile_row_t + tile_row). 32
// threads read a row's 128 columns, four each.
template <DType D, Fp8Format F, bool Vec> __global__ void __launch_bounds__(kThreads)
    quantize_tiles_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, BlockScaler<F> sc,
                          uint8_t* __restrict__ codes, void* scales, int64_t s_tile_row, uint8_t* __restrict__ codes_t,
                          void* scales_t, int64_t s_tile_row_t) {
  constexpr int B = static_cast<int>(numerics::kBlockScalingLength);
  constexpr int kRowsPerStep = kThreads / 32;
  __shared__ uint8_t tile[B][B + 4];
  __shared__ uint32_t warp_m[kThreads / 32];
  const int tx = static_cast<int>(threadIdx.x & 31), ty = static_cast<int>(threadIdx.x >> 5);
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * B;
  const int64_t c = c0 + 4 * tx;
  const int n = valid4(c, cols);
  for (int64_t tile_row = blockIdx.y; tile_row * B < rows; tile_row += gridDim.y) {
    const int64_t r0 = tile_row * B;
    uint32_t m = 0;
    for (int i = 0; i < B / kRowsPerStep; ++i) {
      const int64_t r = r0 + ty + kRowsPerStep * i;
      if (r >= rows || n == 0) continue;
      float v[4];
      load4<D, Vec>(x + r * cols + c, n, v);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (j < n) m = amax_bits_max(m, magnitude_bits(v[j]));
    }
    m = warp_max_bits(m);
    if (tx == 0) warp_m[ty] = m;
    __syncthreads();
    m = 0;
#pragma unroll
    for (int w = 0; w < kThreads / 32; ++w) m = amax_bits_max(m, warp_m[w]);
    const numerics::BlockScaleChoice ch = sc.choose(numerics::amax_from_bits(m));
    if (threadIdx.x == 0) {
      if (codes != nullptr) sc.store(scales, tile_row * s_tile_row + blockIdx.x, ch);
      if (codes_t != nullptr) sc.store(scales_t, static_cast<int64_t>(blockIdx.x) * s_tile_row_t + tile_row, ch);
    }
    for (int i = 0; i < B / kRowsPerStep; ++i) {
      const int tr = ty + kRowsPerStep * i;
      const int64_t r = r0 + tr;
      if (r >= rows || n == 0) continue;
      float v[4];
      load4<D, Vec>(x + r * cols + c, n, v);
      uint8_t q[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) q[j] = numerics::float_to_fp8<F>(v[j] * ch.scale);
      if (codes != nullptr) store_codes4<Vec>(codes + r * cols + c, n, q);
      store_codes4<true>(&tile[tr][4 * tx], 4, q);  // one 32-bit shared store (rows are 132 bytes)
    }
    if (codes_t != nullptr) write_transposed_codes<B, kThreads>(tile, r0, c0, rows, cols, 0, codes_t);  // uniform
    __syncthreads();  // warp_m and the tile are read before the next tile row refills them
  }
}

// ---- decoding into GEMM operands (emulated recipes) --------------------------------------------

// fp8 value times the scale_inv of its block (numerics/quantize.h's block_scale_index, with the
// block length a constant, so the index costs shifts): rows over the grid's y, four columns a thread.
template <Fp8Format F, bool F32Out, int B> __global__ void __launch_bounds__(kThreads)
    decode_kernel(numerics::ScaleLayout layout, bool e8m0, const uint8_t* __restrict__ codes,
                  const void* __restrict__ scales, int64_t rows, int64_t cols, void* __restrict__ out) {
  const bool vec = cols % 4 == 0;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = 4 * (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x); c < cols;
         c += 4 * static_cast<int64_t>(gridDim.x) * kThreads) {
      const int n = valid4(c, cols);
      const uint8_t* src = codes + r * cols + c;
      uint32_t w = 0;
      if (vec) {
        w = *reinterpret_cast<const uint32_t*>(src);
      } else {
        for (int j = 0; j < n; ++j) w |= static_cast<uint32_t>(src[j]) << (8 * j);
      }
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float s = 1.0f;
        if (layout != numerics::ScaleLayout::PerTensor) {
          const int64_t si = numerics::block_scale_index(layout, r, c + j, cols, B);
          s = e8m0 ? numerics::e8m0_to_float(static_cast<const uint8_t*>(scales)[si])
                   : static_cast<const float*>(scales)[si];
        }
        v[j] = j < n ? numerics::fp8_to_float<F>(static_cast<uint8_t>(w >> (8 * j))) * s : 0.0f;
      }
      if (F32Out) {
        if (vec) store4<DType::F32, true>(static_cast<float*>(out) + r * cols + c, n, v);
        else store4<DType::F32, false>(static_cast<float*>(out) + r * cols + c, n, v);
      } else {
        auto* o = static_cast<uint16_t*>(out) + r * cols + c;
        if (vec) store4<DType::BF16, true>(o, n, v);
        else store4<DType::BF16, false>(o, n, v);
      }
    }
}

// acc and out may be the same memory: each thread reads its elements before writing them.
template <DType D, bool Vec> __global__ void __launch_bounds__(kThreads)
    bias_round_kernel(const float* acc, int64_t rows, int64_t cols, const storage_t<D>* __restrict__ bias,
                      bool accumulate, storage_t<D>* out, const float* amax_a, const float* amax_b) {
  const float alpha = amax_a != nullptr ? numerics::nvfp4_gemm_alpha(*amax_a, *amax_b) : 1.0f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = 4 * (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x); c < cols;
         c += 4 * static_cast<int64_t>(gridDim.x) * kThreads) {
      const int n = valid4(c, cols);
      float a[4], b[4] = {};
      load4<DType::F32, Vec>(acc + r * cols + c, n, a);
      if (bias != nullptr) load4<D, Vec>(bias + c, n, b);
      if (accumulate) load4<D, Vec>(out + r * cols + c, n, b);  // no bias then
#pragma unroll
      for (int j = 0; j < 4; ++j) a[j] = a[j] * alpha + b[j];
      store4<D, Vec>(out + r * cols + c, n, a);
    }
}

unsigned flat_grid(int64_t n) { return grid_dim((n + 4 * kThreads - 1) / (4 * kThreads), 8192); }

// Rows over y, four columns a thread over x.
dim3 row_grid(int64_t rows, int64_t cols, const char* kernel) {
  return grid_2d(grid_dim((cols + 4 * kThreads - 1) / (4 * kThreads), 64), grid_dim(rows, grid_y_cap()), kernel);
}

dim3 tile_grid(int64_t rows, int64_t cols, const char* kernel) {
  return grid_2d((cols + kTileDim - 1) / kTileDim, grid_dim((rows + kTileDim - 1) / kTileDim, grid_y_cap()), kernel);
}

}  // namespace

void fp8_amax(DType in, const void* x, int64_t n, uint32_t* amax_bits, cudaStream_t stream) {
  cuda_check(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync (an amax)");
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* xs = static_cast<const storage_t<D>*>(x);
    if (vec4(n)) amax_kernel<D, true><<<flat_grid(n), kThreads, 0, stream>>>(xs, n, amax_bits);
    else amax_kernel<D, false><<<flat_grid(n), kThreads, 0, stream>>>(xs, n, amax_bits);
  });
  check_launch("amax_kernel", stream);
}

void fp8_per_tensor_scale(const float* given, const float* state_scale, const uint32_t* amax_bits, float fmt_max,
                          bool power_2_scale, float amax_epsilon, float* scale_out, float* used_out,
                          cudaStream_t stream) {
  per_tensor_scale_kernel<<<1, 1, 0, stream>>>(given, state_scale, amax_bits, fmt_max, power_2_scale, amax_epsilon,
                                               scale_out, used_out);
  check_launch("per_tensor_scale_kernel", stream);
}

void fp8_quantize_per_tensor(DType in, Fp8Format f, const void* x, int64_t rows, int64_t cols, const float* scale,
                             uint8_t* codes, uint8_t* codes_t, cudaStream_t stream) {
  Fp8Out o;
  o.scale = scale;
  o.e5m2 = f == Fp8Format::E5M2;
  o.codes = codes;
  o.codes_t = codes_t;
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* xs = static_cast<const storage_t<D>*>(x);
    if (vec4(cols))
      quantize_tile_kernel<D, true>
          <<<tile_grid(rows, cols, "quantize_tile_kernel"), kTileThreads, 0, stream>>>(xs, rows, cols, o);
    else
      quantize_tile_kernel<D, false>
          <<<tile_grid(rows, cols, "quantize_tile_kernel"), kTileThreads, 0, stream>>>(xs, rows, cols, o);
  });
  check_launch("quantize_tile_kernel", stream);
}

void fp8_transpose_codes(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* out, cudaStream_t stream) {
  if (vec4(cols))
    transpose_codes_kernel<true>
        <<<tile_grid(rows, cols, "transpose_codes_kernel"), kTileThreads, 0, stream>>>(codes, rows, cols, out);
  else
    transpose_codes_kernel<false>
        <<<tile_grid(rows, cols, "transpose_codes_kernel"), kTileThreads, 0, stream>>>(codes, rows, cols, out);
  check_launch("transpose_codes_kernel", stream);
}

void fp8_delayed_update(float* state_q, int32_t history_len, const uint32_t* amax_bits, bool use_max, float fmt_max,
                        int32_t margin, cudaStream_t stream) {
  delayed_update_kernel<<<1, kHistoryThreads, 0, stream>>>(state_q, history_len, amax_bits, use_max, fmt_max, margin);
  check_launch("delayed_update_kernel", stream);
}

namespace {

// The 1 x B row kernel for the block length of k, over rows x cols.
template <DType D, Fp8Format F> void launch_rows(const QuantKind& k, const storage_t<D>* x, int64_t rows, int64_t cols,
                                                 const BlockScaler<F>& sc, uint8_t* codes, void* scales, int64_t s_row,
                                                 int64_t s_block, cudaStream_t stream) {
  const int64_t blocks = rows * ((cols + k.block() - 1) / k.block());
  const unsigned grid = grid_dim((blocks + 7) / 8, 8192);
  if (k.block() == 32)
    quantize_rows_kernel<D, F, 32, false>
        <<<grid, kThreads, 0, stream>>>(x, rows, cols, sc, codes, scales, s_row, s_block);
  else if (vec4(cols))
    quantize_rows_kernel<D, F, 128, true>
        <<<grid, kThreads, 0, stream>>>(x, rows, cols, sc, codes, scales, s_row, s_block);
  else
    quantize_rows_kernel<D, F, 128, false>
        <<<grid, kThreads, 0, stream>>>(x, rows, cols, sc, codes, scales, s_row, s_block);
  check_launch("quantize_rows_kernel", stream);
}

template <DType D, Fp8Format F> void launch_tiles(const storage_t<D>* x, int64_t rows, int64_t cols,
                                                  const BlockScaler<F>& sc, uint8_t* codes, void* scales,
                                                  int64_t s_tile_row, uint8_t* codes_t, void* scales_t,
                                                  int64_t s_tile_row_t, cudaStream_t stream) {
  const int64_t b = numerics::kBlockScalingLength;
  const dim3 grid = grid_2d((cols + b - 1) / b, grid_dim((rows + b - 1) / b, grid_y_cap()), "quantize_tiles_kernel");
  if (vec4(cols))
    quantize_tiles_kernel<D, F, true>
        <<<grid, kThreads, 0, stream>>>(x, rows, cols, sc, codes, scales, s_tile_row, codes_t, scales_t, s_tile_row_t);
  else
    quantize_tiles_kernel<D, F, false>
        <<<grid, kThreads, 0, stream>>>(x, rows, cols, sc, codes, scales, s_tile_row, codes_t, scales_t, s_tile_row_t);
  check_launch("quantize_tiles_kernel", stream);
}

}  // namespace

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
        launch_tiles<D, F>(xs, rows, cols, sc, codes, scales, numerics::num_blocks(cols, b), nullptr, nullptr, 0,
                           stream);
      } else if (k.contract == Contract::Cols) {
        launch_rows<D, F>(k, xs, rows, cols, sc, codes, scales, numerics::num_blocks(cols, b), 1, stream);
      } else {
        const dim3 grid =
            grid_2d(column_blocks(cols), grid_dim((rows + b - 1) / b, grid_y_cap()), "quantize_cols_kernel");
        quantize_cols_kernel<D, F><<<grid, kThreads, 0, stream>>>(xs, rows, cols, b, sc, codes, scales);
        check_launch("quantize_cols_kernel", stream);
      }
    });
  });
}

void fp8_quantize_blocked_native(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols,
                                 uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t,
                                 cudaStream_t stream) {
  using numerics::num_blocks;
  using numerics::round_up4;
  const int64_t b = numerics::kBlockScalingLength;
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    with_fp8(k.format, [&](auto ft) {
      constexpr Fp8Format F = decltype(ft)::value;
      const BlockScaler<F> sc{false, k.power_2_scale, k.amax_epsilon};
      const auto* xs = static_cast<const storage_t<D>*>(x);
      if (k.tiles()) {  // [rows, cols] with K = cols, and [cols, rows] with K = rows
        launch_tiles<D, F>(xs, rows, cols, sc, codes, scales, round_up4(num_blocks(cols, b)), codes_t, scales_t,
                           round_up4(num_blocks(rows, b)), stream);
        return;
      }
      if (codes != nullptr)  // [outer = rows, K = cols]: scale (c / 128) * round_up4(rows) + r
        launch_rows<D, F>(k, xs, rows, cols, sc, codes, scales, 1, round_up4(rows), stream);
      if (codes_t != nullptr) {  // [outer = cols, K = rows]: scale (r / 128) * round_up4(cols) + c
        const dim3 grid = grid_2d((cols + kBandCols - 1) / kBandCols, grid_dim(num_blocks(rows, b), grid_y_cap()),
                                  "quantize_cols_transposed_kernel");
        if (vec4(cols))
          quantize_cols_transposed_kernel<D, F, true>
              <<<grid, kThreads, 0, stream>>>(xs, rows, cols, sc, codes_t, scales_t, round_up4(cols));
        else
          quantize_cols_transposed_kernel<D, F, false>
              <<<grid, kThreads, 0, stream>>>(xs, rows, cols, sc, codes_t, scales_t, round_up4(cols));
        check_launch("quantize_cols_transposed_kernel", stream);
      }
    });
  });
}

void fp8_decode_operand(const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                        bool f32_out, void* out, cudaStream_t stream) {
  const numerics::ScaleLayout layout = k.scale_layout();
  const bool e8m0 = k.recipe == Recipe::Mxfp8;
  const dim3 grid = row_grid(rows, cols, "decode_kernel");
  with_fp8(k.format, [&](auto ft) {
    constexpr Fp8Format F = decltype(ft)::value;
    auto launch = [&](auto b) {
      constexpr int B = decltype(b)::value;
      if (f32_out)
        decode_kernel<F, true, B><<<grid, kThreads, 0, stream>>>(layout, e8m0, codes, scales, rows, cols, out);
      else decode_kernel<F, false, B><<<grid, kThreads, 0, stream>>>(layout, e8m0, codes, scales, rows, cols, out);
    };
    if (k.block() == 32) launch(std::integral_constant<int, 32>{});
    else launch(std::integral_constant<int, 128>{});
  });
  check_launch("decode_kernel", stream);
}

void bias_round(DType d, const float* acc, int64_t rows, int64_t cols, const void* bias, bool accumulate, void* out,
                cudaStream_t stream, const float* amax_a, const float* amax_b) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* b = static_cast<const storage_t<D>*>(bias);
    auto* o = static_cast<storage_t<D>*>(out);
    const dim3 grid = row_grid(rows, cols, "bias_round_kernel");
    if (vec4(cols))
      bias_round_kernel<D, true><<<grid, kThreads, 0, stream>>>(acc, rows, cols, b, accumulate, o, amax_a, amax_b);
    else bias_round_kernel<D, false><<<grid, kThreads, 0, stream>>>(acc, rows, cols, b, accumulate, o, amax_a, amax_b);
  });
  check_launch("bias_round_kernel", stream);
}

}  // namespace lnmlp::cuda
