// NVFP4's random Hadamard transform (docs/design.md, "NVFP4"): TransformerEngine applies it to the
// two inputs of the weight-gradient GEMM, along their contraction dimension (the tokens), in
// blocks of 16 aligned with the quantization blocks, before quantizing them. A 1x16 block x becomes
//   y = x · diag(s) · H16 / 4,   y_j = sum_i x_i s_i H16[i][j] / 4,
// H16 the Sylvester Hadamard matrix (H16[i][j] = (-1)^popcount(i & j)) and s TE's fixed sign vector
// (its get_wgrad_sign_vector). diag(s) · H16 / 4 is orthogonal, so transforming both operands of a
// GEMM along their shared dimension leaves the product unchanged in exact arithmetic, while it
// spreads each block's outliers over its 16 elements.
//
// In fp32: the products x_i s_i / 4 are exact, and the 16 are summed by the fast Walsh-Hadamard
// butterfly (4 stages of sums and differences). Wherever every partial sum is exact -- any block
// whose nonzero magnitudes span at most 2^12 with at most 8 significant bits each, bf16 values for
// instance -- that is the exact sum rounded once, what any fp32 summation order gives (TE's
// kernels sum on tensor cores in fp32); beyond, it is this order's rounding.
#pragma once

#include <cstdint>

#include "hd.h"

namespace lnmlp::numerics {

constexpr int kHadamardLength = 16;

// TransformerEngine's sign vector as a bit mask: bit i set where s_i = -1
// (s = 1 1 1 -1 1 -1 -1 -1 -1 -1 -1 1 -1 1 -1 -1).
constexpr uint32_t kRhtSignMask = 0xd7e8u;

// y = x · diag(s) · H16 / 4 for one block of 16 (x and y may be the same array).
LNMLP_HD void random_hadamard16(const float* x, float* y) {
  float t[kHadamardLength];
  for (int i = 0; i < kHadamardLength; ++i) t[i] = ((kRhtSignMask >> i) & 1u) ? -0.25f * x[i] : 0.25f * x[i];
  for (int half = 1; half < kHadamardLength; half *= 2) {
    for (int i = 0; i < kHadamardLength; i += 2 * half) {
      for (int j = i; j < i + half; ++j) {
        const float a = t[j], b = t[j + half];
        t[j] = a + b;
        t[j + half] = a - b;
      }
    }
  }
  for (int i = 0; i < kHadamardLength; ++i) y[i] = t[i];
}

// The transform of every 1x16 block of a [rows, cols] row-major matrix, into `out` (which may be
// `in`). TransformerEngine requires cols to be a multiple of 16; here a partial last block is
// copied as it is (the identity, orthogonal too, so a GEMM of two operands transformed alike along
// their shared dimension keeps its product).
LNMLP_HOST_INLINE void random_hadamard_rows(const float* in, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    int64_t c = 0;
    for (; c + kHadamardLength <= cols; c += kHadamardLength) random_hadamard16(in + r * cols + c, out + r * cols + c);
    for (; c < cols; ++c) out[r * cols + c] = in[r * cols + c];
  }
}

}  // namespace lnmlp::numerics
