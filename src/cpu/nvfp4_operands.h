// The CPU backend's NVFP4 operands (docs/fp8.md, "NVFP4"): quantizing a [rows, cols] tensor the way
// one GEMM reads it, and decoding the codes into what the GEMM library multiplies. The arithmetic is
// numerics/quantize_nvfp4.h's and numerics/hadamard.h's; this file lays it out over the cores.
//
// A representation is what TransformerEngine's NVFP4 tensor holds for one orientation: E2M1 codes
// and E4M3 block scales of the matrix it quantizes along its rows -- the tensor itself for a GEMM
// that contracts its columns (and a weight's 16x16 tiles, either way), else its transpose, first
// Hadamard-transformed in blocks of 16 where the QuantKind says -- and that matrix's global amax,
// kept as the fp32 before the scales (QuantKind::scale_region_bytes). The decoded GEMM operand is
// [rows, cols] of e2m1 * s_block (exact in bf16), which the GEMM multiplies with fp32 accumulation
// and the epilogue scales by nvfp4_gemm_alpha of the two operands' amaxes: the contract of
// numerics/quantize_nvfp4.h.
#pragma once

#include "isa.h"

#include <cstdint>
#include <cstring>

#include "fp8_operands.h"
#include "gemm.h"
#include "numerics/hadamard.h"
#include "numerics/quantize_nvfp4.h"
#include "parallel.h"
#include "plan/fp8_recipe.h"

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {

// Where a representation's global amax is: the fp32 before its block scales.
inline float* nvfp4_amax(void* scale_region) { return static_cast<float*>(scale_region); }
inline const float* nvfp4_amax(const void* scale_region) { return static_cast<const float*>(scale_region); }
inline uint8_t* nvfp4_block_scales(void* scale_region) {
  return static_cast<uint8_t*>(scale_region) + QuantKind::kNvfp4AmaxBytes;
}
inline const uint8_t* nvfp4_block_scales(const void* scale_region) {
  return static_cast<const uint8_t*>(scale_region) + QuantKind::kNvfp4AmaxBytes;
}

// The rows and columns of the matrix k quantizes for a [rows, cols] operand.
inline void nvfp4_quantized_shape(const QuantKind& k, int64_t rows, int64_t cols, int64_t* qrows, int64_t* qcols) {
  *qrows = k.nvfp4_transposed() ? cols : rows;
  *qcols = k.nvfp4_transposed() ? rows : cols;
}

// Calls fn(values) with where a representation's operand values go in the GEMM operand out
// [rows, cols] of `type` (numerics' Nvfp4Values: by strides, the transposed matrix's element
// (qr, qc) at out[qc * cols + qr]), offset to the quantized matrix's row r0; or with
// NoNvfp4Values where out is NULL.
template <typename Fn>
void with_operand_values(const QuantKind& k, int64_t cols, GemmType type, void* out, int64_t r0, Fn&& fn) {
  const bool transposed = k.nvfp4_transposed();
  const int64_t offset = r0 * (transposed ? 1 : cols);
  if (out == nullptr) {
    fn(numerics::NoNvfp4Values{});
  } else if (type == GemmType::BF16) {
    fn(numerics::nvfp4_operand_values<DType::BF16>(static_cast<uint16_t*>(out) + offset, transposed, cols));
  } else {
    fn(numerics::nvfp4_operand_values<DType::F32>(static_cast<float*>(out) + offset, transposed, cols));
  }
}

// Decodes a representation into the GEMM operand out [rows, cols] (bf16 or fp32 per type):
// e2m1(code) * s_block of the element, read from the transposed codes where k says.
inline void decode_nvfp4_operand(int threads, const QuantKind& k, const uint8_t* codes, const void* scale_region,
                                 int64_t rows, int64_t cols, GemmType type, void* out) {
  int64_t qrows, qcols;
  nvfp4_quantized_shape(k, rows, cols, &qrows, &qcols);
  const int64_t row_bytes = numerics::nvfp4_row_bytes(qcols),
                blocks = numerics::num_blocks(qcols, numerics::kNvfp4BlockLength);
  const uint8_t* scales = nvfp4_block_scales(scale_region);
  parallel_chunks(threads, threads, qrows, [&](int64_t r0, int64_t r1, int) {
    with_operand_values(k, cols, type, out, r0, [&](const auto& values) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t b = 0; b < blocks; ++b)
          numerics::decode_nvfp4_block(codes + r0 * row_bytes, scales + r0 * blocks, r - r0, qcols, b, values);
    });
  });
}

// The transpose of in [rows, cols] into t [cols, rows] in fp32, on the cores by bands of columns
// one cache line wide (kCols elements of `in`): down the band 16 rows at a time, each row's kCols
// elements read whole and widened, turned in a buffer in L1, then written as runs of 16 floats
// (64 bytes) to kCols rows of t, which so fill front to back. (Reading down one column at a time
// fetched a cache line per element, and power-of-two row strides kept few of them cached: 2.3 ns
// an element on one Zen 4 core.)
template <DType D>
void transpose_to_f32(int threads, const numerics::storage_t<D>* in, int64_t rows, int64_t cols, float* t) {
  constexpr int64_t kRows = 16, kCols = 64 / static_cast<int64_t>(sizeof(numerics::storage_t<D>));
  parallel_chunks(threads, threads, numerics::num_blocks(cols, kCols), [&](int64_t b0, int64_t b1, int) {
    const int64_t c_end = b1 * kCols < cols ? b1 * kCols : cols;
    for (int64_t c0 = b0 * kCols; c0 < c_end; c0 += kCols) {
      const int64_t nc = c_end - c0 < kCols ? c_end - c0 : kCols;
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {
        const int64_t nr = rows - r0 < kRows ? rows - r0 : kRows;
        float tile[kCols][kRows];  // [column][row]
        for (int64_t i = 0; i < nr; ++i) {
          float row[kCols];
          const numerics::storage_t<D>* src = in + (r0 + i) * cols + c0;
          if (nc == kCols) {
            for (int64_t j = 0; j < kCols; ++j) row[j] = numerics::load<D>(src[j]);
          } else {
            for (int64_t j = 0; j < nc; ++j) row[j] = numerics::load<D>(src[j]);
          }
          for (int64_t j = 0; j < nc; ++j) tile[j][i] = row[j];
        }
        for (int64_t j = 0; j < nc; ++j) std::memcpy(t + (c0 + j) * rows + r0, tile[j], sizeof(float) * nr);
      }
    }
  });
}

// The bits of the amax of the matrix a transposed kind with the Hadamard transform quantizes:
// in [rows, cols]'s columns transformed in whole blocks of 16 rows (a partial last block as it is),
// without writing them.
template <DType D>
uint32_t hadamard_columns_amax_bits(int threads, const numerics::storage_t<D>* in, int64_t rows, int64_t cols) {
  constexpr int64_t B = numerics::kHadamardLength;
  uint32_t part[256] = {};
  const int chunks = threads < 256 ? threads : 256;
  parallel_chunks(threads, chunks, cols, [&](int64_t c0, int64_t c1, int ch) {
    uint32_t m = 0;
    for (int64_t c = c0; c < c1; ++c) {
      int64_t r = 0;
      for (; r + B <= rows; r += B) {
        float block[B];
        for (int64_t i = 0; i < B; ++i) block[i] = numerics::load<D>(in[(r + i) * cols + c]);
        numerics::random_hadamard16(block, block);
        m = numerics::amax_bits_max(m, numerics::amax_bits_of<DType::F32>(block, B));
      }
      for (; r < rows; ++r) m = numerics::amax_bits_max(m, numerics::amax_bits_of<D>(in + r * cols + c, 1));
    }
    part[ch] = m;
  });
  uint32_t m = 0;
  for (int c = 0; c < chunks; ++c) m = numerics::amax_bits_max(m, part[c]);
  return m;
}

// Quantizes in [rows, cols] (fp32, or an I/O dtype read as it is) for k into codes and the scale
// region (k.code_bytes, k.scale_region_bytes), rounding as `rounding` says (each element drawing
// at its index in the stream: numerics' Nvfp4Rounding), and where op is not NULL also into the
// GEMM operand op [rows, cols] of `type` in the same pass (what decode_nvfp4_operand makes of the
// codes). The global amax is *given_amax where that is not NULL (a group's), else the quantized
// matrix's own. A transposed kind needs `transposed`, rows * cols floats.
template <DType D> void quantize_nvfp4_operand(int threads, const QuantKind& k, const numerics::storage_t<D>* in,
                                               int64_t rows, int64_t cols, numerics::Nvfp4Rounding rounding,
                                               const float* given_amax, uint8_t* codes, void* scale_region,
                                               float* transposed, GemmType type, void* op) {
  constexpr int64_t B = numerics::kNvfp4BlockLength;
  int64_t qrows, qcols;
  nvfp4_quantized_shape(k, rows, cols, &qrows, &qcols);
  uint8_t* scales = nvfp4_block_scales(scale_region);
  const int64_t row_bytes = numerics::nvfp4_row_bytes(qcols), blocks = numerics::num_blocks(qcols, B);
  // Quantizes the matrix m (of type S) with the global amax, in chunks of rows (of whole 16-row
  // bands for tiles).
  auto quantize_rows = [&](auto dtype, const auto* m, float amax) {
    constexpr DType S = decltype(dtype)::value;
    const int64_t band = k.tiles() ? B : 1;
    parallel_chunks(threads, threads, numerics::num_blocks(qrows, band), [&](int64_t b0, int64_t b1, int) {
      const int64_t r0 = b0 * band, r1 = b1 * band < qrows ? b1 * band : qrows;
      numerics::Nvfp4Rounding part = rounding;
      part.row_offset += r0;
      with_operand_values(k, cols, type, op, r0, [&](const auto& values) {
        numerics::quantize_nvfp4<S>(m + r0 * qcols, r1 - r0, qcols, k.tiles(), amax, codes + r0 * row_bytes,
                                    scales + r0 * blocks, part, values);
      });
    });
  };
  if (!k.nvfp4_transposed()) {
    const float amax =
        given_amax != nullptr ? *given_amax : numerics::amax_from_bits(parallel_amax_bits<D>(threads, in, rows * cols));
    *nvfp4_amax(scale_region) = amax;
    quantize_rows(std::integral_constant<DType, D>{}, in, amax);
    return;
  }
  // The transpose [cols, rows] in fp32, each row (a column of `in`) Hadamard-transformed in whole
  // blocks of 16 where k says (a partial last block stays as it is: the identity, orthogonal too).
  transpose_to_f32<D>(threads, in, rows, cols, transposed);
  if (k.hadamard)
    parallel_chunks(threads, threads, cols, [&](int64_t c0, int64_t c1, int) {
      numerics::random_hadamard_rows(transposed + c0 * rows, c1 - c0, rows, transposed + c0 * rows);
    });
  const float amax = given_amax != nullptr
                         ? *given_amax
                         : numerics::amax_from_bits(parallel_amax_bits<DType::F32>(threads, transposed, rows * cols));
  *nvfp4_amax(scale_region) = amax;
  quantize_rows(std::integral_constant<DType, DType::F32>{}, transposed, amax);
}

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
