// Host reference quantizers over plain fp32 arrays, or arrays of an I/O dtype (docs/design.md,
// "FP8"), for every recipe: the CPU backend calls them, and they are the specification the CUDA
// kernels must match bit for bit.
// The scale arithmetic is in scaling.h, the element casts in fp8.h.
//
// Layouts (all row-major, all compact; a backend that feeds cuBLASLt reorders the scales into
// the layout the library wants):
//   per tensor     codes [n], one scale / scale_inv.
//   1xK rows       a [rows, cols] matrix in blocks of K consecutive elements of a row (K = 128 for
//                  block scaling, 32 for mxfp8); the blocks of a row are cols/K rounded up, and a
//                  partial last block (cols not a multiple of K) is a block of its own, scaled by
//                  its own amax. scale_inv [rows, ceil(cols/K)].
//   BRxBC 2-D      a [rows, cols] matrix in BR x BC tiles (128x128 for block-scaled weights); edge
//                  tiles are partial in either direction. scale_inv [ceil(rows/BR), ceil(cols/BC)].
//   mxfp8          as 1xK rows with K = 32, the scale_inv stored as an E8M0 byte per block.
// Blocks run along the rows; to block along the columns (the contracted dimension of a [K, N]
// operand) quantize its transpose.
//
// THE GEMM CONTRACT (what the CPU backend computes to be "exactly as hardware"). For C = A B with
// A [M, K] and B [K, N] both quantized in blocks along K of one length Kb (A in 1xKb blocks of its
// rows; B in 1xKb blocks along K for each column, or in Kb x Kb 2-D tiles for weights):
//   C[m, n] = sum over K-blocks b of
//               ( sum_{k in b} fp8_to_float(qa[m, k]) * fp8_to_float(qb[k, n]) )
//               * scale_inv_a[m, b] * scale_inv_b[b, n]        (2-D tiles: scale_inv_b[b, n / Kb])
// i.e. codes are decoded WITHOUT their scales (the product of two fp8 values is exact in fp32),
// each block's partial dot is accumulated in fp32 and then multiplied by both scale_invs, and the
// blocks are summed in fp32 (equal to hardware up to the fp32 summation order). mxfp8 is the same
// with Kb = 32 and scale_inv = e8m0_to_float(byte); per-tensor scaling is the case of a single
// block spanning all of K. block_scaled_dot below is this contract for one output element.
#pragma once

#include <cstdint>

#include "fp8.h"
#include "hd.h"
#include "scaling.h"

// `#pragma omp simd` where OpenMP is on (the library builds with it); a plain loop otherwise, so
// targets built without -fopenmp see no unknown pragma.
#if defined(_OPENMP) && !defined(__CUDA_ARCH__)
#define LNMLP_QUANT_SIMD _Pragma("omp simd")
#define LNMLP_QUANT_SIMD_MAX_M _Pragma("omp simd reduction(max : m)")
#else
#define LNMLP_QUANT_SIMD
#define LNMLP_QUANT_SIMD_MAX_M
#endif

namespace lnmlp::numerics {

// Block lengths of the recipes.
constexpr int64_t kBlockScalingLength = 128;  // block: 1x128 activations/gradients, 128x128 weights
constexpr int64_t kMxfp8BlockLength = 32;     // mxfp8: 1x32

// Number of blocks of length `block` covering n elements (a partial last block counts).
LNMLP_HD constexpr int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Where the scale of element (r, c) of a [rows, cols] operand is, in the layouts above: one per
// tensor (index 0), per b x b tile, per 1 x b block along a row, or per b x 1 block down a column
// (scales [num_blocks(rows, b), cols]).
enum class ScaleLayout : int32_t { PerTensor, Tiles, AlongRows, DownColumns };
LNMLP_HD int64_t block_scale_index(ScaleLayout layout, int64_t r, int64_t c, int64_t cols, int64_t b) {
  switch (layout) {
    case ScaleLayout::Tiles: return (r / b) * num_blocks(cols, b) + c / b;
    case ScaleLayout::AlongRows: return r * num_blocks(cols, b) + c / b;
    case ScaleLayout::DownColumns: return (r / b) * cols + c;
    case ScaleLayout::PerTensor: break;
  }
  return 0;
}

// ---- the block-scale layouts of cuBLASLt's block-scaled FP8 GEMMs (Hopper) -------------------
//
// cuBLASLt's native block scaling (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F, BLK128x128_32F; CUDA
// 12.9, sm_90) multiplies operands stored K-major, [outer, K] row-major (a tensor's rowwise codes,
// or the transposed codes of its columnwise representation), with one fp32 scale_inv per 1 x 128
// block along K or per 128 x 128 tile, laid out as cuBLASLt reads them (TransformerEngine's
// "GEMM-ready" layouts): by K-block, the outer dimension padded to a multiple of 4 (1 x 128), or
// by outer tile, the K-tiles padded to a multiple of 4 (128 x 128). The scales are the same values
// as the compact layouts above, only placed elsewhere.
LNMLP_HD constexpr int64_t round_up4(int64_t n) { return (n + 3) / 4 * 4; }
// 1 x 128 blocks along K: the scale of element (o, k) of a [outer, K] operand.
LNMLP_HD int64_t gemm_vec128_scale_index(int64_t o, int64_t k, int64_t outer) {
  return (k / kBlockScalingLength) * round_up4(outer) + o;
}
// 128 x 128 tiles: the scale of element (o, k) of a [outer, K] operand.
LNMLP_HD int64_t gemm_blk128_scale_index(int64_t o, int64_t k, int64_t K) {
  return (o / kBlockScalingLength) * round_up4(num_blocks(K, kBlockScalingLength)) + k / kBlockScalingLength;
}
// Scales of a [outer, K] operand in those layouts (tiles: 128 x 128; else 1 x 128), padding included.
LNMLP_HD int64_t gemm_block_scale_count(bool tiles, int64_t outer, int64_t K) {
  return tiles ? num_blocks(outer, kBlockScalingLength) * round_up4(num_blocks(K, kBlockScalingLength))
               : num_blocks(K, kBlockScalingLength) * round_up4(outer);
}

// ---- per tensor (delayed and current scaling) -------------------------------------------------

// amax = max |x[i]| over n elements (0 for n = 0). NaN-PROPAGATING: any NaN makes the amax NaN
// (returned as the quiet NaN 0x7fc00000), so a delayed-scaling update keeps its old scale and
// current scaling falls back to scale 1.0 rather than silently ignoring the NaN; an inf element
// makes it inf. (TransformerEngine's fmaxf-based amax would skip NaNs; we chose to surface them.)
// Computed on the magnitude bits as unsigned integers: for non-NaN floats their order is the
// order of |x|, and every NaN pattern is above +inf, so an integer max reduction (which
// vectorizes) is exact and propagates NaN.
//
// The pieces every backend's amax is made of (host loops here, the CUDA kernels' warps and
// atomics): the magnitude bits of one value, their running max, and the amax they stand for.
LNMLP_HD uint32_t magnitude_bits(float x) { return float_bits(x) & 0x7fffffffu; }
LNMLP_HD uint32_t amax_bits_max(uint32_t m, uint32_t a) { return a > m ? a : m; }
LNMLP_HD float amax_from_bits(uint32_t m) { return bits_float(m > 0x7f800000u ? 0x7fc00000u : m); }

// The magnitude-bits max of n values of D's storage type (an I/O dtype, or fp32): what amax_of
// returns as a float.
template <DType D> LNMLP_HOST_INLINE uint32_t amax_bits_of(const storage_t<D>* x, int64_t n) {
  uint32_t m = 0;
  LNMLP_QUANT_SIMD_MAX_M
  for (int64_t i = 0; i < n; ++i) m = amax_bits_max(m, magnitude_bits(load<D>(x[i])));
  return m;
}

template <DType D = DType::F32> LNMLP_HOST_INLINE float amax_of(const storage_t<D>* x, int64_t n) {
  return amax_from_bits(amax_bits_of<D>(x, n));
}

// Where a quantizer's elements go: their codes (ToCodes: the quantized tensor), or, where nothing
// but a decode would read the codes, the decoded values themselves (ToDecoded<O>: a backend's GEMM
// operand in O's storage type, fp32 or bf16). An element x scaled by its scale (x * scale, in fp32)
// is written as float_to_fp8 of it, or as round_to_fp8 of it times the element's scale_inv (its
// block's; 1 per tensor, whose scale_inv the GEMM applies): bit for bit fp8_to_float(code) *
// scale_inv, the decode of the code, with no code made or read. `at(offset)` is the output
// `offset` elements on.
struct ToCodes {
  static constexpr bool decoded = false;
  uint8_t* codes;
  LNMLP_HD ToCodes at(int64_t offset) const { return {codes + offset}; }
};
template <DType O> struct ToDecoded {
  static constexpr bool decoded = true;
  storage_t<O>* values;
  LNMLP_HD ToDecoded at(int64_t offset) const { return {values + offset}; }
};
template <Fp8Format F> LNMLP_HD void put(const ToCodes& o, int64_t i, float scaled, float) {
  o.codes[i] = float_to_fp8<F>(scaled);
}
template <Fp8Format F, DType O> LNMLP_HD void put(const ToDecoded<O>& o, int64_t i, float scaled, float scale_inv) {
  o.values[i] = store<O>(round_to_fp8<F>(scaled) * scale_inv);
}

// out[i] = cast(x[i] * scale): the fp32 product, then float_to_fp8 (nearest even, saturating), or
// its decoded value times scale_inv (see ToDecoded). The quantizers below read x in D's storage
// type (fp32, or an I/O dtype, whose values fp32 holds exactly: the same codes as from an fp32 copy).
template <Fp8Format F, DType D, typename Out>
LNMLP_HOST_INLINE void quantize_tensor_to(const storage_t<D>* in, int64_t n, float scale, float scale_inv, Out out) {
  LNMLP_QUANT_SIMD
  for (int64_t i = 0; i < n; ++i) put<F>(out, i, load<D>(in[i]) * scale, scale_inv);
}

// codes[i] = cast(x[i] * scale).
template <Fp8Format F, DType D = DType::F32>
LNMLP_HOST_INLINE void quantize_tensor(const storage_t<D>* in, int64_t n, float scale, uint8_t* codes) {
  quantize_tensor_to<F, D>(in, n, scale, 1.0f, ToCodes{codes});
}

// out[i] = fp8_to_float(codes[i]) * scale_inv.
template <Fp8Format F>
LNMLP_HOST_INLINE void dequantize_tensor(const uint8_t* codes, int64_t n, float scale_inv, float* out) {
  LNMLP_QUANT_SIMD
  for (int64_t i = 0; i < n; ++i) out[i] = fp8_to_float<F>(codes[i]) * scale_inv;
}

// ---- block scaling: 1xK blocks along rows -----------------------------------------------------

// The 1 x block blocks of a [rows, cols] matrix, row by row: block b of row r starts at column
// b * block, its scale's slot is r * num_blocks(cols, block) + b, and the last block of a row may
// be narrower. (Plain loops in every function below, no callbacks: see LNMLP_HOST_INLINE.)
LNMLP_HD int64_t block_width(int64_t cols, int64_t c0, int64_t block) { return cols - c0 < block ? cols - c0 : block; }

// The elements of n whole blocks of B elements each, block j scaled by scale[j] and decoded with
// inverse[j] (ToDecoded): B a constant, so that each block's loop is a fixed number of vectors
// with its scale in a register.
template <Fp8Format F, DType D, int64_t B, typename Out>
LNMLP_HOST_INLINE void quantize_whole_blocks(const storage_t<D>* x, int64_t n, const float* scale, const float* inverse,
                                             Out out) {
  for (int64_t j = 0; j < n; ++j) {
    const float s = scale[j], si = inverse[j];
    LNMLP_QUANT_SIMD
    for (int64_t i = j * B; i < j * B + B; ++i) put<F>(out, i, load<D>(x[i]) * s, si);
  }
}

// 1 x block blocks along the rows, for both recipes that use them: block scaling (fp32
// scale_inv[i]) and mxfp8 (E8M0 bytes scale_e8m0[i]), i = r * num_blocks(cols, block) + b. A
// group of up to 64 blocks (at most kSpan elements) at a time: their amaxes, then their scales
// (one loop across the blocks, which vectorizes), then their elements. Block by block with
// everything, each block's cast waited on its own reduction and scalar scale arithmetic, and a
// loop of a run-time length per 32-element block cost more than its work (mxfp8's rowwise
// quantizer ran several times slower). Codes are cast in one loop over the group, each element
// multiplied by its block's scale spread beside it (per block, a loop of 32 byte-sized results
// is half-width vectors); decoded values block by block in loops of the recipes' constant block
// lengths (quantize_whole_blocks: no spread scales to write and read; other lengths, and a partial
// last block, in loops of their length).
template <Fp8Format F, DType D, typename Out>
LNMLP_HOST_INLINE void quantize_blocks_along_rows(const storage_t<D>* in, int64_t rows, int64_t cols, int64_t block,
                                                  bool mxfp8, bool power_2_scale, float amax_epsilon, Out out,
                                                  float* scale_inv, uint8_t* scale_e8m0) {
  constexpr int64_t kMaxGroup = 64, kSpan = 2048;
  const int64_t nb = num_blocks(cols, block);
  const int64_t group = block > kSpan ? 1 : (kSpan / block < kMaxGroup ? kSpan / block : kMaxGroup);
  uint32_t amax[kMaxGroup];
  float scale[kMaxGroup], inverse[kMaxGroup];
  float element_scale[Out::decoded ? 1 : kSpan];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g0 = 0; g0 < nb; g0 += group) {
      const int64_t n = nb - g0 < group ? nb - g0 : group, i0 = r * nb + g0;
      const int64_t c0 = g0 * block, len = cols - c0 < n * block ? cols - c0 : n * block;  // the group's columns
      const storage_t<D>* x = in + r * cols + c0;
      const Out o = out.at(r * cols + c0);
      for (int64_t j = 0; j < n; ++j) amax[j] = amax_bits_of<D>(x + j * block, block_width(len, j * block, block));
      LNMLP_QUANT_SIMD
      for (int64_t j = 0; j < n; ++j) {
        const BlockScaleChoice b =
            choose_block_scale(amax_from_bits(amax[j]), Fp8Traits<F>::max, mxfp8, power_2_scale, amax_epsilon);
        scale[j] = b.scale;
        inverse[j] = b.scale_inv;  // mxfp8: e8m0_to_float(b.e8m0), what a decode of the byte reads
        if (mxfp8) scale_e8m0[i0 + j] = b.e8m0;
        else scale_inv[i0 + j] = b.scale_inv;
      }
      if constexpr (Out::decoded) {
        const int64_t whole = len / block;
        if (block == kMxfp8BlockLength) {
          quantize_whole_blocks<F, D, kMxfp8BlockLength>(x, whole, scale, inverse, o);
        } else if (block == kBlockScalingLength) {
          quantize_whole_blocks<F, D, kBlockScalingLength>(x, whole, scale, inverse, o);
        } else {
          for (int64_t j = 0; j < whole; ++j)
            quantize_tensor_to<F, D>(x + j * block, block, scale[j], inverse[j], o.at(j * block));
        }
        if (whole < n)
          quantize_tensor_to<F, D>(x + whole * block, len - whole * block, scale[whole], inverse[whole],
                                   o.at(whole * block));
      } else if (len > kSpan) {  // one block longer than the span
        quantize_tensor_to<F, D>(x, len, scale[0], 1.0f, o);
      } else {
        for (int64_t j = 0; j < n; ++j) {
          const float sj = scale[j];
          for (int64_t i = j * block; i < j * block + block_width(len, j * block, block); ++i) element_scale[i] = sj;
        }
        LNMLP_QUANT_SIMD
        for (int64_t i = 0; i < len; ++i) put<F>(o, i, load<D>(x[i]) * element_scale[i], 1.0f);
      }
    }
}

// Quantizes in [rows, cols] in 1 x block blocks: per block amax -> block_scale (fmt_max /
// max(amax, amax_epsilon), optionally a power of two; 1.0 for an all-zero or non-finite block) ->
// codes [rows, cols] and scale_inv[rows, num_blocks(cols, block)] = 1 / scale.
template <Fp8Format F, DType D = DType::F32>
LNMLP_HOST_INLINE void quantize_rows_blocked(const storage_t<D>* in, int64_t rows, int64_t cols, int64_t block,
                                             bool power_2_scale, float amax_epsilon, uint8_t* codes, float* scale_inv) {
  quantize_blocks_along_rows<F, D>(in, rows, cols, block, false, power_2_scale, amax_epsilon, ToCodes{codes}, scale_inv,
                                   nullptr);
}

// out = codes * scale_inv of the element's block.
template <Fp8Format F> LNMLP_HOST_INLINE void dequantize_rows_blocked(const uint8_t* codes, int64_t rows, int64_t cols,
                                                                      int64_t block, const float* scale_inv,
                                                                      float* out) {
  const int64_t nb = num_blocks(cols, block);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0, i = r * nb; c0 < cols; c0 += block, ++i) {
      const int64_t off = r * cols + c0, w = block_width(cols, c0, block);
      dequantize_tensor<F>(codes + off, w, scale_inv[i], out + off);
    }
}

// ---- block scaling: Kx1 blocks along columns ---------------------------------------------------

// The same blocks taken down the columns: a [rows, cols] matrix in blocks of `block` consecutive
// rows of one column (the last block of a column may be shorter), for an operand whose contracted
// dimension is its rows (the weight-gradient GEMMs' A^T B). Codes stay in the [rows, cols] layout;
// scale_inv is [num_blocks(rows, block), cols] (block-row major). The scales are those
// quantize_rows_blocked gives the transpose, bit for bit.

// The amax of each column over rows [r0, r0 + h) into amax[cols] (NaN-propagating, as amax_of).
template <DType D = DType::F32>
LNMLP_HOST_INLINE void column_amax(const storage_t<D>* in, int64_t cols, int64_t r0, int64_t h, uint32_t* amax_bits) {
  for (int64_t c = 0; c < cols; ++c) amax_bits[c] = 0;
  for (int64_t r = r0; r < r0 + h; ++r) {
    const storage_t<D>* row = in + r * cols;
    LNMLP_QUANT_SIMD
    for (int64_t c = 0; c < cols; ++c) amax_bits[c] = amax_bits_max(amax_bits[c], magnitude_bits(load<D>(row[c])));
  }
}

// Quantizes rows [r0, r0 + h) of band rb: scale per column from its amax (work: cols entries,
// reused for the scales' bit patterns). The band's scales go to scales[rb * cols + c]: fp32
// scale_invs (block scaling), or E8M0 bytes (mxfp8, as quantize_mxfp8_rows gives the transpose);
// the elements to out (ToCodes, or ToDecoded with each column's scale_inv as stored, taken into
// fp32 for a chunk of columns at a time and then used by all the band's rows).
template <Fp8Format F, DType D, typename Out>
LNMLP_HOST_INLINE void quantize_cols_band_to(const storage_t<D>* in, int64_t cols, int64_t rb, int64_t r0, int64_t h,
                                             bool mxfp8, bool power_2_scale, float amax_epsilon, Out out, void* scales,
                                             uint32_t* work) {
  column_amax<D>(in, cols, r0, h, work);
  float* const scale_inv = static_cast<float*>(scales) + rb * cols;
  uint8_t* const scale_e8m0 = static_cast<uint8_t*>(scales) + rb * cols;
  LNMLP_QUANT_SIMD
  for (int64_t c = 0; c < cols; ++c) {
    const BlockScaleChoice b =
        choose_block_scale(amax_from_bits(work[c]), Fp8Traits<F>::max, mxfp8, power_2_scale, amax_epsilon);
    if (mxfp8) scale_e8m0[c] = b.e8m0;
    else scale_inv[c] = b.scale_inv;
    work[c] = float_bits(b.scale);
  }
  constexpr int64_t kChunk = 512;
  float inverse[Out::decoded ? kChunk : 1];
  const int64_t chunk = Out::decoded ? kChunk : cols;
  for (int64_t c0 = 0; c0 < cols; c0 += chunk) {
    const int64_t w = cols - c0 < chunk ? cols - c0 : chunk;
    if (Out::decoded) {
      if (mxfp8) {
        LNMLP_QUANT_SIMD
        for (int64_t c = 0; c < w; ++c) inverse[c] = e8m0_to_float(scale_e8m0[c0 + c]);
      } else {
        LNMLP_QUANT_SIMD
        for (int64_t c = 0; c < w; ++c) inverse[c] = scale_inv[c0 + c];
      }
    }
    for (int64_t r = r0; r < r0 + h; ++r) {
      const Out o = out.at(r * cols + c0);
      const storage_t<D>* x = in + r * cols + c0;
      const uint32_t* s = work + c0;
      LNMLP_QUANT_SIMD
      for (int64_t c = 0; c < w; ++c) put<F>(o, c, load<D>(x[c]) * bits_float(s[c]), Out::decoded ? inverse[c] : 1.0f);
    }
  }
}

template <Fp8Format F, DType D = DType::F32>
LNMLP_HOST_INLINE void quantize_cols_band(const storage_t<D>* in, int64_t cols, int64_t rb, int64_t r0, int64_t h,
                                          bool mxfp8, bool power_2_scale, float amax_epsilon, uint8_t* codes,
                                          void* scales, uint32_t* work) {
  quantize_cols_band_to<F, D>(in, cols, rb, r0, h, mxfp8, power_2_scale, amax_epsilon, ToCodes{codes}, scales, work);
}

// ---- block scaling: 2-D tiles (weights) -------------------------------------------------------

// Quantizes in [rows, cols] in block_rows x block_cols tiles (edge tiles partial), one amax and
// scale per tile as above; scale_inv [num_blocks(rows, block_rows), num_blocks(cols, block_cols)].
template <Fp8Format F, DType D, typename Out>
LNMLP_HOST_INLINE void quantize_tiles_to(const storage_t<D>* in, int64_t rows, int64_t cols, int64_t block_rows,
                                         int64_t block_cols, bool power_2_scale, float amax_epsilon, Out out,
                                         float* scale_inv) {
  const int64_t nbr = num_blocks(rows, block_rows), nbc = num_blocks(cols, block_cols);
  for (int64_t br = 0; br < nbr; ++br) {
    const int64_t r0 = br * block_rows;
    const int64_t h = rows - r0 < block_rows ? rows - r0 : block_rows;
    for (int64_t bc = 0; bc < nbc; ++bc) {
      const int64_t c0 = bc * block_cols;
      const int64_t w = cols - c0 < block_cols ? cols - c0 : block_cols;
      float amax = 0.0f;
      for (int64_t r = r0; r < r0 + h; ++r) amax = amax_max(amax, amax_of<D>(in + r * cols + c0, w));
      const BlockScaleChoice b = choose_block_scale(amax, Fp8Traits<F>::max, false, power_2_scale, amax_epsilon);
      scale_inv[br * nbc + bc] = b.scale_inv;
      for (int64_t r = r0; r < r0 + h; ++r)
        quantize_tensor_to<F, D>(in + r * cols + c0, w, b.scale, b.scale_inv, out.at(r * cols + c0));
    }
  }
}

template <Fp8Format F, DType D = DType::F32>
LNMLP_HOST_INLINE void quantize_tiles(const storage_t<D>* in, int64_t rows, int64_t cols, int64_t block_rows,
                                      int64_t block_cols, bool power_2_scale, float amax_epsilon, uint8_t* codes,
                                      float* scale_inv) {
  quantize_tiles_to<F, D>(in, rows, cols, block_rows, block_cols, power_2_scale, amax_epsilon, ToCodes{codes},
                          scale_inv);
}

template <Fp8Format F> LNMLP_HOST_INLINE void dequantize_tiles(const uint8_t* codes, int64_t rows, int64_t cols,
                                                               int64_t block_rows, int64_t block_cols,
                                                               const float* scale_inv, float* out) {
  const int64_t nbc = num_blocks(cols, block_cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scale_inv + (r / block_rows) * nbc;
    for (int64_t bc = 0; bc < nbc; ++bc) {
      const int64_t c0 = bc * block_cols;
      const int64_t w = cols - c0 < block_cols ? cols - c0 : block_cols;
      dequantize_tensor<F>(codes + r * cols + c0, w, s[bc], out + r * cols + c0);
    }
  }
}

// ---- mxfp8: 1x32 blocks along rows, E8M0 scales -----------------------------------------------

// Quantizes in [rows, cols] in 1 x block blocks (block = 32 for OCP MX): per block amax ->
// e = mxfp8_scale_inv_exponent(amax, fmt_max) (exact ceil(log2(amax / fmt_max)), clamped to
// [-127, 127]; amax 0 -> -127) -> codes = cast(x * 2^-e), scale_e8m0[rows, num_blocks(cols,
// block)] = mxfp8_scale_e8m0(amax) (= e + 127; 0xFF, NaN, for a block holding a NaN, which then
// dequantizes to NaN throughout whatever its codes; they are coded with e = 127, the exponent a
// NaN amax maps to). Every scale is a power of two, so x * 2^-e is
// exact unless it falls below fp32's normal range, where fp8 rounds it to zero anyway.
template <Fp8Format F, DType D = DType::F32>
LNMLP_HOST_INLINE void quantize_mxfp8_rows(const storage_t<D>* in, int64_t rows, int64_t cols, uint8_t* codes,
                                           uint8_t* scale_e8m0, int64_t block = kMxfp8BlockLength) {
  quantize_blocks_along_rows<F, D>(in, rows, cols, block, true, false, 0.0f, ToCodes{codes}, nullptr, scale_e8m0);
}

// out = codes * 2^e of the element's block (NaN for an 0xFF block).
template <Fp8Format F> LNMLP_HOST_INLINE void dequantize_mxfp8_rows(const uint8_t* codes, int64_t rows, int64_t cols,
                                                                    const uint8_t* scale_e8m0, float* out,
                                                                    int64_t block = kMxfp8BlockLength) {
  const int64_t nb = num_blocks(cols, block);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0, i = r * nb; c0 < cols; c0 += block, ++i) {
      const int64_t off = r * cols + c0, w = block_width(cols, c0, block);
      dequantize_tensor<F>(codes + off, w, e8m0_to_float(scale_e8m0[i]), out + off);
    }
}

// ---- the GEMM contract for one output element -------------------------------------------------

// sum over K-blocks b of (sum_{k in b} fp8(qa[k]) * fp8(qb[k * qb_stride])) * sa[b] *
// sb[b * sb_stride], each partial dot and the total in fp32 (see THE GEMM CONTRACT at the top).
// qa: a row of A's codes (contiguous along K); sa: its scale_invs, one per K-block (contiguous).
// qb: a column of B's codes, qb_stride apart along K; sb: its scale_invs, sb_stride apart from one
// K-block to the next (for 128x128 weight tiles of a [K, N] B: sb = scale_inv + n / 128,
// sb_stride = num_blocks(N, 128)). mxfp8 callers pass e8m0_to_float of the bytes.
template <Fp8Format FA, Fp8Format FB>
LNMLP_HOST_INLINE float block_scaled_dot(const uint8_t* qa, const float* sa, const uint8_t* qb, int64_t qb_stride,
                                         const float* sb, int64_t sb_stride, int64_t k, int64_t block) {
  float total = 0.0f;
  for (int64_t b = 0; b * block < k; ++b) {
    const int64_t k0 = b * block;
    const int64_t w = k - k0 < block ? k - k0 : block;
    float partial = 0.0f;
    for (int64_t i = k0; i < k0 + w; ++i)
      partial += fp8_to_float<FA>(qa[i]) * fp8_to_float<FB>(qb[i * qb_stride]);
    total += partial * sa[b] * sb[b * sb_stride];
  }
  return total;
}

}  // namespace lnmlp::numerics
