// An FP8 recipe resolved for execution (the defaults filled in, a format per quantizer) and the
// layout of the delayed-scaling state. Shared by the plan, the C API and every backend.
//
// State layout (fp32, in backend memory, only for DELAYED): for each quantizer q in
// LNMLP_QUANTIZER_* order, state[q * stride] is its scale and state[q * stride + 1 ..] its amax
// history of amax_history_len entries, newest first (numerics/scaling.h).
#pragma once

#include <cstdint>

#include "config.h"
#include "numerics/fp8.h"
#include "numerics/quantize.h"

namespace lnmlp {

using numerics::Fp8Format;

constexpr int kQuantizerCount = 6;
enum Quantizer : int { kLnOut = 0, kW1 = 1, kActOut = 2, kW2 = 3, kDy = 4, kDh = 5 };
constexpr const char* quantizer_name(int q) {
  return q == kLnOut ? "ln_out" : q == kW1 ? "w1" : q == kActOut ? "act_out" : q == kW2 ? "w2" : q == kDy ? "dy" : "dh";
}
constexpr bool is_forward_quantizer(int q) { return q < kDy; }

struct ResolvedRecipe {
  Recipe recipe = Recipe::None;
  Fp8Format formats[kQuantizerCount] = {};
  bool power_2_scale = false;  // current, block
  float amax_epsilon = 0.0f;   // current, block
  int32_t margin = 0;          // delayed
  int32_t history_len = 0;     // delayed; 0 otherwise
  bool amax_max = true;        // delayed

  bool per_tensor() const { return recipe == Recipe::Delayed || recipe == Recipe::Current; }
  bool blocked() const { return recipe == Recipe::Block || recipe == Recipe::Mxfp8; }
  bool stateful() const { return recipe == Recipe::Delayed; }
  // Floats of one quantizer's state (scale + history) and of the whole state.
  int64_t state_stride() const { return stateful() ? 1 + int64_t{history_len} : 0; }
  int64_t state_floats() const { return kQuantizerCount * state_stride(); }
};

inline ResolvedRecipe resolve_recipe(const Fp8Options& o) {
  ResolvedRecipe r;
  r.recipe = o.recipe;
  if (o.recipe == Recipe::None) return r;
  Fp8Mix mix = o.format;
  if (mix == Fp8Mix::Default)
    mix = (o.recipe == Recipe::Delayed || o.recipe == Recipe::Current) ? Fp8Mix::Hybrid : Fp8Mix::E4M3;
  for (int q = 0; q < kQuantizerCount; ++q)
    r.formats[q] = (mix == Fp8Mix::Hybrid && !is_forward_quantizer(q)) ? Fp8Format::E5M2 : Fp8Format::E4M3;
  r.power_2_scale = o.power_2_scale < 0 ? o.recipe == Recipe::Block : o.power_2_scale == 1;
  r.amax_epsilon = o.amax_epsilon;
  if (o.recipe == Recipe::Delayed) {
    r.margin = o.margin;
    r.history_len = o.amax_history_len;
    r.amax_max = o.amax_max;
  }
  return r;
}

// Which dimension of an operand [rows, cols] its GEMM contracts: Cols (blocks run along a row,
// "rowwise") or Rows (blocks run down a column, "columnwise").
enum class Contract { Cols, Rows };

// How one operand is quantized.
struct QuantKind {
  Recipe recipe;
  Fp8Format format;
  Contract contract;
  bool weight;  // BLOCK: 128x128 tiles instead of 1x128 blocks
  bool power_2_scale;
  float amax_epsilon;

  bool per_tensor() const { return recipe == Recipe::Delayed || recipe == Recipe::Current; }
  bool tiles() const { return recipe == Recipe::Block && weight; }
  int64_t block() const {
    return recipe == Recipe::Mxfp8 ? numerics::kMxfp8BlockLength : numerics::kBlockScalingLength;
  }
  int64_t scale_bytes() const { return recipe == Recipe::Mxfp8 ? 1 : 4; }
  // Where an element's scale is (numerics/quantize.h's block_scale_index).
  numerics::ScaleLayout scale_layout() const {
    if (per_tensor()) return numerics::ScaleLayout::PerTensor;
    if (tiles()) return numerics::ScaleLayout::Tiles;
    return contract == Contract::Cols ? numerics::ScaleLayout::AlongRows : numerics::ScaleLayout::DownColumns;
  }
  // Whether a quantization contracting the other dimension gives the same codes and scales: per
  // tensor, and BLOCK's 128x128 weight tiles.
  bool orientation_free() const { return per_tensor() || tiles(); }
  // Number of block scales of a [rows, cols] operand (0 per tensor).
  int64_t scale_count(int64_t rows, int64_t cols) const {
    if (per_tensor()) return 0;
    const int64_t b = block();
    if (tiles()) return numerics::num_blocks(rows, b) * numerics::num_blocks(cols, b);
    return contract == Contract::Cols ? rows * numerics::num_blocks(cols, b) : numerics::num_blocks(rows, b) * cols;
  }
};

// How quantizer q's tensor is quantized for a GEMM that contracts `contract` (docs/fp8.md's table).
inline QuantKind quant_kind(const ResolvedRecipe& r, int q, Contract contract) {
  return {r.recipe, r.formats[q], contract, q == kW1 || q == kW2, r.power_2_scale, r.amax_epsilon};
}

}  // namespace lnmlp
