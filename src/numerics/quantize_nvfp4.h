// The host reference quantizer of NVFP4 (docs/design.md, "NVFP4"): a [rows, cols] matrix in fp32
// or an I/O dtype, in 1x16 blocks along its rows or in 16x16 tiles (weights), into E2M1 codes and
// E4M3 block scales under one fp32 global scale. The scale arithmetic is scaling.h's
// (nvfp4_global_scale, nvfp4_block_scale_e4m3, nvfp4_element_scale), the element cast fp4.h's.
//
// Layouts (row-major, compact):
//   codes   [rows, ceil(cols/2)] bytes: element (r, c) is the nibble c % 2 (0 low, 1 high) of
//           byte r * ceil(cols/2) + c / 2; an odd row's last high nibble is 0.
//   scales  [rows, ceil(cols/16)] E4M3 bytes, one per 1x16 block. With 16x16 tiles every row of a
//           tile repeats the tile's scale (the layout a GEMM reads, as TransformerEngine stores it).
// A partial last block or tile (cols, or with tiles rows, not a multiple of 16) is scaled by the
// amax of the elements it has, as TransformerEngine's zero padding gives.
// Blocks run along the rows; to block along the columns (the contraction dimension of a [K, N]
// operand) quantize its transpose.
#pragma once

#include <cstdint>

#include "fp4.h"
#include "hd.h"
#include "philox.h"
#include "quantize.h"
#include "scaling.h"

namespace lnmlp::numerics {

constexpr int64_t kNvfp4BlockLength = 16;  // 1x16 blocks, 16x16 weight tiles

// Bytes of a row of codes packed two to a byte.
LNMLP_HD constexpr int64_t nvfp4_row_bytes(int64_t cols) { return (cols + 1) / 2; }

// Where a row or column of the matrix quantized lies in the tensor a random stream is drawn over:
// i -> (i / width) * stride + i % width + base (a shard's columns among the whole tensor's, in A
// halves of `width` columns each `stride` apart); width 0: i + base.
struct Nvfp4StreamMap {
  int64_t width = 0, stride = 0, base = 0;
  LNMLP_HD int64_t operator()(int64_t i) const {
    return width == 0 ? i + base : (i / width) * stride + i % width + base;
  }
};

// How elements round: to nearest even, or stochastically (stochastic_float_to_e2m1) with the random
// bits of element (r, c) drawn as philox_bits(seed, offset, index), index = first_index +
// rows(r + row_offset) * row_stride + cols(c) (row_stride 0: the matrix's cols): so that a tensor
// quantized in pieces -- chunks of rows (row_offset), a shard's columns (the maps) -- draws what it
// would whole. A block of 16 never straddles a map's halves (their width is a multiple of 16).
struct Nvfp4Rounding {
  bool stochastic = false;
  uint64_t seed = 0, offset = 0, first_index = 0;
  int64_t row_offset = 0, row_stride = 0;
  Nvfp4StreamMap rows, cols;

  // The stream index of element (r, c) of a [rows, cols] matrix.
  LNMLP_HD uint64_t index(int64_t cols_of_matrix, int64_t r, int64_t c) const {
    const int64_t stride = row_stride != 0 ? row_stride : cols_of_matrix;
    return first_index + static_cast<uint64_t>(rows(r + row_offset) * stride + this->cols(c));
  }
};

// An element's GEMM operand value: its E2M1 value times its block's E4M3 scale (as a float), exact
// in fp32 and in bf16 (at most 2 + 4 significant bits); the global scale is the GEMM's alpha.
LNMLP_HD float nvfp4_operand_value(uint8_t code, float block_scale) { return e2m1_to_float(code) * block_scale; }

// Where quantize_nvfp4 may also write each element's GEMM operand value, e2m1 * s_block (exact in
// bf16; the global scale belongs to the GEMM's alpha, see the contract below): element (r, c) of
// the matrix quantized at values[r * row_stride + c * col_stride], in O's storage type (a
// transposed layout by the strides). NoNvfp4Values: nowhere.
struct NoNvfp4Values {
  static constexpr bool present = false;
  LNMLP_HD void put(int64_t, int64_t, float) const {}
};
template <DType O> struct Nvfp4Values {
  static constexpr bool present = true;
  storage_t<O>* values;
  int64_t row_stride, col_stride;
  LNMLP_HD void put(int64_t r, int64_t c, float v) const { values[r * row_stride + c * col_stride] = store<O>(v); }
};

// Where a representation's GEMM operand values go (numerics' Nvfp4Values) in the operand out
// [rows, cols] of a [rows, cols] tensor: the matrix quantized is the tensor itself, or its
// transpose (transposed: element (qr, qc) of the quantized matrix at out[qc * cols + qr]).
template <DType O> LNMLP_HD Nvfp4Values<O> nvfp4_operand_values(void* out, bool transposed, int64_t cols) {
  return {static_cast<storage_t<O>*>(out), transposed ? 1 : cols, transposed ? cols : 1};
}

// The bits of the amax of block b (columns 16 b ..) of rows r0 .. r1 - 1 of the matrix in [rows,
// cols] (one row, or a 16-row band of a tile).
template <DType D>
LNMLP_HD uint32_t nvfp4_block_amax_bits(const storage_t<D>* in, int64_t r0, int64_t r1, int64_t cols, int64_t b) {
  constexpr int64_t B = kNvfp4BlockLength;
  const int64_t c0 = b * B, n = block_width(cols, c0, B);
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < n; ++i) m = amax_bits_max(m, magnitude_bits(load<D>(in[r * cols + c0 + i])));
  return m;
}

// A block's scales from its amax: the E4M3 decode scale it stores, and the multiplier of its
// elements before the cast.
struct Nvfp4BlockScale {
  uint8_t e4m3;
  float element_scale;
};
LNMLP_HD Nvfp4BlockScale nvfp4_block_scales_of(uint32_t amax_bits, float global_scale) {
  const uint8_t e4m3 = nvfp4_block_scale_e4m3(amax_from_bits(amax_bits), global_scale);
  return {e4m3, nvfp4_element_scale(e4m3, global_scale)};
}

// Block b of rows r0 .. r1 - 1 (as nvfp4_block_amax_bits) with its scales: its scale stored per
// row, its elements cast (stochastic rounding's bits drawn here, or for a block of one row given
// in `drawn`: its elements' bits, philox_bits at their stream indices, the same values drawn many
// blocks at a time), packed, and their operand values where `values` says.
template <DType D, typename Values>
LNMLP_HD void quantize_nvfp4_block_scaled(const storage_t<D>* in, int64_t r0, int64_t r1, int64_t cols, int64_t b,
                                          Nvfp4BlockScale s, uint8_t* codes, uint8_t* scales,
                                          const Nvfp4Rounding& rounding, const Values& values,
                                          const uint32_t* drawn = nullptr) {
  constexpr int64_t B = kNvfp4BlockLength;
  const int64_t blocks = num_blocks(cols, B), row_bytes = nvfp4_row_bytes(cols);
  const int64_t c0 = b * B, n = block_width(cols, c0, B);
  const float scale = s.element_scale;
  const float block_value = fp8_to_float<Fp8Format::E4M3>(s.e4m3);
  for (int64_t r = r0; r < r1; ++r) {
    scales[r * blocks + b] = s.e4m3;
    const storage_t<D>* x = in + r * cols + c0;
    uint8_t q[B + 1] = {};  // past n: 0, an odd row's last high nibble
    if (rounding.stochastic) {
      uint32_t bits[B];
      if (drawn == nullptr) philox_span(rounding.seed, rounding.offset, rounding.index(cols, r, c0), n, bits);
      const uint32_t* rbits = drawn != nullptr ? drawn : bits;
      LNMLP_QUANT_SIMD
      for (int64_t i = 0; i < n; ++i) q[i] = stochastic_float_to_e2m1(load<D>(x[i]) * scale, rbits[i]);
    } else {
      LNMLP_QUANT_SIMD
      for (int64_t i = 0; i < n; ++i) q[i] = float_to_e2m1(load<D>(x[i]) * scale);
    }
    uint8_t* out = codes + r * row_bytes + c0 / 2;
    for (int64_t i = 0; i < n; i += 2) out[i / 2] = pack_e2m1x2(q[i], q[i + 1]);
    if constexpr (Values::present)
      for (int64_t i = 0; i < n; ++i) values.put(r, c0 + i, nvfp4_operand_value(q[i], block_value));
  }
}

// One 1x16 block of quantize_nvfp4: block b (columns 16 b ..) of rows r0 .. r1 - 1 of the matrix
// in [rows, cols] (one row, or a 16-row band of a tile), codes and scales laid out as above, under
// the global scale: its amax, its scales, its elements. Blocks are independent (a block's codes
// are whole bytes), so any number of threads may quantize a matrix's blocks at once, the CPU's and
// the GPU's alike.
template <DType D, typename Values>
LNMLP_HD void quantize_nvfp4_block(const storage_t<D>* in, int64_t r0, int64_t r1, int64_t cols, int64_t b,
                                   float global_scale, uint8_t* codes, uint8_t* scales, const Nvfp4Rounding& rounding,
                                   const Values& values, const uint32_t* drawn = nullptr) {
  const Nvfp4BlockScale s = nvfp4_block_scales_of(nvfp4_block_amax_bits<D>(in, r0, r1, cols, b), global_scale);
  quantize_nvfp4_block_scaled<D>(in, r0, r1, cols, b, s, codes, scales, rounding, values, drawn);
}

// Quantizes `in` with the global scale of `global_amax` (the tensor's amax, NaN-propagating as
// amax_of gives it; a caller may pass another tensor's, as TransformerEngine's quantizers may),
// block by block: the block's scales, then its elements cast (a Philox call per 4 elements when
// stochastic), packed, and their operand values where `values` says. A row's blocks go a run at a
// time: the run's amaxes, then its scales together (a loop the compiler vectorizes across blocks:
// the scales' division and E4M3 conversion cost more than a block's casts), then each block's
// elements; stochastic rounding's bits for the run drawn together.
template <DType D = DType::F32, typename Values = NoNvfp4Values>
LNMLP_HOST_INLINE void quantize_nvfp4(const storage_t<D>* in, int64_t rows, int64_t cols, bool tiles, float global_amax,
                                      uint8_t* codes, uint8_t* scales, Nvfp4Rounding rounding = {},
                                      Values values = {}) {
  constexpr int64_t B = kNvfp4BlockLength;
  const float global_scale = nvfp4_global_scale(global_amax);
  const int64_t blocks = num_blocks(cols, B), tile_rows = tiles ? B : 1;
  constexpr int64_t kRun = 16;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t r1 = r0 + tile_rows < rows ? r0 + tile_rows : rows;
    for (int64_t b0 = 0; b0 < blocks; b0 += kRun) {
      const int64_t b1 = b0 + kRun < blocks ? b0 + kRun : blocks, run = b1 - b0;
      uint32_t amax_bits[kRun];
      for (int64_t k = 0; k < run; ++k) amax_bits[k] = nvfp4_block_amax_bits<D>(in, r0, r1, cols, b0 + k);
      uint8_t e4m3[kRun];
      float element_scale[kRun];
      LNMLP_QUANT_SIMD
      for (int64_t k = 0; k < run; ++k) {
        const Nvfp4BlockScale s = nvfp4_block_scales_of(amax_bits[k], global_scale);
        e4m3[k] = s.e4m3;
        element_scale[k] = s.element_scale;
      }
      if (!rounding.stochastic || tiles) {
        for (int64_t k = 0; k < run; ++k)
          quantize_nvfp4_block_scaled<D>(in, r0, r1, cols, b0 + k, {e4m3[k], element_scale[k]}, codes, scales, rounding,
                                         values);
        continue;
      }
      // The run's random bits: the Philox blocks its elements fall in (at most 5 per block of 16),
      // drawn together (philox_blocks), then each element's word picked.
      uint64_t first[kRun], counters[kPhiloxBatch];
      int at[kRun], m = 0;
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = block_width(cols, b * B, B);
        first[b - b0] = rounding.index(cols, r0, b * B);
        at[b - b0] = m;
        for (uint64_t k = first[b - b0] >> 2; k <= (first[b - b0] + static_cast<uint64_t>(n) - 1) >> 2; ++k)
          counters[m++] = k;
      }
      uint32_t words[4][kPhiloxBatch];
      philox_blocks(rounding.seed, rounding.offset, counters, m, words);
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = block_width(cols, b * B, B);
        const uint64_t f = first[b - b0];
        uint32_t bits[B];
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t index = f + static_cast<uint64_t>(i);
          bits[i] = words[index & 3][at[b - b0] + static_cast<int64_t>((index >> 2) - (f >> 2))];
        }
        quantize_nvfp4_block_scaled<D>(in, r0, r1, cols, b, {e4m3[b - b0], element_scale[b - b0]}, codes, scales,
                                       rounding, values, bits);
      }
    }
  }
}

// The GEMM operand values of block b of row r of a quantized matrix [rows, cols] (codes and scales
// laid out as above) into `values`: what quantize_nvfp4 put there.
template <typename Values> LNMLP_HD void decode_nvfp4_block(const uint8_t* codes, const uint8_t* scales, int64_t r,
                                                            int64_t cols, int64_t b, const Values& values) {
  const int64_t blocks = num_blocks(cols, kNvfp4BlockLength);
  const float s = fp8_to_float<Fp8Format::E4M3>(scales[r * blocks + b]);
  const uint8_t* q = codes + r * nvfp4_row_bytes(cols);
  for (int64_t c = b * kNvfp4BlockLength; c < cols && c < (b + 1) * kNvfp4BlockLength; ++c)
    values.put(r, c, nvfp4_operand_value(unpack_e2m1(q, c), s));
}

// The values the codes stand for: out[r, c] = e2m1_to_float(code) * float(s_block) / S_enc, the
// product taken as (e2m1 * s_block) * (1 / S_enc) in fp32 (e2m1 * s_block is exact).
LNMLP_HOST_INLINE void dequantize_nvfp4(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                        float global_amax, float* out) {
  const float global_decode = 1.0f / nvfp4_global_scale(global_amax);
  const int64_t blocks = num_blocks(cols, kNvfp4BlockLength), row_bytes = nvfp4_row_bytes(cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = fp8_to_float<Fp8Format::E4M3>(scales[r * blocks + c / kNvfp4BlockLength]);
      out[r * cols + c] = e2m1_to_float(unpack_e2m1(codes + r * row_bytes, c)) * s * global_decode;
    }
}

// ---- the GEMM contract ----------------------------------------------------------------------------
//
// For C = A B^T with A [M, K] and B [N, K] quantized in 1x16 blocks along K (B in 16x16 tiles alike:
// its scales repeat per row), what FP4 hardware computes, TransformerEngine's cuBLASLt call with
// CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3:
//   C[m, n] = alpha * sum over blocks b of
//               ( sum_{k in b} e2m1(qa[m, k]) * e2m1(qb[n, k]) ) * s_a[m, b] * s_b[n, b]
//   alpha   = amax_a * amax_b * (1 / (6 * 6 * 448 * 448)), left to right in fp32
//             (TE's nvte_nvfp4_compute_per_tensor_scale, user alpha 1)
// Each block's dot is exact in fp32 (products are multiples of 1/4 up to 36, 16 of them), and so
// is its product with the two E4M3 scales (at most 12 + 8 significant bits); only the sum over
// blocks rounds, in an order hardware may not share. A backend may therefore multiply operands
// decoded with their block scales, e2m1 * s_block (exact in bf16), accumulating in fp32, and scale
// the result by alpha.
constexpr float kNvfp4AlphaFactorInv = static_cast<float>(1.0 / (6.0 * 6.0 * 448.0 * 448.0));

LNMLP_HD float nvfp4_gemm_alpha(float amax_a, float amax_b) { return 1.0f * amax_a * amax_b * kNvfp4AlphaFactorInv; }

// One output element of the contract: rows qa/sa of A and qb/sb of B (codes packed, scales per
// 1x16 block), K elements.
LNMLP_HOST_INLINE float nvfp4_block_scaled_dot(const uint8_t* qa, const uint8_t* sa, const uint8_t* qb,
                                               const uint8_t* sb, int64_t k, float alpha) {
  float sum = 0.0f;
  for (int64_t b = 0; b * kNvfp4BlockLength < k; ++b) {
    float dot = 0.0f;
    for (int64_t i = b * kNvfp4BlockLength; i < k && i < (b + 1) * kNvfp4BlockLength; ++i)
      dot += e2m1_to_float(unpack_e2m1(qa, i)) * e2m1_to_float(unpack_e2m1(qb, i));
    sum += dot * fp8_to_float<Fp8Format::E4M3>(sa[b]) * fp8_to_float<Fp8Format::E4M3>(sb[b]);
  }
  return alpha * sum;
}

// ---- cuBLASLt's layout of the block scales ------------------------------------------------------
//
// cuBLASLt's FP4 GEMMs (VEC16_UE4M3, sm_100) read the block scales of a K-major operand [outer, K]
// not row by row but in tiles of 128 rows x 4 blocks, 512 bytes each, laid row-major over the
// scales padded to [round up outer to 128, round up the blocks to 4]; inside a tile, row r's block
// j is at byte (r % 32) * 16 + (r / 32) * 4 + j (cuBLAS's "1D block scaling factors layout",
// TransformerEngine's swizzled scales). The padding is zero.
constexpr int64_t kNvfp4GemmScaleTileRows = 128, kNvfp4GemmScaleTileBlocks = 4, kNvfp4GemmScaleTileBytes = 512;

// Scale columns (blocks along K, padded) of a [outer, K] operand in that layout.
LNMLP_HD constexpr int64_t nvfp4_gemm_scale_cols(int64_t K) { return round_up4(num_blocks(K, kNvfp4BlockLength)); }
// Rows of scales (outer, padded) in that layout.
LNMLP_HD constexpr int64_t nvfp4_gemm_scale_rows(int64_t outer) {
  return num_blocks(outer, kNvfp4GemmScaleTileRows) * kNvfp4GemmScaleTileRows;
}
// Bytes of the scales of a [outer, K] operand in that layout, padding included.
LNMLP_HD constexpr int64_t nvfp4_gemm_scale_bytes(int64_t outer, int64_t K) {
  return nvfp4_gemm_scale_rows(outer) * nvfp4_gemm_scale_cols(K);
}
// Where the scale of block b of row o of a [outer, K] operand is in that layout.
LNMLP_HD constexpr int64_t nvfp4_gemm_scale_index(int64_t o, int64_t b, int64_t K) {
  const int64_t tiles_along_k = nvfp4_gemm_scale_cols(K) / kNvfp4GemmScaleTileBlocks;
  const int64_t tile = (o / kNvfp4GemmScaleTileRows) * tiles_along_k + b / kNvfp4GemmScaleTileBlocks;
  const int64_t r = o % kNvfp4GemmScaleTileRows;
  return tile * kNvfp4GemmScaleTileBytes + (r % 32) * 16 + (r / 32) * 4 + b % kNvfp4GemmScaleTileBlocks;
}

}  // namespace lnmlp::numerics
