// The generic column reductions: per-chunk column sums of a [rows, cols] tensor (db2 from dy), and
// the fixed-order final pass over the chunks that every column reduction ends with.
#include "device_util.cuh"

namespace lnmlp::cuda {

int64_t& grid_y_cap() {
  static int64_t cap = kMaxGridY;
  return cap;
}

namespace {

template <DType D>
__global__ void __launch_bounds__(kColumnThreads)
    column_sums_kernel(Chunking ch, int64_t rows, int64_t cols, const storage_t<D>* __restrict__ in,
                       float* __restrict__ partials) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (j >= cols) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * ch.rows_per_chunk;
  const int64_t r1 = r0 + ch.rows_per_chunk < rows ? r0 + ch.rows_per_chunk : rows;
  float s = 0.0f;
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) s += load<D>(in[r * cols + j]);
  partials[blockIdx.y * cols + j] = s;
}

template <DType D> __global__ void __launch_bounds__(kColumnThreads)
    reduce_partials_kernel(int64_t chunks, int64_t n, const float* __restrict__ partials, bool accumulate,
                           storage_t<D>* __restrict__ out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (j >= n) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) s += partials[c * n + j];
  out[j] = store<D>(accumulate ? load<D>(out[j]) + s : s);
}

}  // namespace

void column_sums(DType d, const Chunking& ch, int64_t rows, int64_t cols, const void* in, float* partials,
                 cudaStream_t stream) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const dim3 grid = grid_2d(column_blocks(cols), ch.chunks, "column_sums_kernel");
    column_sums_kernel<D><<<grid, kColumnThreads, 0, stream>>>(ch, rows, cols, static_cast<const storage_t<D>*>(in),
                                                               partials);
  });
  check_launch("column_sums_kernel", stream);
}

void reduce_partials(DType d, int64_t chunks, int64_t n, const float* partials, bool accumulate, void* out,
                     cudaStream_t stream) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    reduce_partials_kernel<D><<<column_blocks(n), kColumnThreads, 0, stream>>>(chunks, n, partials, accumulate,
                                                                               static_cast<storage_t<D>*>(out));
  });
  check_launch("reduce_partials_kernel", stream);
}

}  // namespace lnmlp::cuda
