// Activation forward (h -> act) and backward fused with db1's column sums. Thread = column j of
// the activation output; the second function of a gated pair reads column F + j of h.
#include "device_util.cuh"

namespace lnmlp::cuda {
namespace {

// O: the output's dtype, D (rounded) or F32 (unrounded, for FP8 recipes, which quantize that).
template <DType D, DType O>
__global__ void __launch_bounds__(kColumnThreads)
    act_forward_kernel(ActSpec s, const storage_t<D>* __restrict__ h, storage_t<O>* __restrict__ act) {
  const int64_t F = s.ffn, AF = s.gated ? 2 * F : F;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (j >= F) return;
  const RuntimeAct f0{s.f0, s.params}, f1{s.f1, s.params};
#pragma unroll 4
  for (int64_t r = blockIdx.y; r < s.rows; r += gridDim.y) {
    const float v0 = load<D>(h[r * AF + j]);
    const float a = s.gated ? gated_value(f0, f1, v0, load<D>(h[r * AF + F + j])) : f0.value(v0);
    act[r * F + j] = store<O>(a);
  }
}

template <DType D, DType O>
__global__ void __launch_bounds__(kColumnThreads)
    act_backward_kernel(ActSpec s, Chunking ch, const float* __restrict__ dact, const storage_t<D>* __restrict__ h,
                        storage_t<O>* __restrict__ dh, float* __restrict__ db1_partials) {
  const int64_t F = s.ffn, AF = s.gated ? 2 * F : F;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (j >= F) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * ch.rows_per_chunk;
  const int64_t r1 = r0 + ch.rows_per_chunk < s.rows ? r0 + ch.rows_per_chunk : s.rows;
  const RuntimeAct f0{s.f0, s.params}, f1{s.f1, s.params};
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    const float g = dact[r * F + j];
    const float v0 = load<D>(h[r * AF + j]);
    if (s.gated) {
      // The same products, in the same order, as the CPU backend (numerics/activation.h).
      const GatedGrad d = gated_grad(f0, f1, g, v0, load<D>(h[r * AF + F + j]));
      dh[r * AF + j] = store<O>(d.d0);
      dh[r * AF + F + j] = store<O>(d.d1);
      sum0 += d.d0;
      sum1 += d.d1;
    } else {
      const float d0 = g * f0.grad(v0);
      dh[r * AF + j] = store<O>(d0);
      sum0 += d0;
    }
  }
  if (db1_partials != nullptr) {
    db1_partials[blockIdx.y * AF + j] = sum0;
    if (s.gated) db1_partials[blockIdx.y * AF + F + j] = sum1;
  }
}

}  // namespace

void act_forward(DType d, const ActSpec& s, const void* h, void* act, cudaStream_t stream, bool act_f32) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using S = storage_t<D>;
    const dim3 grid(column_blocks(s.ffn), grid_dim((s.rows + kRowsPerThread - 1) / kRowsPerThread, kMaxGridY));
    if (act_f32)
      act_forward_kernel<D, DType::F32><<<grid, kColumnThreads, 0, stream>>>(s, static_cast<const S*>(h),
                                                                             static_cast<float*>(act));
    else
      act_forward_kernel<D, D><<<grid, kColumnThreads, 0, stream>>>(s, static_cast<const S*>(h), static_cast<S*>(act));
  });
}

void act_backward(DType d, const ActSpec& s, const Chunking& ch, const float* dact, const void* h, void* dh,
                  float* db1_partials, cudaStream_t stream, bool dh_f32) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using S = storage_t<D>;
    const dim3 grid(column_blocks(s.ffn), static_cast<unsigned>(ch.chunks));
    if (dh_f32)
      act_backward_kernel<D, DType::F32><<<grid, kColumnThreads, 0, stream>>>(s, ch, dact, static_cast<const S*>(h),
                                                                              static_cast<float*>(dh), db1_partials);
    else
      act_backward_kernel<D, D><<<grid, kColumnThreads, 0, stream>>>(s, ch, dact, static_cast<const S*>(h),
                                                                     static_cast<S*>(dh), db1_partials);
  });
}

}  // namespace lnmlp::cuda
