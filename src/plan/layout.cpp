#include "layout.h"

#include <limits>

#include "common/error.h"
#include "fp8_recipe.h"
#include "numerics/quantize.h"

namespace lnmlp {

int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    fail(LNMLP_ERROR_SIZE_OVERFLOW, "the size of ", what, " (", a, " x ", b, ") overflows 64 bits");
  return r;
}

int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    fail(LNMLP_ERROR_SIZE_OVERFLOW, "the size of ", what, " (", a, " + ", b, ") overflows 64 bits");
  return r;
}

Region RegionAllocator::take(int64_t count, int64_t elem_bytes, const char* what) {
  Region r;
  r.offset = end_;
  r.bytes = checked_mul(count, elem_bytes, what);
  end_ = checked_add(end_, padded_region_bytes(r.bytes, what), what);
  return r;
}

const char* saved_section_name(int32_t section) {
  static constexpr const char* kNames[kSavedSections] = {"saved section LNMLP_SAVED_MEAN",
                                                         "saved section LNMLP_SAVED_RSTD",
                                                         "saved section LNMLP_SAVED_NORM_OUTPUT",
                                                         "saved section LNMLP_SAVED_FFN1",
                                                         "saved section LNMLP_SAVED_ACT_OUT",
                                                         "saved section LNMLP_SAVED_FP8_SCALES",
                                                         "saved section LNMLP_SAVED_NORM_OUTPUT_CODES",
                                                         "saved section LNMLP_SAVED_NORM_OUTPUT_SCALES",
                                                         "saved section LNMLP_SAVED_ACT_OUT_CODES",
                                                         "saved section LNMLP_SAVED_ACT_OUT_SCALES"};
  return section >= 0 && section < kSavedSections ? kNames[section] : "saved section";
}

int64_t padded_region_bytes(int64_t bytes, const char* what) {
  return checked_add(bytes, kRegionAlign - 1, what) / kRegionAlign * kRegionAlign;
}

namespace {

// How a blocked recipe saves a tensor's columnwise codes: quantized along T, with one scale per
// block of rows per column.
struct SavedCodes {
  int64_t block, scale_bytes, t_blocks;
  explicit SavedCodes(const ResolvedRecipe& r, int64_t T)
      : block(r.recipe == Recipe::Mxfp8 ? numerics::kMxfp8BlockLength : numerics::kBlockScalingLength),
        scale_bytes(r.recipe == Recipe::Mxfp8 ? 1 : 4),
        t_blocks(numerics::num_blocks(T, block)) {}
};

}  // namespace

SavedLayout make_saved_layout(const Config& cfg) {
  SavedLayout s;
  RegionAllocator alloc;
  const int64_t T = cfg.tokens, H = cfg.hidden, F = cfg.ffn, AF = cfg.act_width();
  const int64_t e = numerics::dtype_bytes(cfg.dtype);
  const bool saves_stats = cfg.remat != Remat::ForwardOnly;
  const bool all = cfg.remat == Remat::SaveAll;
  const ResolvedRecipe r = resolve_recipe(cfg.fp8);
  const bool q = r.recipe != Recipe::None;
  const SavedCodes sc(r, T);
  const int64_t block = sc.block, scale_bytes = sc.scale_bytes, t_blocks = sc.t_blocks;

  // The statistics are per local row (T/P under sequence parallelism); ln_out is saved gathered.
  s.mu = alloc.take_if(saves_stats && cfg.has_beta(), cfg.rows(), 4, "saved mean");
  s.rs = alloc.take_if(saves_stats, cfg.rows(), 4, "saved rstd");
  // ln_out in D: what an unquantized SAVE_ALL backward reads, and the norm output a plan gives.
  s.ln_out = alloc.take_if((all && !q) || cfg.norm_output, checked_mul(T, H, "saved ln_out"), e, "saved ln_out");
  s.h = alloc.take_if(cfg.remat == Remat::SaveAll || cfg.remat == Remat::SaveFfn1, checked_mul(T, AF, "saved ffn1"), e,
                      "saved ffn1");
  s.act = alloc.take_if(all && !q, checked_mul(T, F, "saved act_out"), e, "saved act_out");
  s.fwd_scales = alloc.take_if(saves_stats && r.per_tensor(), 4, 4, "saved FP8 scales");
  s.ln_q = alloc.take_if(all && q, checked_mul(T, H, "saved ln_out codes"), 1, "saved ln_out codes");
  s.ln_q_scale = alloc.take_if(all && r.blocked(), checked_mul(t_blocks, H, "saved ln_out scales"), scale_bytes,
                               "saved ln_out scales");
  s.act_q = alloc.take_if(all && q, checked_mul(T, F, "saved act_out codes"), 1, "saved act_out codes");
  s.act_q_scale = alloc.take_if(all && r.blocked(), checked_mul(t_blocks, F, "saved act_out scales"), scale_bytes,
                                "saved act_out scales");
  s.total_bytes = alloc.total();
  int32_t section = 0;
  for (Region* r : s.regions()) r->section = section++;
  int64_t per_token = 0;
  if (s.mu.present()) per_token += 4;
  if (s.rs.present()) per_token += 4;
  if (s.ln_out.present()) per_token += H * e;
  if (s.h.present()) per_token += AF * e;
  if (s.act.present()) per_token += F * e;
  if (s.ln_q.present()) per_token += H;
  if (s.act_q.present()) per_token += F;
  // Block scales per token: one per `block` tokens and column (rounded up to whole bytes).
  if (s.ln_q_scale.present()) per_token += ((H + F) * scale_bytes + block - 1) / block;
  s.bytes_per_token = per_token;
  return s;
}

DeferredLayout make_deferred_layout(const Config& cfg, const SavedLayout& saved) {
  DeferredLayout d;
  if (cfg.remat == Remat::ForwardOnly) return d;
  RegionAllocator alloc;
  const int64_t T = cfg.tokens, H = cfg.hidden, F = cfg.ffn, AF = cfg.act_width();
  const int64_t e = numerics::dtype_bytes(cfg.dtype);
  const ResolvedRecipe r = resolve_recipe(cfg.fp8);
  const bool q = r.recipe != Recipe::None;
  const SavedCodes sc(r, T);
  const auto tensor = [&](bool present, int64_t cols, const char* what) {
    return alloc.take_if(present, checked_mul(T, cols, what), e, what);
  };
  const auto codes = [&](bool present, int64_t cols, Region* scales, const char* what) {
    const Region c = alloc.take_if(present, checked_mul(T, cols, what), 1, what);
    *scales = alloc.take_if(present && r.blocked(), checked_mul(sc.t_blocks, cols, what), sc.scale_bytes, what);
    return c;
  };
  d.ln = tensor(!q && !saved.ln_out.present(), H, "deferred ln_out");
  d.act = tensor(!q && !saved.act.present(), F, "deferred act_out");
  d.dy = tensor(!q && cfg.sequence_parallel(), H, "deferred dy");
  d.dh = tensor(!q, AF, "deferred dffn1");
  d.scales = alloc.take_if(r.per_tensor(), kQuantizerCount, 4, "deferred FP8 scales");
  d.ln_q = codes(q && !saved.ln_q.present(), H, &d.ln_q_scale, "deferred ln_out codes");
  d.act_q = codes(q && !saved.act_q.present(), F, &d.act_q_scale, "deferred act_out codes");
  d.dy_q = codes(q, H, &d.dy_q_scale, "deferred dy codes");
  d.dh_q = codes(q, AF, &d.dh_q_scale, "deferred dffn1 codes");
  d.total_bytes = alloc.total();
  return d;
}

}  // namespace lnmlp
