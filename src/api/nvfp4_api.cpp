// The NVFP4 quantization of the C API (lnmlp_nvfp4_quantize / lnmlp_nvfp4_dequantize): host
// arrays, the numerics of src/numerics/quantize_nvfp4.h. Same conventions as api.cpp: validate
// everything, then write; nothing escapes api_guard.
#include <algorithm>
#include <cstdint>
#include <limits>

#include "common/error.h"
#include "cpu/fork_child.h"
#include "lnmlp.h"
#include "numerics/quantize_nvfp4.h"

using namespace lnmlp;
using numerics::kNvfp4BlockLength;

namespace {

// Rows per parallel chunk: a multiple of the tile height, so that no tile is split.
constexpr int64_t kChunkRows = 16 * kNvfp4BlockLength;
// Large matrices are split over the OpenMP threads; small ones are not worth waking them.
constexpr int64_t kParallelMin = int64_t{1} << 18;

void check_shape(int64_t rows, int64_t cols, float global_amax) {
  if (rows < 0 || cols < 0) fail(LNMLP_ERROR_INVALID_ARGUMENT, "rows and cols must be >= 0, got ", rows, " x ", cols);
  if (cols > 0 && rows > std::numeric_limits<int64_t>::max() / cols)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "rows * cols overflows: ", rows, " x ", cols);
  if (global_amax < 0.0f)  // NaN compares false: allowed (the amax of a matrix holding a NaN)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "global_amax must be >= 0, +inf or NaN, got ", global_amax);
}

void check_pointer(const void* p, const char* name, int64_t rows, int64_t cols) {
  if (rows * cols > 0 && p == nullptr)
    fail(LNMLP_ERROR_NULL_POINTER, name, " is NULL, but the matrix is ", rows, " x ", cols);
}

// Calls fn(r0, r1) for chunks of rows, on the OpenMP threads where the matrix is large.
template <typename Fn> void for_row_chunks(int64_t rows, int64_t cols, Fn&& fn) {
  const int64_t chunks = (rows + kChunkRows - 1) / kChunkRows;
#pragma omp parallel for schedule(static) if (rows * cols >= kParallelMin && !cpu::in_forked_child())
  for (int64_t i = 0; i < chunks; ++i) fn(i * kChunkRows, std::min(rows, (i + 1) * kChunkRows));
}

}  // namespace

extern "C" {

LNMLP_API int32_t lnmlp_nvfp4_quantize(const float* x, int64_t rows, int64_t cols, int32_t block_rows,
                                       float global_amax, uint8_t* codes, uint8_t* scales) {
  return api_guard(__func__, [&] {
    check_shape(rows, cols, global_amax);
    if (block_rows != 1 && block_rows != kNvfp4BlockLength)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "block_rows must be 1 (1x16 blocks) or 16 (16x16 tiles), got ", block_rows);
    check_pointer(x, "x", rows, cols);
    check_pointer(codes, "codes", rows, cols);
    check_pointer(scales, "scales", rows, cols);
    const int64_t row_bytes = numerics::nvfp4_row_bytes(cols), blocks = numerics::num_blocks(cols, kNvfp4BlockLength);
    for_row_chunks(rows, cols, [&](int64_t r0, int64_t r1) {
      numerics::quantize_nvfp4(x + r0 * cols, r1 - r0, cols, block_rows != 1, global_amax, codes + r0 * row_bytes,
                               scales + r0 * blocks);
    });
  });
}

LNMLP_API int32_t lnmlp_nvfp4_dequantize(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols,
                                         float global_amax, float* values) {
  return api_guard(__func__, [&] {
    check_shape(rows, cols, global_amax);
    check_pointer(codes, "codes", rows, cols);
    check_pointer(scales, "scales", rows, cols);
    check_pointer(values, "values", rows, cols);
    const int64_t row_bytes = numerics::nvfp4_row_bytes(cols), blocks = numerics::num_blocks(cols, kNvfp4BlockLength);
    for_row_chunks(rows, cols, [&](int64_t r0, int64_t r1) {
      numerics::dequantize_nvfp4(codes + r0 * row_bytes, scales + r0 * blocks, r1 - r0, cols, global_amax,
                                 values + r0 * cols);
    });
  });
}

}  // extern "C"
