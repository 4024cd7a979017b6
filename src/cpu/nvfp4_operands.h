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

// Decodes a representation into the GEMM operand out [rows, cols] (bf16 or fp32 per type):
// e2m1(code) * s_block of the element, read from the transposed codes where k says.
inline void decode_nvfp4_operand(int threads, const QuantKind& k, const uint8_t* codes, const void* scale_region,
                                 int64_t rows, int64_t cols, GemmType type, void* out) {
  int64_t qrows, qcols;
  nvfp4_quantized_shape(k, rows, cols, &qrows, &qcols);
  const int64_t row_bytes = numerics::nvfp4_row_bytes(qcols);
  const int64_t blocks = numerics::num_blocks(qcols, numerics::kNvfp4BlockLength);
  const uint8_t* scales = nvfp4_block_scales(scale_region);
  auto value = [&](int64_t qr, int64_t qc) {
    return numerics::e2m1_to_float(numerics::unpack_e2m1(codes + qr * row_bytes, qc)) *
           numerics::fp8_to_float<Fp8Format::E4M3>(scales[qr * blocks + qc / numerics::kNvfp4BlockLength]);
  };
  const bool transposed = k.nvfp4_transposed();
  parallel_chunks(threads, threads, rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const float v = transposed ? value(c, r) : value(r, c);
        if (type == GemmType::BF16) static_cast<uint16_t*>(out)[r * cols + c] = numerics::store<DType::BF16>(v);
        else static_cast<float*>(out)[r * cols + c] = v;
      }
  });
}

// Quantizes in [rows, cols] (fp32, or an I/O dtype read as it is) for k into codes and the scale
// region (k.code_bytes, k.scale_region_bytes), rounding as `rounding` says (its first_index the
// stream's: each element draws at first_index + its index in the quantized matrix). A transposed
// kind needs `transposed`, rows * cols floats.
template <DType D> void quantize_nvfp4_operand(int threads, const QuantKind& k, const numerics::storage_t<D>* in,
                                               int64_t rows, int64_t cols, numerics::Nvfp4Rounding rounding,
                                               uint8_t* codes, void* scale_region, float* transposed) {
  constexpr int64_t B = numerics::kNvfp4BlockLength;
  int64_t qrows, qcols;
  nvfp4_quantized_shape(k, rows, cols, &qrows, &qcols);
  uint8_t* scales = nvfp4_block_scales(scale_region);
  const int64_t row_bytes = numerics::nvfp4_row_bytes(qcols), blocks = numerics::num_blocks(qcols, B);
  // Quantizes rows [r0, r1) of the matrix m (of type S) with the global amax.
  auto quantize_rows = [&](auto dtype, const auto* m, float amax) {
    constexpr DType S = decltype(dtype)::value;
    const int64_t band = k.tiles() ? B : 1;  // tiles: whole 16-row bands per chunk
    parallel_chunks(threads, threads, numerics::num_blocks(qrows, band), [&](int64_t b0, int64_t b1, int) {
      const int64_t r0 = b0 * band, r1 = b1 * band < qrows ? b1 * band : qrows;
      numerics::Nvfp4Rounding part = rounding;
      part.first_index += static_cast<uint64_t>(r0 * qcols);
      numerics::quantize_nvfp4<S>(m + r0 * qcols, r1 - r0, qcols, k.tiles(), amax, codes + r0 * row_bytes,
                                  scales + r0 * blocks, part);
    });
  };
  if (!k.nvfp4_transposed()) {
    const float amax = numerics::amax_from_bits(parallel_amax_bits<D>(threads, in, rows * cols));
    *nvfp4_amax(scale_region) = amax;
    quantize_rows(std::integral_constant<DType, D>{}, in, amax);
    return;
  }
  // The transpose [cols, rows] in fp32, each row (a column of `in`) Hadamard-transformed in whole
  // blocks of 16 where k says (a partial last block stays as it is: the identity, orthogonal too).
  parallel_chunks(threads, threads, cols, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) {
      float* t = transposed + c * rows;
      for (int64_t r = 0; r < rows; ++r) t[r] = numerics::load<D>(in[r * cols + c]);
      if (k.hadamard) numerics::random_hadamard_rows(t, 1, rows, t);
    }
  });
  const float amax = numerics::amax_from_bits(parallel_amax_bits<DType::F32>(threads, transposed, rows * cols));
  *nvfp4_amax(scale_region) = amax;
  quantize_rows(std::integral_constant<DType, DType::F32>{}, transposed, amax);
}

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
