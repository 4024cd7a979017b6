// Activation forward (h -> act) and backward fused with db1's column sums, on tiles (tile.cuh):
// a block covers 64 columns of act (and the matching columns of both halves of a gated h and dh)
// by 64 rows at a time, so that the producer writes its output once, in whatever the next step
// reads: the dtype, fp32, or FP8 codes and their transposed copy (with the amax), never fp32 that
// a quantizer reads back.
#include "tile.cuh"

namespace lnmlp::cuda {
namespace {

// What both kernels know of a thread: the activation pair, the FP8 scale, and the four columns of
// act it covers (from c, n of them within F) in block x's 64 (from c0).
struct ActThread {
  int64_t F, AF;
  RuntimeAct f0, f1;
  float scale;
  TileThread th;
  int64_t c0, c;
  int n;
  __device__ ActThread(const ActSpec& s, const Fp8Out& o)
      : F(s.ffn),
        AF(s.gated ? 2 * s.ffn : s.ffn),
        f0{s.f0, s.params},
        f1{s.f1, s.params},
        scale(o.scale != nullptr ? *o.scale : 1.0f),
        c0(static_cast<int64_t>(blockIdx.x) * kTileDim),
        c(th.col(c0)),
        n(valid4(c, F)) {}
};

template <DType D, bool Vec> __global__ void __launch_bounds__(kTileThreads)
    act_forward_kernel(ActSpec s, const storage_t<D>* __restrict__ h, void* act, bool act_f32, Fp8Out o) {
  __shared__ TileCodes smem;
  const ActThread at(s, o);
  uint32_t amax = 0;
  for (int64_t r0 = static_cast<int64_t>(blockIdx.y) * kTileDim; r0 < s.rows;
       r0 += static_cast<int64_t>(gridDim.y) * kTileDim) {
    float v[4][4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = at.th.row(r0, i);
      if (r >= s.rows || at.n == 0) continue;
      float a[4], b[4];
      load4<D, Vec>(h + r * at.AF + at.c, at.n, a);
      if (s.gated) load4<D, Vec>(h + r * at.AF + at.F + at.c, at.n, b);
#pragma unroll
      for (int j = 0; j < 4; ++j) v[i][j] = s.gated ? gated_value(at.f0, at.f1, a[j], b[j]) : at.f0.value(a[j]);
    }
    write_tile<D, Vec>(v, r0, at.c0, s.rows, at.F, at.F, 0, act, act_f32, o, at.scale, amax, smem);
  }
  block_amax_to<kTileThreads>(amax, o.amax_bits);
}

// Block (x, y) covers columns [64 x, 64 x + 64) of act and chunk y of the rows, tile by tile; each
// thread sums its columns' dh over its rows in row order, and the 16 threads of a column are then
// summed in order: db1's partial sums, deterministic.
template <DType D, bool Vec> __global__ void __launch_bounds__(kTileThreads)
    act_backward_kernel(ActSpec s, Chunking ch, const float* __restrict__ dact, const storage_t<D>* __restrict__ h,
                        void* dh, bool dh_f32, Fp8Out o, float* __restrict__ db1_partials) {
  __shared__ TileCodes smem;
  __shared__ float sums[kTileRowStep][kTileDim];
  const ActThread at(s, o);
  const int64_t r_begin = static_cast<int64_t>(blockIdx.y) * ch.rows_per_chunk;
  const int64_t r_end = r_begin + ch.rows_per_chunk < s.rows ? r_begin + ch.rows_per_chunk : s.rows;
  float sum0[4] = {}, sum1[4] = {};
  uint32_t amax = 0;
  for (int64_t r0 = r_begin; r0 < r_end; r0 += kTileDim) {  // whole tiles: chunks are multiples of 64 rows
    float d0[4][4] = {}, d1[4][4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t r = at.th.row(r0, i);
      if (r >= r_end || at.n == 0) continue;
      float g[4], a[4], b[4];
      load4<DType::F32, Vec>(dact + r * at.F + at.c, at.n, g);
      load4<D, Vec>(h + r * at.AF + at.c, at.n, a);
      if (s.gated) load4<D, Vec>(h + r * at.AF + at.F + at.c, at.n, b);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j >= at.n) continue;
        if (s.gated) {
          // The same products, in the same order, as the CPU backend (numerics/activation.h).
          const GatedGrad gd = gated_grad(at.f0, at.f1, g[j], a[j], b[j]);
          d0[i][j] = gd.d0;
          d1[i][j] = gd.d1;
        } else {
          d0[i][j] = g[j] * at.f0.grad(a[j]);
        }
        sum0[j] += d0[i][j];
        sum1[j] += d1[i][j];
      }
    }
    write_tile<D, Vec>(d0, r0, at.c0, s.rows, at.F, at.AF, 0, dh, dh_f32, o, at.scale, amax, smem);
    if (s.gated) write_tile<D, Vec>(d1, r0, at.c0, s.rows, at.F, at.AF, at.F, dh, dh_f32, o, at.scale, amax, smem);
  }
  if (db1_partials != nullptr) {  // uniform over the grid
    float* part = db1_partials + static_cast<int64_t>(blockIdx.y) * at.AF;
    for (int half = 0; half < (s.gated ? 2 : 1); ++half) {
#pragma unroll
      for (int j = 0; j < 4; ++j) sums[at.th.ty][4 * at.th.tx + j] = half == 0 ? sum0[j] : sum1[j];
      __syncthreads();
      if (threadIdx.x < kTileDim && at.c0 + threadIdx.x < at.F) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < kTileRowStep; ++k) t += sums[k][threadIdx.x];
        part[half * at.F + at.c0 + threadIdx.x] = t;
      }
      __syncthreads();
    }
  }
  block_amax_to<kTileThreads>(amax, o.amax_bits);
}

void zero_amax(const Fp8Out& o, cudaStream_t stream) {
  if (o.amax_bits != nullptr)
    cuda_check(cudaMemsetAsync(o.amax_bits, 0, sizeof(uint32_t), stream), "cudaMemsetAsync (the activation's amax)");
}

}  // namespace

void act_forward(DType d, const ActSpec& s, const void* h, void* act, bool act_f32, const Fp8Out& fp8,
                 cudaStream_t stream) {
  zero_amax(fp8, stream);
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* hs = static_cast<const storage_t<D>*>(h);
    const dim3 grid = grid_2d((s.ffn + kTileDim - 1) / kTileDim,
                              grid_dim((s.rows + kTileDim - 1) / kTileDim, grid_y_cap()), "act_forward_kernel");
    if (vec4(s.ffn)) act_forward_kernel<D, true><<<grid, kTileThreads, 0, stream>>>(s, hs, act, act_f32, fp8);
    else act_forward_kernel<D, false><<<grid, kTileThreads, 0, stream>>>(s, hs, act, act_f32, fp8);
  });
  check_launch("act_forward_kernel", stream);
}

void act_backward(DType d, const ActSpec& s, const Chunking& ch, const float* dact, const void* h, void* dh,
                  bool dh_f32, const Fp8Out& fp8, float* db1_partials, cudaStream_t stream) {
  zero_amax(fp8, stream);
  with_dtype(d, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* hs = static_cast<const storage_t<D>*>(h);
    const dim3 grid = grid_2d((s.ffn + kTileDim - 1) / kTileDim, ch.chunks, "act_backward_kernel");
    if (vec4(s.ffn))
      act_backward_kernel<D, true><<<grid, kTileThreads, 0, stream>>>(s, ch, dact, hs, dh, dh_f32, fp8, db1_partials);
    else
      act_backward_kernel<D, false><<<grid, kTileThreads, 0, stream>>>(s, ch, dact, hs, dh, dh_f32, fp8, db1_partials);
  });
  check_launch("act_backward_kernel", stream);
}

}  // namespace lnmlp::cuda
