// NVFP4 kernels of the CUDA backend (see nvfp4_kernels.h). One thread per 1x16 block (or per 16x16
// tile's band of 16 rows): numerics' quantize_nvfp4_block and decode_nvfp4_block, the functions the
// CPU backend runs per block, so the codes, scales, random bits and operand values are the CPU's.
// The columnwise representations first transpose x into fp32 (Hadamard-transformed where the kind
// says) with the amax of what they write, as the CPU backend does, so their global amax is the
// same float. These kernels favour being the CPU's bits over speed: H100/H200 have no FP4 GEMMs to
// feed, and the GEMMs on the decoded operands dominate.
#include <type_traits>

#include "device_util.cuh"
#include "fp8_kernels.h"
#include "numerics/hadamard.h"
#include "nvfp4_kernels.h"

namespace lnmlp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kB = numerics::kNvfp4BlockLength;

// *amax = the amax of *bits (may be the same word: one thread reads it, then writes it).
__global__ void nvfp4_set_amax_kernel(const uint32_t* bits, float* amax) { *amax = amax_from_bits(*bits); }

// Column c of x [rows, cols] in blocks of 16 rows, Hadamard-transformed where `hadamard` (whole
// blocks only): into the transpose t [cols, rows] (NULL: not written) and the amax of the values
// (amax_bits NULL: not measured). Threads along x take adjacent columns (coalesced reads); the
// grid's y strides over the row blocks. A block's 16 x kThreads values go to t through shared
// memory, so that a warp writes whole 16-float runs of t's rows (two a store) rather than 32
// scattered words.
template <DType D> __global__ void __launch_bounds__(kThreads)
    nvfp4_columns_kernel(const storage_t<D>* __restrict__ x, int64_t rows, int64_t cols, bool hadamard,
                         float* __restrict__ t, uint32_t* amax_bits) {
  __shared__ float tile[kB][kThreads + 1];  // [row in the block][column]; padded against bank conflicts
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kThreads, c = c0 + threadIdx.x;
  uint32_t m = 0;
  for (int64_t rb = blockIdx.y; rb * kB < rows; rb += gridDim.y) {  // the same trips for the whole block
    const int64_t r0 = rb * kB, n = rows - r0 < kB ? rows - r0 : kB;
    if (c < cols) {
      float v[kB];
      for (int64_t i = 0; i < n; ++i) v[i] = load<D>(x[(r0 + i) * cols + c]);
      if (hadamard && n == kB) numerics::random_hadamard16(v, v);
      for (int64_t i = 0; i < n; ++i) {
        m = amax_bits_max(m, magnitude_bits(v[i]));
        tile[i][threadIdx.x] = v[i];
      }
    }
    if (t == nullptr) continue;
    __syncthreads();
    for (int k = static_cast<int>(threadIdx.x); k < kThreads * kB; k += kThreads) {
      const int col = k / static_cast<int>(kB), i = k % static_cast<int>(kB);
      if (c0 + col < cols && i < n) t[(c0 + col) * rows + r0 + i] = tile[i][col];
    }
    __syncthreads();  // before the next row block refills the tile
  }
  block_amax_to<kThreads>(m, amax_bits);
}

// The blocks of the matrix in [rows, cols] (band = 1: rows; 16: 16x16 tiles), one a thread, under
// the global scale of *global_amax, operand values where `values` says.
template <DType D, typename Values> __global__ void __launch_bounds__(kThreads)
    nvfp4_quantize_kernel(const storage_t<D>* __restrict__ in, int64_t rows, int64_t cols, int64_t band,
                          const float* global_amax, uint8_t* __restrict__ codes, uint8_t* __restrict__ scales,
                          numerics::Nvfp4Rounding rounding, Values values) {
  const int64_t blocks = numerics::num_blocks(cols, kB), bands = numerics::num_blocks(rows, band);
  const float global_scale = numerics::nvfp4_global_scale(*global_amax);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < bands * blocks;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t r0 = (i / blocks) * band, b = i % blocks;
    const int64_t r1 = r0 + band < rows ? r0 + band : rows;
    numerics::quantize_nvfp4_block<D>(in, r0, r1, cols, b, global_scale, codes, scales, rounding, values);
  }
}

template <typename Values> __global__ void __launch_bounds__(kThreads)
    nvfp4_decode_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales, int64_t rows,
                        int64_t cols, Values values) {
  const int64_t blocks = numerics::num_blocks(cols, kB);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < rows * blocks;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    numerics::decode_nvfp4_block(codes, scales, i / blocks, cols, i % blocks, values);
}

// The scales of a quantized matrix [rows, cols] in cuBLASLt's tiled layout (numerics'
// nvfp4_gemm_scale_index), one thread per scale of the padded grid (padding written 0), threads
// along a row's blocks (coalesced reads).
__global__ void __launch_bounds__(kThreads) nvfp4_gemm_scales_kernel(const uint8_t* __restrict__ scales, int64_t rows,
                                                                     int64_t cols, uint8_t* __restrict__ out) {
  const int64_t blocks = numerics::num_blocks(cols, kB), padded_blocks = numerics::nvfp4_gemm_scale_cols(cols);
  const int64_t n = numerics::nvfp4_gemm_scale_rows(rows) * padded_blocks;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t o = i / padded_blocks, b = i % padded_blocks;
    out[numerics::nvfp4_gemm_scale_index(o, b, cols)] = o < rows && b < blocks ? scales[o * blocks + b] : 0;
  }
}

unsigned flat_blocks(int64_t n) { return grid_dim((n + kThreads - 1) / kThreads, kMaxGridX); }

dim3 columns_grid(int64_t rows, int64_t cols) {
  return grid_2d((cols + kThreads - 1) / kThreads, grid_dim(numerics::num_blocks(rows, kB), grid_y_cap()),
                 "nvfp4_columns_kernel");
}

void set_amax(const uint32_t* bits, float* amax, cudaStream_t stream) {
  nvfp4_set_amax_kernel<<<1, 1, 0, stream>>>(bits, amax);
  check_launch("nvfp4_set_amax_kernel", stream);
}

// Calls fn(values) with where the operand values of the matrix a kind quantizes go in op [rows,
// cols] (numerics' nvfp4_operand_values), or with NoNvfp4Values where op is NULL.
template <typename Fn> void with_values(const QuantKind& k, int64_t cols, bool f32, void* op, Fn&& fn) {
  if (op == nullptr) fn(numerics::NoNvfp4Values{});
  else if (f32) fn(numerics::nvfp4_operand_values<DType::F32>(op, k.nvfp4_transposed(), cols));
  else fn(numerics::nvfp4_operand_values<DType::BF16>(op, k.nvfp4_transposed(), cols));
}

}  // namespace

void nvfp4_amax(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols, uint32_t* amax_bits,
                cudaStream_t stream) {
  if (!k.nvfp4_transposed() || !k.hadamard) {  // the transpose's amax is x's
    fp8_amax(in, x, rows * cols, amax_bits, stream);
    return;
  }
  cuda_check(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync (an NVFP4 amax)");
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    nvfp4_columns_kernel<D><<<columns_grid(rows, cols), kThreads, 0, stream>>>(static_cast<const storage_t<D>*>(x),
                                                                               rows, cols, true, nullptr, amax_bits);
  });
  check_launch("nvfp4_columns_kernel", stream);
}

void nvfp4_quantize(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols,
                    const numerics::Nvfp4Rounding& rounding, const uint32_t* given_amax_bits, uint8_t* codes,
                    void* scale_region, float* transposed, bool f32_op, void* op, cudaStream_t stream) {
  float* amax = nvfp4_region_amax(scale_region);
  auto* amax_bits = reinterpret_cast<uint32_t*>(amax);  // measured here as bits, then made the float
  uint8_t* scales = static_cast<uint8_t*>(scale_region) + QuantKind::kNvfp4AmaxBytes;
  const bool t = k.nvfp4_transposed();
  const int64_t qrows = t ? cols : rows, qcols = t ? rows : cols;
  const int64_t band = k.tiles() ? kB : 1;
  const unsigned grid = flat_blocks(numerics::num_blocks(qrows, band) * numerics::num_blocks(qcols, kB));
  auto quantize = [&](auto tag, const void* m) {
    constexpr DType S = decltype(tag)::value;
    with_values(k, cols, f32_op, op, [&](const auto& values) {
      using V = std::decay_t<decltype(values)>;
      nvfp4_quantize_kernel<S, V><<<grid, kThreads, 0, stream>>>(static_cast<const storage_t<S>*>(m), qrows, qcols,
                                                                 band, amax, codes, scales, rounding, values);
    });
    check_launch("nvfp4_quantize_kernel", stream);
  };
  if (!t) {
    if (given_amax_bits == nullptr) fp8_amax(in, x, rows * cols, amax_bits, stream);
    set_amax(given_amax_bits != nullptr ? given_amax_bits : amax_bits, amax, stream);
    with_dtype(in, [&](auto tag) { quantize(tag, x); });
    return;
  }
  if (given_amax_bits == nullptr)
    cuda_check(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync (an NVFP4 amax)");
  with_dtype(in, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    nvfp4_columns_kernel<D><<<columns_grid(rows, cols), kThreads, 0, stream>>>(
        static_cast<const storage_t<D>*>(x), rows, cols, k.hadamard, transposed,
        given_amax_bits == nullptr ? amax_bits : nullptr);
  });
  check_launch("nvfp4_columns_kernel", stream);
  set_amax(given_amax_bits != nullptr ? given_amax_bits : amax_bits, amax, stream);
  quantize(std::integral_constant<DType, DType::F32>{}, transposed);
}

void nvfp4_decode_operand(const QuantKind& k, const uint8_t* codes, const void* scale_region, int64_t rows,
                          int64_t cols, bool f32_out, void* out, cudaStream_t stream) {
  const bool t = k.nvfp4_transposed();
  const int64_t qrows = t ? cols : rows, qcols = t ? rows : cols;
  const auto* scales = static_cast<const uint8_t*>(scale_region) + QuantKind::kNvfp4AmaxBytes;
  with_values(k, cols, f32_out, out, [&](const auto& values) {
    using V = std::decay_t<decltype(values)>;
    nvfp4_decode_kernel<V><<<flat_blocks(qrows * numerics::num_blocks(qcols, kB)), kThreads, 0, stream>>>(
        codes, scales, qrows, qcols, values);
  });
  check_launch("nvfp4_decode_kernel", stream);
}

void nvfp4_gemm_scales(const QuantKind& k, const void* scale_region, int64_t rows, int64_t cols, uint8_t* out,
                       cudaStream_t stream) {
  const bool t = k.nvfp4_transposed();
  const int64_t qrows = t ? cols : rows, qcols = t ? rows : cols;
  const auto* scales = static_cast<const uint8_t*>(scale_region) + QuantKind::kNvfp4AmaxBytes;
  nvfp4_gemm_scales_kernel<<<flat_blocks(numerics::nvfp4_gemm_scale_bytes(qrows, qcols)), kThreads, 0, stream>>>(
      scales, qrows, qcols, out);
  check_launch("nvfp4_gemm_scales_kernel", stream);
}

}  // namespace lnmlp::cuda
