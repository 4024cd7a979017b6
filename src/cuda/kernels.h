// The CUDA backend's own kernels (everything that is not a GEMM), as host-callable launchers.
// Each launcher takes the I/O dtype at run time and enqueues its kernels on `stream`; none
// allocates or synchronizes. The formulas come from src/numerics/ (shared with the CPU backend).
//
// Column reductions (db1, db2, dgamma, dbeta) are deterministic and use no atomics: a first kernel
// writes per-chunk partial sums (chunk c covers a fixed range of rows, summed in a fixed order)
// into workspace, and reduce_partials sums the chunks in chunk order. The chunking depends only on
// the shape (column_chunking, tile_chunking), so every run of a plan gives the same bits.
//
// Memory: rows whose length is a multiple of 4 are read and written four elements at a time (8- or
// 16-byte accesses, device_util.cuh's load4/store4), other shapes element by element. The
// elementwise kernels that may write a transposed copy (the activation and its backward, the
// per-tensor quantizer) work on tiles of kTileDim x kTileDim elements staged through shared
// memory, so that the transposed copy is written in whole rows too.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "plan/config.h"

namespace lnmlp::cuda {

constexpr int kColumnThreads = 256;  // threads per block of the column kernels (one column each)
constexpr int kRowThreads = 256;     // threads per block of the row kernels (one row per block)
constexpr int kTileDim = 64;         // rows and columns of a tile of the tile kernels
constexpr int kTileThreads = 256;    // threads per tile: 16 across (4 columns each) x 16 down

struct NormSpec {
  Norm norm;
  bool zero_centered;
  float eps;
  int64_t rows, hidden;
};

struct ActSpec {
  Act f0, f1;  // f1 only read when gated
  bool gated;
  ActParams params;
  int64_t rows, ffn;
};

// How a column reduction over `rows` rows splits them into chunks.
struct Chunking {
  int64_t chunks = 1;
  int64_t rows_per_chunk = 1;
};

// The chunking of a column kernel (a thread per column): enough blocks to fill a large GPU (about
// 1024), whatever the number of columns.
inline Chunking column_chunking(int64_t rows, int64_t cols) {
  const int64_t col_blocks = (cols + kColumnThreads - 1) / kColumnThreads;
  int64_t chunks = (1024 + col_blocks - 1) / col_blocks;
  if (chunks > rows) chunks = rows;
  if (chunks < 1) chunks = 1;
  Chunking c;
  c.rows_per_chunk = (rows + chunks - 1) / chunks;
  c.chunks = (rows + c.rows_per_chunk - 1) / c.rows_per_chunk;
  return c;
}

// The chunking of a tile kernel (act_backward's db1): chunks of whole tiles of rows, about 1024
// blocks in all.
inline Chunking tile_chunking(int64_t rows, int64_t cols) {
  const int64_t col_tiles = (cols + kTileDim - 1) / kTileDim, row_tiles = (rows + kTileDim - 1) / kTileDim;
  int64_t chunks = (1024 + col_tiles - 1) / col_tiles;
  if (chunks > row_tiles) chunks = row_tiles;
  if (chunks < 1) chunks = 1;
  Chunking c;
  c.rows_per_chunk = (row_tiles + chunks - 1) / chunks * kTileDim;
  c.chunks = rows < 1 ? 1 : (rows + c.rows_per_chunk - 1) / c.rows_per_chunk;
  return c;
}

// The per-tensor FP8 work a producer does in its own pass for the quantizer that reads its output
// (block/exec.h's ProducerFp8): the output's amax into *amax_bits (zeroed by the launcher first)
// and, with `scale`, its codes = fp8(value * *scale) in the format (E5M2 or E4M3), rowwise
// [rows, cols] and/or transposed [cols, rows]. Every pointer may be NULL (no such output).
struct Fp8Out {
  uint32_t* amax_bits = nullptr;
  const float* scale = nullptr;
  bool e5m2 = false;
  uint8_t* codes = nullptr;
  uint8_t* codes_t = nullptr;
};

// Statistics (when compute_stats; else read from mu/rs, for recomputation) and the norm output
// into out (NULL: not written), rounded to the dtype, or unrounded in fp32 when out_f32 (FP8
// recipes quantize that), with fp8's amax and rowwise codes (not codes_t) made in the same pass.
// mu is NULL for rmsnorm.
// The most blocks a launch puts along a grid-stride y dimension, the kernels looping over the rest:
// the device's limit (65535), lowered only by the kernel tests so that those loops run at small
// sizes.
int64_t& grid_y_cap();

void norm_forward(DType d, const NormSpec& s, const void* x, const void* gamma, const void* beta, bool compute_stats,
                  float* mu, float* rs, void* out, bool out_f32, const Fp8Out& fp8, cudaStream_t stream);

// act[T, F] = f0(h[:, 0, :]) (* f1(h[:, 1, :])), h [T, A*F] already including b1; act (NULL: not
// written) rounded to the dtype, or unrounded in fp32 when act_f32, with fp8's work on it.
void act_forward(DType d, const ActSpec& s, const void* h, void* act, bool act_f32, const Fp8Out& fp8,
                 cudaStream_t stream);

// dh = dact * act'(h) (the gated product rule) into dh [T, A*F] (NULL: not written), rounded to
// the dtype or unrounded in fp32 when dh_f32, with fp8's work on it, and the per-chunk column sums
// of the unrounded dh into db1_partials [ch.chunks, A*F] when that is not NULL (ch: tile_chunking).
void act_backward(DType d, const ActSpec& s, const Chunking& ch, const float* dact, const void* h, void* dh,
                  bool dh_f32, const Fp8Out& fp8, float* db1_partials, cudaStream_t stream);

// Per-chunk column sums of in [rows, cols] (the dtype) into partials [chunks, cols].
void column_sums(DType d, const Chunking& ch, int64_t rows, int64_t cols, const void* in, float* partials,
                 cudaStream_t stream);

// dx from dn (fp32) per row.
void norm_backward_dx(DType d, const NormSpec& s, const float* dn, const void* x, const void* gamma, const float* mu,
                      const float* rs, void* dx, cudaStream_t stream);

// Per-chunk column sums of dn * xhat (dgamma) and dn (dbeta; skipped when dbeta_partials is NULL).
void norm_param_grads(DType d, const NormSpec& s, const Chunking& ch, const float* dn, const void* x, const float* mu,
                      const float* rs, float* dgamma_partials, float* dbeta_partials, cudaStream_t stream);

// out[j] = sum over c in order of partials[c * n + j], rounded to the dtype.
// accumulate: out = rnd(out + sum) (an accumulating parameter gradient).
void reduce_partials(DType d, int64_t chunks, int64_t n, const float* partials, bool accumulate, void* out,
                     cudaStream_t stream);

}  // namespace lnmlp::cuda
