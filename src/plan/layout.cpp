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

// How forward saves a tensor [T, cols] (and the deferred buffer keeps one) for its weight-gradient
// GEMM: the codes and block scales of its columnwise representation, quantized along T
// (fp8_recipe.h's QuantKind: one code byte per element, NVFP4's packed and transposed).
struct SavedCodes {
  QuantKind kind;
  int64_t T;
  SavedCodes(const ResolvedRecipe& r, int q, int64_t tokens) : kind(quant_kind(r, q, Contract::Rows)), T(tokens) {}
  // (T * cols fits: validate_config checked it, four times over.)
  Region codes(RegionAllocator& a, bool present, int64_t cols, const char* what) const {
    return a.take_if(present, kind.code_bytes(T, cols), 1, what);
  }
  // Blocked recipes have the section whatever the tokens (0 bytes at none); per-tensor ones none.
  Region scales(RegionAllocator& a, bool present, int64_t cols, const char* what) const {
    return a.take_if(present && !kind.per_tensor(), kind.scale_region_bytes(T, cols), 1, what);
  }
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
  const SavedCodes ln(r, kLnOut, T), act(r, kActOut, T);

  // The statistics are per local row (T/P under sequence parallelism); ln_out is saved gathered.
  s.mu = alloc.take_if(saves_stats && cfg.has_beta(), cfg.rows(), 4, "saved mean");
  s.rs = alloc.take_if(saves_stats, cfg.rows(), 4, "saved rstd");
  // ln_out in D: what an unquantized SAVE_ALL backward reads, and the norm output a plan gives.
  s.ln_out = alloc.take_if((all && !q) || cfg.norm_output, checked_mul(T, H, "saved ln_out"), e, "saved ln_out");
  s.h = alloc.take_if(cfg.remat == Remat::SaveAll || cfg.remat == Remat::SaveFfn1, checked_mul(T, AF, "saved ffn1"), e,
                      "saved ffn1");
  s.act = alloc.take_if(all && !q, checked_mul(T, F, "saved act_out"), e, "saved act_out");
  s.fwd_scales = alloc.take_if(saves_stats && r.per_tensor(), 4, 4, "saved FP8 scales");
  s.ln_q = ln.codes(alloc, all && q, H, "saved ln_out codes");
  s.ln_q_scale = ln.scales(alloc, all && q, H, "saved ln_out scales");
  s.act_q = act.codes(alloc, all && q, F, "saved act_out codes");
  s.act_q_scale = act.scales(alloc, all && q, F, "saved act_out scales");
  s.total_bytes = alloc.total();
  int32_t section = 0;
  for (Region* r : s.regions()) r->section = section++;
  int64_t per_token = 0;
  if (s.mu.present()) per_token += 4;
  if (s.rs.present()) per_token += 4;
  if (s.ln_out.present()) per_token += H * e;
  if (s.h.present()) per_token += AF * e;
  if (s.act.present()) per_token += F * e;
  // Codes and block scales per token (rounded up to whole bytes): one code byte per element
  // (NVFP4: half), and one scale of scale_bytes per `block` tokens and column.
  if (s.ln_q.present()) {
    const QuantKind& k = ln.kind;
    const int64_t cols = H + F;
    per_token += k.nvfp4() ? (cols + 1) / 2 : cols;
    if (s.ln_q_scale.present()) per_token += (cols * k.scale_bytes() + k.block() - 1) / k.block();
  }
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
  const auto tensor = [&](bool present, int64_t cols, const char* what) {
    return alloc.take_if(present, checked_mul(T, cols, what), e, what);
  };
  const auto codes = [&](int quantizer, bool present, int64_t cols, Region* scales, const char* what) {
    const SavedCodes sc(r, quantizer, T);
    const Region c = sc.codes(alloc, present, cols, what);
    *scales = sc.scales(alloc, present, cols, what);
    return c;
  };
  d.ln = tensor(!q && !saved.ln_out.present(), H, "deferred ln_out");
  d.act = tensor(!q && !saved.act.present(), F, "deferred act_out");
  d.dy = tensor(!q && cfg.sequence_parallel(), H, "deferred dy");
  d.dh = tensor(!q, AF, "deferred dffn1");
  d.scales = alloc.take_if(r.per_tensor(), kQuantizerCount, 4, "deferred FP8 scales");
  d.ln_q = codes(kLnOut, q && !saved.ln_q.present(), H, &d.ln_q_scale, "deferred ln_out codes");
  d.act_q = codes(kActOut, q && !saved.act_q.present(), F, &d.act_q_scale, "deferred act_out codes");
  d.dy_q = codes(kDy, q, H, &d.dy_q_scale, "deferred dy codes");
  d.dh_q = codes(kDh, q, AF, &d.dh_q_scale, "deferred dffn1 codes");
  d.total_bytes = alloc.total();
  return d;
}

}  // namespace lnmlp
