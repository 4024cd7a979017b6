// LayerNorm / RMSNorm forward and the row part of backward (dx): one block per row, fp32
// statistics with deterministic block sums, the arithmetic from src/numerics/norm.h.
#include "device_util.cuh"
#include "numerics/norm.h"

namespace lnmlp::cuda {
namespace {

// O: the output's dtype, D (rounded) or F32 (unrounded, for FP8 recipes, which quantize that).
template <DType D, DType O>
__global__ void __launch_bounds__(kRowThreads)
    norm_forward_kernel(NormSpec s, const storage_t<D>* __restrict__ x, const storage_t<D>* __restrict__ gamma,
                        const storage_t<D>* __restrict__ beta, bool compute_stats, float* mu, float* rs,
                        storage_t<O>* __restrict__ out) {
  __shared__ float shm[kRowThreads / 32];
  const int64_t H = s.hidden;
  const bool ln = s.norm == Norm::LayerNorm;
  for (int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    const storage_t<D>* xr = x + r * H;
    float m = 0.0f, rstd;
    if (compute_stats) {
      if (ln) {
        float sum = 0.0f;
#pragma unroll 4
        for (int64_t j = threadIdx.x; j < H; j += kRowThreads) sum += load<D>(xr[j]);
        m = norm_row_mean(block_sum<kRowThreads>(sum, shm), H);
      }
      float v = 0.0f;
#pragma unroll 4
      for (int64_t j = threadIdx.x; j < H; j += kRowThreads) {
        const float dv = load<D>(xr[j]) - m;
        v += dv * dv;
      }
      rstd = norm_row_rstd(block_sum<kRowThreads>(v, shm), H, s.eps);
      if (threadIdx.x == 0) {
        if (mu != nullptr) mu[r] = m;
        rs[r] = rstd;
      }
    } else {
      m = ln ? mu[r] : 0.0f;
      rstd = rs[r];
    }
    storage_t<O>* o = out + r * H;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < H; j += kRowThreads) {
      const float b = ln ? load<D>(beta[j]) : 0.0f;
      o[j] = store<O>(norm_out(norm_xhat(load<D>(xr[j]), m, rstd), norm_gain(load<D>(gamma[j]), s.zero_centered), b));
    }
  }
}

template <DType D>
__global__ void __launch_bounds__(kRowThreads)
    norm_dx_kernel(NormSpec s, const float* __restrict__ dn, const storage_t<D>* __restrict__ x,
                   const storage_t<D>* __restrict__ gamma, const float* __restrict__ mu, const float* __restrict__ rs,
                   storage_t<D>* __restrict__ dx) {
  __shared__ float shm[kRowThreads / 32];
  const int64_t H = s.hidden;
  const bool ln = s.norm == Norm::LayerNorm;
  for (int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    const storage_t<D>* xr = x + r * H;
    const float* dnr = dn + r * H;
    const float m = ln ? mu[r] : 0.0f, rstd = rs[r];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < H; j += kRowThreads) {
      const float xh = norm_xhat(load<D>(xr[j]), m, rstd);
      const float dxh = dnr[j] * norm_gain(load<D>(gamma[j]), s.zero_centered);
      s1 += dxh;
      s2 += dxh * xh;
    }
    s1 = block_sum<kRowThreads>(s1, shm);
    s2 = block_sum<kRowThreads>(s2, shm);
    const NormBackwardMeans means = norm_backward_means(s1, s2, H, ln);
    storage_t<D>* dxr = dx + r * H;
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < H; j += kRowThreads) {
      const float xh = norm_xhat(load<D>(xr[j]), m, rstd);
      const float dxh = dnr[j] * norm_gain(load<D>(gamma[j]), s.zero_centered);
      dxr[j] = store<D>(norm_dx(dxh, xh, rstd, means.m1, means.m2));
    }
  }
}

// Per-chunk column sums of dn * xhat and dn: thread = column, rows of the chunk in order.
template <DType D>
__global__ void __launch_bounds__(kColumnThreads)
    norm_param_kernel(NormSpec s, Chunking ch, const float* __restrict__ dn, const storage_t<D>* __restrict__ x,
                      const float* __restrict__ mu, const float* __restrict__ rs, float* __restrict__ dgamma_partials,
                      float* __restrict__ dbeta_partials) {
  const int64_t H = s.hidden;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnThreads + threadIdx.x;
  if (j >= H) return;
  const bool ln = s.norm == Norm::LayerNorm;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * ch.rows_per_chunk;
  const int64_t r1 = r0 + ch.rows_per_chunk < s.rows ? r0 + ch.rows_per_chunk : s.rows;
  float dg = 0.0f, db = 0.0f;
#pragma unroll 4
  for (int64_t r = r0; r < r1; ++r) {
    const float g = dn[r * H + j];
    dg += g * norm_xhat(load<D>(x[r * H + j]), ln ? mu[r] : 0.0f, rs[r]);
    db += g;
  }
  dgamma_partials[blockIdx.y * H + j] = dg;
  if (dbeta_partials != nullptr) dbeta_partials[blockIdx.y * H + j] = db;
}

}  // namespace

void norm_forward(DType d, const NormSpec& s, const void* x, const void* gamma, const void* beta, bool compute_stats,
                  float* mu, float* rs, void* out, cudaStream_t stream, bool out_f32) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using S = storage_t<D>;
    const unsigned grid = grid_dim(s.rows, kMaxGridX);
    if (out_f32)
      norm_forward_kernel<D, DType::F32><<<grid, kRowThreads, 0, stream>>>(
          s, static_cast<const S*>(x), static_cast<const S*>(gamma), static_cast<const S*>(beta), compute_stats, mu,
          rs, static_cast<float*>(out));
    else
      norm_forward_kernel<D, D><<<grid, kRowThreads, 0, stream>>>(
          s, static_cast<const S*>(x), static_cast<const S*>(gamma), static_cast<const S*>(beta), compute_stats, mu,
          rs, static_cast<S*>(out));
  });
}

void norm_backward_dx(DType d, const NormSpec& s, const float* dn, const void* x, const void* gamma, const float* mu,
                      const float* rs, void* dx, cudaStream_t stream) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using S = storage_t<D>;
    norm_dx_kernel<D><<<grid_dim(s.rows, kMaxGridX), kRowThreads, 0, stream>>>(
        s, dn, static_cast<const S*>(x), static_cast<const S*>(gamma), mu, rs, static_cast<S*>(dx));
  });
}

void norm_param_grads(DType d, const NormSpec& s, const Chunking& ch, const float* dn, const void* x, const float* mu,
                      const float* rs, float* dgamma_partials, float* dbeta_partials, cudaStream_t stream) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const dim3 grid(column_blocks(s.hidden), static_cast<unsigned>(ch.chunks));
    norm_param_kernel<D><<<grid, kColumnThreads, 0, stream>>>(s, ch, dn, static_cast<const storage_t<D>*>(x), mu, rs,
                                                               dgamma_partials, dbeta_partials);
  });
}

}  // namespace lnmlp::cuda
