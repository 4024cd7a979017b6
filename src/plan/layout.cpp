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

int64_t padded_region_bytes(int64_t bytes, const char* what) {
  return checked_add(bytes, kRegionAlign - 1, what) / kRegionAlign * kRegionAlign;
}

SavedLayout make_saved_layout(const Config& cfg) {
  SavedLayout s;
  RegionAllocator alloc;
  const int64_t T = cfg.tokens, H = cfg.hidden, F = cfg.ffn, AF = cfg.act_width();
  const int64_t e = numerics::dtype_bytes(cfg.dtype);
  const bool saves_stats = cfg.remat != Remat::ForwardOnly;
  const bool all = cfg.remat == Remat::SaveAll;
  const ResolvedRecipe r = resolve_recipe(cfg.fp8);
  const bool q = r.recipe != Recipe::None;
  // Blocked recipes save the codes quantized along T, with one scale per block of rows per column.
  const int64_t block = r.recipe == Recipe::Mxfp8 ? numerics::kMxfp8BlockLength : numerics::kBlockScalingLength;
  const int64_t scale_bytes = r.recipe == Recipe::Mxfp8 ? 1 : 4;
  const int64_t t_blocks = numerics::num_blocks(T, block);

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

}  // namespace lnmlp
