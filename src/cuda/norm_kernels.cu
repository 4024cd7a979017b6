// LayerNorm / RMSNorm forward and the row part of backward (dx): one block per row, four elements
// per access where the row length allows (device_util.cuh), fp32 statistics with deterministic
// block sums, the arithmetic from src/numerics/norm.h. The forward writes its output in whatever
// the next step reads: the dtype, fp32, or FP8 codes (with the amax), in the same pass.
#include "device_util.cuh"
#include "numerics/norm.h"

namespace lnmlp::cuda {
namespace {

constexpr int64_t kRowStride = 4 * kRowThreads;  // elements a block's threads cover per step

template <DType D, bool Vec> __global__ void __launch_bounds__(kRowThreads)
    norm_forward_kernel(NormSpec s, const storage_t<D>* __restrict__ x, const storage_t<D>* __restrict__ gamma,
                        const storage_t<D>* __restrict__ beta, bool compute_stats, float* mu, float* rs, void* out,
                        bool out_f32, Fp8Out o) {
  __shared__ float shm[kRowThreads / 32];
  const int64_t H = s.hidden, j0 = 4 * static_cast<int64_t>(threadIdx.x);
  const bool ln = s.norm == Norm::LayerNorm;
  const float scale = o.scale != nullptr ? *o.scale : 1.0f;
  uint32_t amax = 0;
  for (int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    const storage_t<D>* xr = x + r * H;
    float m = 0.0f, rstd;
    if (compute_stats) {
      if (ln) {
        float sum = 0.0f;
        for (int64_t j = j0; j < H; j += kRowStride) {
          float v[4];
          load4<D, Vec>(xr + j, valid4(j, H), v);
          sum += (v[0] + v[1]) + (v[2] + v[3]);
        }
        m = norm_row_mean(block_sum<kRowThreads>(sum, shm), H);
      }
      float var = 0.0f;
      for (int64_t j = j0; j < H; j += kRowStride) {
        float v[4];
        const int n = valid4(j, H);
        load4<D, Vec>(xr + j, n, v);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float dv = k < n ? v[k] - m : 0.0f;
          var += dv * dv;
        }
      }
      rstd = norm_row_rstd(block_sum<kRowThreads>(var, shm), H, s.eps);
      if (threadIdx.x == 0) {
        if (mu != nullptr) mu[r] = m;
        rs[r] = rstd;
      }
    } else {
      m = ln ? mu[r] : 0.0f;
      rstd = rs[r];
    }
    for (int64_t j = j0; j < H; j += kRowStride) {
      const int n = valid4(j, H);
      float v[4], g[4], b[4] = {};
      load4<D, Vec>(xr + j, n, v);
      load4<D, Vec>(gamma + j, n, g);
      if (ln) load4<D, Vec>(beta + j, n, b);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = norm_out(norm_xhat(v[k], m, rstd), norm_gain(g[k], s.zero_centered), b[k]);
      const int64_t at = r * H + j;
      if (out != nullptr) {
        if (out_f32) store4<DType::F32, Vec>(static_cast<float*>(out) + at, n, v);
        else store4<D, Vec>(static_cast<storage_t<D>*>(out) + at, n, v);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (k < n) amax = amax_bits_max(amax, magnitude_bits(v[k]));
      if (o.codes != nullptr) {
        uint8_t q[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) q[k] = fp8_code(v[k], scale, o.e5m2);
        store_codes4<Vec>(o.codes + at, n, q);
      }
    }
  }
  block_amax_to<kRowThreads>(amax, o.amax_bits);
}

// xhat and dxhat = dn * gain at the four columns from j of row xr (n of them in the row).
template <DType D, bool Vec> __device__ __forceinline__ void dx_terms(const NormSpec& s, const storage_t<D>* xr,
                                                                      const storage_t<D>* gamma, const float* dnr,
                                                                      int64_t j, int n, float m, float rstd,
                                                                      float (&xh)[4], float (&dxh)[4]) {
  float v[4], g[4], d[4];
  load4<D, Vec>(xr + j, n, v);
  load4<D, Vec>(gamma + j, n, g);
  load4<DType::F32, Vec>(dnr + j, n, d);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    xh[k] = norm_xhat(v[k], m, rstd);
    dxh[k] = d[k] * norm_gain(g[k], s.zero_centered);
  }
}

template <DType D, bool Vec> __global__ void __launch_bounds__(kRowThreads)
    norm_dx_kernel(NormSpec s, const float* __restrict__ dn, const storage_t<D>* __restrict__ x,
                   const storage_t<D>* __restrict__ gamma, const float* __restrict__ mu, const float* __restrict__ rs,
                   storage_t<D>* __restrict__ dx) {
  __shared__ float shm[kRowThreads / 32];
  const int64_t H = s.hidden, j0 = 4 * static_cast<int64_t>(threadIdx.x);
  const bool ln = s.norm == Norm::LayerNorm;
  for (int64_t r = blockIdx.x; r < s.rows; r += gridDim.x) {
    const storage_t<D>* xr = x + r * H;
    const float* dnr = dn + r * H;
    const float m = ln ? mu[r] : 0.0f, rstd = rs[r];
    float s1 = 0.0f, s2 = 0.0f;
    for (int64_t j = j0; j < H; j += kRowStride) {
      const int n = valid4(j, H);
      float xh[4], dxh[4];
      dx_terms<D, Vec>(s, xr, gamma, dnr, j, n, m, rstd, xh, dxh);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (k >= n) continue;
        s1 += dxh[k];
        s2 += dxh[k] * xh[k];
      }
    }
    s1 = block_sum<kRowThreads>(s1, shm);
    s2 = block_sum<kRowThreads>(s2, shm);
    const NormBackwardMeans means = norm_backward_means(s1, s2, H, ln);
    for (int64_t j = j0; j < H; j += kRowStride) {
      const int n = valid4(j, H);
      float xh[4], dxh[4], v[4];
      dx_terms<D, Vec>(s, xr, gamma, dnr, j, n, m, rstd, xh, dxh);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = norm_dx(dxh[k], xh[k], rstd, means.m1, means.m2);
      store4<D, Vec>(dx + r * H + j, n, v);
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
                  float* mu, float* rs, void* out, bool out_f32, const Fp8Out& fp8, cudaStream_t stream) {
  if (fp8.amax_bits != nullptr)
    cuda_check(cudaMemsetAsync(fp8.amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync (the norm's amax)");
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using S = storage_t<D>;
    const unsigned grid = grid_dim(s.rows, kMaxGridX);
    const auto *xs = static_cast<const S*>(x), *gs = static_cast<const S*>(gamma), *bs = static_cast<const S*>(beta);
    if (vec4(s.hidden))
      norm_forward_kernel<D, true>
          <<<grid, kRowThreads, 0, stream>>>(s, xs, gs, bs, compute_stats, mu, rs, out, out_f32, fp8);
    else
      norm_forward_kernel<D, false>
          <<<grid, kRowThreads, 0, stream>>>(s, xs, gs, bs, compute_stats, mu, rs, out, out_f32, fp8);
  });
  check_launch("norm_forward_kernel", stream);
}

void norm_backward_dx(DType d, const NormSpec& s, const float* dn, const void* x, const void* gamma, const float* mu,
                      const float* rs, void* dx, cudaStream_t stream) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using S = storage_t<D>;
    const unsigned grid = grid_dim(s.rows, kMaxGridX);
    const auto *xs = static_cast<const S*>(x), *gs = static_cast<const S*>(gamma);
    if (vec4(s.hidden))
      norm_dx_kernel<D, true><<<grid, kRowThreads, 0, stream>>>(s, dn, xs, gs, mu, rs, static_cast<S*>(dx));
    else norm_dx_kernel<D, false><<<grid, kRowThreads, 0, stream>>>(s, dn, xs, gs, mu, rs, static_cast<S*>(dx));
  });
  check_launch("norm_dx_kernel", stream);
}

void norm_param_grads(DType d, const NormSpec& s, const Chunking& ch, const float* dn, const void* x, const float* mu,
                      const float* rs, float* dgamma_partials, float* dbeta_partials, cudaStream_t stream) {
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const dim3 grid = grid_2d(column_blocks(s.hidden), ch.chunks, "norm_param_kernel");
    norm_param_kernel<D><<<grid, kColumnThreads, 0, stream>>>(s, ch, dn, static_cast<const storage_t<D>*>(x), mu, rs,
                                                               dgamma_partials, dbeta_partials);
  });
  check_launch("norm_param_kernel", stream);
}

}  // namespace lnmlp::cuda
