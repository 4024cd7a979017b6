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
#include "quantize.h"
#include "scaling.h"

namespace lnmlp::numerics {

constexpr int64_t kNvfp4BlockLength = 16;  // 1x16 blocks, 16x16 weight tiles

// Bytes of a row of codes packed two to a byte.
LNMLP_HD constexpr int64_t nvfp4_row_bytes(int64_t cols) { return (cols + 1) / 2; }

// Quantizes `in` with the global scale of `global_amax` (the tensor's amax, NaN-propagating as
// amax_of gives it; a caller may pass another tensor's, as TransformerEngine's quantizers may).
template <DType D = DType::F32> LNMLP_HOST_INLINE void quantize_nvfp4(const storage_t<D>* in, int64_t rows,
                                                                      int64_t cols, bool tiles, float global_amax,
                                                                      uint8_t* codes, uint8_t* scales) {
  constexpr int64_t B = kNvfp4BlockLength;
  const float global_scale = nvfp4_global_scale(global_amax);
  const int64_t blocks = num_blocks(cols, B), row_bytes = nvfp4_row_bytes(cols);
  const int64_t tile_rows = tiles ? B : 1;
  for (int64_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const int64_t r1 = r0 + tile_rows < rows ? r0 + tile_rows : rows;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t c0 = b * B, n = cols - c0 < B ? cols - c0 : B;
      uint32_t m = 0;
      for (int64_t r = r0; r < r1; ++r) m = amax_bits_max(m, amax_bits_of<D>(in + r * cols + c0, n));
      const uint8_t block_scale = nvfp4_block_scale_e4m3(amax_from_bits(m), global_scale);
      const float scale = nvfp4_element_scale(block_scale, global_scale);
      for (int64_t r = r0; r < r1; ++r) {
        scales[r * blocks + b] = block_scale;
        const storage_t<D>* x = in + r * cols + c0;
        uint8_t* out = codes + r * row_bytes + c0 / 2;
        for (int64_t i = 0; i < n; i += 2) {
          const uint8_t even = float_to_e2m1(load<D>(x[i]) * scale);
          const uint8_t odd = i + 1 < n ? float_to_e2m1(load<D>(x[i + 1]) * scale) : uint8_t{0};
          out[i / 2] = pack_e2m1x2(even, odd);
        }
      }
    }
  }
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

}  // namespace lnmlp::numerics
