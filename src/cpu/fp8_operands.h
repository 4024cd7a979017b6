// The CPU backend's FP8 operands: quantizing an fp32 matrix the way one GEMM reads it (per tensor,
// 1xK blocks along rows, Kx1 blocks down columns, 128x128 weight tiles, mxfp8), and decoding the
// codes into what the GEMM library multiplies (docs/fp8.md, "How the CPU backend computes a
// quantized GEMM"). The arithmetic is numerics/quantize.h's; this file only lays it out over the
// cores.
#pragma once

#include "isa.h"

#include <cstdint>
#include <algorithm>
#include <type_traits>

#include "fp8_lookup.h"
#include "gemm.h"
#include "gemm_plan.h"
#include "numerics/dtype.h"
#include "numerics/quantize.h"
#include "parallel.h"
#include "plan/fp8_recipe.h"

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {

using numerics::Fp8Format;

// The bits of max |x| over n values of D's storage type (the I/O dtype, or fp32) on the cores:
// numerics/quantize.h's, exact in any order.
template <DType D> uint32_t parallel_amax_bits(int threads, const numerics::storage_t<D>* x, int64_t n) {
  uint32_t part[256];
  const int chunks = threads < 256 ? threads : 256;
  for (int c = 0; c < chunks; ++c) part[c] = 0;
  parallel_chunks(threads, chunks, n,
                  [&](int64_t i0, int64_t i1, int c) { part[c] = numerics::amax_bits_of<D>(x + i0, i1 - i0); });
  uint32_t m = 0;
  for (int c = 0; c < chunks; ++c) m = numerics::amax_bits_max(m, part[c]);
  return m;
}

// Quantizes in [rows, cols] (fp32, or an I/O dtype read as it is) for k into out (numerics'
// ToCodes: codes [rows, cols]; ToDecoded: the GEMM operand decode_operand would make of them) and,
// for blocked recipes, scales (k.scale_count floats, or E8M0 bytes for mxfp8). Per-tensor kinds
// use `scale`. `work` holds threads * cols uint32 (column bands).
template <DType D, typename Out> void quantize_operand_to(int threads, const QuantKind& k,
                                                          const numerics::storage_t<D>* in, int64_t rows, int64_t cols,
                                                          float scale, Out out, void* scales, uint32_t* work) {
  numerics::dispatch_fp8(k.format, [&](auto ft) {
    constexpr Fp8Format F = decltype(ft)::value;
    const int64_t b = k.block();
    if (k.per_tensor()) {
      parallel_chunks(threads, threads, rows * cols, [&](int64_t i0, int64_t i1, int) {
        numerics::quantize_tensor_to<F, D>(in + i0, i1 - i0, scale, 1.0f, out.at(i0));
      });
    } else if (k.tiles()) {
      const int64_t bands = numerics::num_blocks(rows, b), nbc = numerics::num_blocks(cols, b);
      parallel_chunks(threads, threads, bands, [&](int64_t b0, int64_t b1, int) {
        for (int64_t band = b0; band < b1; ++band) {
          const int64_t r0 = band * b, h = rows - r0 < b ? rows - r0 : b;
          numerics::quantize_tiles_to<F, D>(in + r0 * cols, h, cols, b, b, k.power_2_scale, k.amax_epsilon,
                                            out.at(r0 * cols), static_cast<float*>(scales) + band * nbc);
        }
      });
    } else if (k.contract == Contract::Cols) {  // (below, each recipe its own call: the scales' loop vectorizes)
      const int64_t nb = numerics::num_blocks(cols, b);
      parallel_chunks(threads, threads, rows, [&](int64_t r0, int64_t r1, int) {
        if (k.recipe == Recipe::Mxfp8)
          numerics::quantize_blocks_along_rows<F, D>(in + r0 * cols, r1 - r0, cols, b, true, false, 0.0f,
                                                     out.at(r0 * cols), nullptr,
                                                     static_cast<uint8_t*>(scales) + r0 * nb);
        else
          numerics::quantize_blocks_along_rows<F, D>(in + r0 * cols, r1 - r0, cols, b, false, k.power_2_scale,
                                                     k.amax_epsilon, out.at(r0 * cols),
                                                     static_cast<float*>(scales) + r0 * nb, nullptr);
      });
    } else {
      parallel_chunks(threads, threads, numerics::num_blocks(rows, b), [&](int64_t b0, int64_t b1, int c) {
        uint32_t* w = work + c * cols;
        for (int64_t band = b0; band < b1; ++band) {
          const int64_t r0 = band * b, h = rows - r0 < b ? rows - r0 : b;
          if (k.recipe == Recipe::Mxfp8)
            numerics::quantize_cols_band_to<F, D>(in, cols, band, r0, h, true, false, 0.0f, out, scales, w);
          else
            numerics::quantize_cols_band_to<F, D>(in, cols, band, r0, h, false, k.power_2_scale, k.amax_epsilon, out,
                                                  scales, w);
        }
      });
    }
  });
}

// Quantizes in into codes [rows, cols] and scales (above).
template <DType D = DType::F32> void quantize_operand(int threads, const QuantKind& k, const numerics::storage_t<D>* in,
                                                      int64_t rows, int64_t cols, float scale, uint8_t* codes,
                                                      void* scales, uint32_t* work) {
  quantize_operand_to<D>(threads, k, in, rows, cols, scale, numerics::ToCodes{codes}, scales, work);
}

// Quantizes in straight into the GEMM operand of `type` (bf16 or fp32) at out, bit for bit what
// decode_operand makes of quantize_operand's codes, without making them (where nothing else reads
// them: about half the work of the two passes); the scales as quantize_operand's.
template <DType D = DType::F32>
void quantize_to_operand(int threads, const QuantKind& k, const numerics::storage_t<D>* in, int64_t rows, int64_t cols,
                         float scale, void* scales, GemmType type, void* out, uint32_t* work) {
  if (type == GemmType::BF16)
    quantize_operand_to<D>(threads, k, in, rows, cols, scale,
                           numerics::ToDecoded<DType::BF16>{static_cast<uint16_t*>(out)}, scales, work);
  else
    quantize_operand_to<D>(threads, k, in, rows, cols, scale, numerics::ToDecoded<DType::F32>{static_cast<float*>(out)},
                           scales, work);
}

// Decodes codes [rows, cols] into the GEMM operand: fp8 value times its block's scale_inv (per
// tensor: the bare fp8 value; the scale_inv goes to the GEMM's epilogue). bf16 or fp32 per type.
// Where the kernels decode by table lookup (fp8_lookup.h), a row's codes are looked up kSpan at a
// time (a multiple of every block length) and the span's values then scaled and rounded.
inline void decode_operand(int threads, const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows,
                           int64_t cols, GemmType type, void* out) {
  constexpr int64_t kSpan = 256;
  static_assert(kSpan % numerics::kMxfp8BlockLength == 0 && kSpan % numerics::kBlockScalingLength == 0);
  numerics::dispatch_fp8(k.format, [&](auto ft) {
    constexpr Fp8Format F = decltype(ft)::value;
    const int64_t b = k.block();
    const numerics::ScaleLayout layout = k.scale_layout();
    const bool e8m0 = k.recipe == Recipe::Mxfp8;
    const auto* sf = static_cast<const float*>(scales);
    const auto* s8 = static_cast<const uint8_t*>(scales);
    auto scale_inv = [&](int64_t i) { return e8m0 ? numerics::e8m0_to_float(s8[i]) : sf[i]; };
    // Writes o[c] = v(c) * s(c) for c in [c0, c1) of row r, v and s given per element.
    auto write = [&](int64_t r, int64_t c0, int64_t c1, auto v, auto s) {
      if (type == GemmType::BF16) {
        uint16_t* o = static_cast<uint16_t*>(out) + r * cols;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) o[c] = numerics::store<numerics::DType::BF16>(v(c) * s(c));
      } else {
        float* o = static_cast<float*>(out) + r * cols;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) o[c] = v(c) * s(c);
      }
    };
    parallel_chunks(threads, threads, rows, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* q = codes + r * cols;
#if LNMLP_CPU_FP8_LOOKUP
        if (layout == numerics::ScaleLayout::PerTensor && type == GemmType::BF16) {  // the looked-up bf16 itself
          fp8_to_bf16_lookup<F>(q, cols, static_cast<uint16_t*>(out) + r * cols);
          continue;
        }
#endif
        for (int64_t a = 0; a < cols; a += kSpan) {
          const int64_t e = cols - a < kSpan ? cols : a + kSpan;
#if LNMLP_CPU_FP8_LOOKUP
          alignas(64) float v[kSpan];
          fp8_to_float_lookup<F>(q + a, e - a, v);
          auto value = [&v, a](int64_t c) { return v[c - a]; };
#else
          auto value = [q](int64_t c) { return numerics::fp8_to_float<F>(q[c]); };
#endif
          if (layout == numerics::ScaleLayout::PerTensor) {
            write(r, a, e, value, [](int64_t) { return 1.0f; });
          } else if (layout == numerics::ScaleLayout::DownColumns) {  // a scale per column, shared by `b` rows
            const int64_t base = numerics::block_scale_index(layout, r, 0, cols, b);
            if (e8m0) write(r, a, e, value, [s8, base](int64_t c) { return numerics::e8m0_to_float(s8[base + c]); });
            else write(r, a, e, value, [sf, base](int64_t c) { return sf[base + c]; });
          } else {  // one scale per block of the row (or per tile)
            for (int64_t c0 = a; c0 < e; c0 += b) {
              const float si = scale_inv(numerics::block_scale_index(layout, r, c0, cols, b));
              write(r, c0, e - c0 < b ? e : c0 + b, value, [si](int64_t) { return si; });
            }
          }
        }
      }
    });
  });
}

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
