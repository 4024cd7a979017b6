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
#include "numerics/quantize_nvfp4.h"
#include "rng_stream.h"

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
  bool nvfp4_rht = false, nvfp4_stochastic_rounding = false, nvfp4_2d_weights = false;  // nvfp4

  bool per_tensor() const { return recipe == Recipe::Delayed || recipe == Recipe::Current; }
  bool blocked() const { return recipe == Recipe::Block || recipe == Recipe::Mxfp8 || recipe == Recipe::Nvfp4; }
  bool nvfp4() const { return recipe == Recipe::Nvfp4; }
  // Whether a quantized GEMM's result is multiplied by a factor of per-tensor scales: the
  // per-tensor recipes' scale_invs, NVFP4's alpha from the global amaxes.
  bool scaled_gemms() const { return per_tensor() || nvfp4(); }
  // Whether backward draws random numbers (the plan's random state, lnmlp_plan_set_rng_state).
  bool draws_random() const { return nvfp4() && nvfp4_stochastic_rounding; }
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
  if (o.recipe == Recipe::Nvfp4) {  // E2M1 elements; E4M3 is the block scales' format
    r.nvfp4_rht = o.nvfp4_rht;
    r.nvfp4_stochastic_rounding = o.nvfp4_stochastic_rounding;
    r.nvfp4_2d_weights = o.nvfp4_2d_weights;
  }
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
  bool weight;  // BLOCK: 128x128 tiles instead of 1x128 blocks; NVFP4: 16x16 tiles unless disabled
  bool power_2_scale;
  float amax_epsilon;
  bool nvfp4_tiles = false;  // NVFP4: a weight in 16x16 tiles
  bool hadamard = false;     // NVFP4: the random Hadamard transform along the contraction first
  bool stochastic = false;   // NVFP4: stochastic rounding
  // NVFP4 on FP4 GEMMs (the CUDA backend on sm_100): a weight's 16x16 tiles quantized from its
  // transpose, the K-major operand of a GEMM contracting its rows (the codes and scales of the
  // tiles' own quantization, transposed: a tile's scale is the same either way).
  bool nvfp4_tiles_transposed = false;

  bool per_tensor() const { return recipe == Recipe::Delayed || recipe == Recipe::Current; }
  bool nvfp4() const { return recipe == Recipe::Nvfp4; }
  bool tiles() const { return (recipe == Recipe::Block && weight) || nvfp4_tiles; }
  int64_t block() const {
    return recipe == Recipe::Mxfp8   ? numerics::kMxfp8BlockLength
           : recipe == Recipe::Nvfp4 ? numerics::kNvfp4BlockLength
                                     : numerics::kBlockScalingLength;
  }
  int64_t scale_bytes() const { return recipe == Recipe::Mxfp8 || recipe == Recipe::Nvfp4 ? 1 : 4; }
  // Where an element's scale is (numerics/quantize.h's block_scale_index; not NVFP4's, below).
  numerics::ScaleLayout scale_layout() const {
    if (per_tensor()) return numerics::ScaleLayout::PerTensor;
    if (tiles()) return numerics::ScaleLayout::Tiles;
    return contract == Contract::Cols ? numerics::ScaleLayout::AlongRows : numerics::ScaleLayout::DownColumns;
  }
  // Whether a quantization contracting the other dimension gives the same codes and scales: per
  // tensor, and the weight tiles.
  bool orientation_free() const { return per_tensor() || tiles(); }
  // NVFP4 quantizes the matrix a GEMM contracts along its rows: the operand itself (Cols, and the
  // tiles), or its transpose [cols, rows] (Rows), as TransformerEngine's columnwise data.
  bool nvfp4_transposed() const {
    return nvfp4() && ((contract == Contract::Rows && !tiles()) || nvfp4_tiles_transposed);
  }
  // Number of block scales of a [rows, cols] operand (0 per tensor). NVFP4: one per 1x16 block of
  // the matrix it quantizes, tiles repeating theirs on each row (numerics/quantize_nvfp4.h).
  int64_t scale_count(int64_t rows, int64_t cols) const {
    if (per_tensor()) return 0;
    const int64_t b = block();
    if (nvfp4())
      return nvfp4_transposed() ? cols * numerics::num_blocks(rows, b) : rows * numerics::num_blocks(cols, b);
    if (tiles()) return numerics::num_blocks(rows, b) * numerics::num_blocks(cols, b);
    return contract == Contract::Cols ? rows * numerics::num_blocks(cols, b) : numerics::num_blocks(rows, b) * cols;
  }
  // Bytes of the codes of a [rows, cols] operand: one per element, NVFP4's packed two to a byte
  // along the rows of the matrix it quantizes.
  int64_t code_bytes(int64_t rows, int64_t cols) const {
    if (!nvfp4()) return rows * cols;
    return nvfp4_transposed() ? cols * numerics::nvfp4_row_bytes(rows) : rows * numerics::nvfp4_row_bytes(cols);
  }
  // NVFP4 on FP4 GEMMs: bytes of the block scales of a [rows, cols] operand in the GEMM's tiled
  // layout (numerics' nvfp4_gemm_scale_bytes of the matrix quantized).
  int64_t nvfp4_gemm_scale_bytes(int64_t rows, int64_t cols) const {
    return nvfp4_transposed() ? numerics::nvfp4_gemm_scale_bytes(cols, rows)
                              : numerics::nvfp4_gemm_scale_bytes(rows, cols);
  }
  // Bytes of the block scales' region: the scales, and NVFP4's fp32 global amax before them.
  int64_t scale_region_bytes(int64_t rows, int64_t cols) const {
    return scale_count(rows, cols) * scale_bytes() + (nvfp4() ? kNvfp4AmaxBytes : 0);
  }
  static constexpr int64_t kNvfp4AmaxBytes = 4;
};

// How quantizer q's tensor is quantized for a GEMM that contracts `contract` (docs/fp8.md's table).
// NVFP4 (TransformerEngine's NVFP4BlockScaling): weights in 16x16 tiles; the Hadamard transform on
// the inputs of the weight-gradient GEMMs (the columnwise representations of ln_out, act_out, dy
// and dh); stochastic rounding for the gradients dy and dh.
inline QuantKind quant_kind(const ResolvedRecipe& r, int q, Contract contract) {
  const bool weight = q == kW1 || q == kW2;
  QuantKind k{r.recipe, r.formats[q], contract, weight, r.power_2_scale, r.amax_epsilon};
  if (r.nvfp4()) {
    k.nvfp4_tiles = weight && r.nvfp4_2d_weights;
    k.hadamard = r.nvfp4_rht && !weight && contract == Contract::Rows;
    k.stochastic = r.nvfp4_stochastic_rounding && !is_forward_quantizer(q);
  }
  return k;
}

// NVFP4's stochastic rounding: the first element index of the random stream of quantizer q's
// rowwise or columnwise representation (numerics/quantize_nvfp4.h's Nvfp4Rounding), 2^48 apart.
constexpr uint64_t nvfp4_stream_first_index(int q, bool columnwise) {
  return static_cast<uint64_t>(2 * q + (columnwise ? 1 : 0)) << 48;
}

// NVFP4's stochastic rounding of quantizer q's representation: its stream, and where the call's
// [T, cols] tensor lies in the whole tensor's stream, so that a group draws the bits of the unsplit
// call: split by columns (act_out and dh, F/P of each of the A halves: the columns of the rowwise
// matrix, the rows of the transposed columnwise one) over a sharded plan's group or as the caller
// places it (rng.ffn_part of rng.ffn_parts); its tokens rows rng.first_token.. of rng.whole_tokens
// (the rows of the rowwise matrix, the columns of the transposed one). c: the shard's Config.
inline numerics::Nvfp4Rounding nvfp4_rounding(const Config& c, const QuantKind& k, int q, bool columnwise,
                                              const RngStream& rng) {
  numerics::Nvfp4Rounding r;
  r.stochastic = k.stochastic;
  r.seed = rng.seed;
  r.offset = rng.offset;
  r.first_index = nvfp4_stream_first_index(q, columnwise);
  const bool sharded = c.shard.size > 1;
  const int64_t parts = sharded ? c.shard.size : rng.ffn_parts, part = sharded ? c.shard.rank : rng.ffn_part;
  const bool split_f = parts > 1 && (q == kActOut || q == kDh);
  const int64_t local = c.ffn, whole = c.ffn * parts;
  const numerics::Nvfp4StreamMap features{local, whole, part * local}, tokens{0, 0, rng.first_token};
  if (k.nvfp4_transposed()) {
    r.cols = tokens;
    r.row_stride = rng.whole_tokens;  // 0: the matrix's columns, the call's tokens
    if (split_f) r.rows = features;
  } else {
    r.rows = tokens;
    if (split_f) {
      r.cols = features;
      r.row_stride = (q == kDh ? c.num_acts : 1) * whole;
    }
  }
  return r;
}

}  // namespace lnmlp
