// Where things live inside the saved buffer (shared by every backend, since the buffer's content
// is part of the contract between forward and backward) and a helper to carve workspaces.
#pragma once

#include <array>
#include <cstdint>

#include "config.h"

namespace lnmlp {

// Offsets of sub-buffers are padded to this many bytes, whatever the base alignment.
constexpr int64_t kRegionAlign = 256;

struct Region {
  int64_t offset = -1;  // -1: absent
  int64_t bytes = 0;
  int32_t section = -1;  // a saved buffer's region: its LNMLP_SAVED_* index (a call may pass it apart)
  bool present() const { return offset >= 0; }
};

// The saved buffer's sections: lnmlp.h's LNMLP_SAVED_COUNT.
constexpr int kSavedSections = 10;

// The region r inside the buffer at base, typed; NULL when the region is absent.
template <typename T> T* at(const Region& r, void* base) {
  return r.present() ? reinterpret_cast<T*>(static_cast<char*>(base) + r.offset) : nullptr;
}

// Lays regions out one after another with overflow-checked arithmetic.
class RegionAllocator {
 public:
  Region take(int64_t count, int64_t elem_bytes, const char* what);
  Region take_if(bool cond, int64_t count, int64_t elem_bytes, const char* what) {
    return cond ? take(count, elem_bytes, what) : Region{};
  }
  int64_t total() const { return end_; }

 private:
  int64_t end_ = 0;
};

// The saved buffer: fp32 statistics, then tensors in the I/O dtype. Under an FP8 recipe the norm
// and activation outputs are saved as the FP8 codes backward's weight-gradient GEMMs read, with
// their scales (docs/fp8.md), instead of ln_out and act.
struct SavedLayout {
  Region mu;           // [T] fp32, layernorm only
  Region rs;           // [T] fp32, 1/sqrt(var+eps)
  Region ln_out;       // [T, H] norm output (GEMM1 input), in D: SAVE_ALL unquantized, or norm_output
  Region h;            // [T, A, F] GEMM1 output + b1 ("ffn1")
  Region act;          // [T, F] activation output (GEMM2 input)
  Region fwd_scales;   // FP8 per-tensor recipes: float[4], the scales forward used (ln_out, w1, act_out, w2)
  Region ln_q;         // FP8: [T, H] codes of ln_out, quantized along T for blocked recipes
  Region ln_q_scale;   // blocked: its scale_invs, [ceil(T/block), H] (fp32; E8M0 bytes for mxfp8)
  Region act_q;        // FP8: [T, F] codes of act_out, as ln_q
  Region act_q_scale;  // blocked: [ceil(T/block), F]
  int64_t total_bytes = 0;
  int64_t bytes_per_token = 0;  // without padding

  // Every region, present or not, in the order of the public LNMLP_SAVED_* sections.
  std::array<const Region*, kSavedSections> regions() const { return regions_of(*this); }
  std::array<Region*, kSavedSections> regions() { return regions_of(*this); }

 private:
  template <typename Layout> static auto regions_of(Layout& s) -> std::array<decltype(&s.mu), kSavedSections> {
    return std::array{&s.mu,         &s.rs,   &s.ln_out,     &s.h,     &s.act,
                      &s.fwd_scales, &s.ln_q, &s.ln_q_scale, &s.act_q, &s.act_q_scale};
  }
};

// The deferred buffer: what lnmlp_plan_backward_data keeps for lnmlp_plan_backward_weights, the
// operands of the weight-gradient GEMMs that the saved buffer lacks (the weights call reads both).
// Its regions are every backend's, as the saved buffer's: the tensors in D unquantized (dh rounded
// to D as its GEMMs read it), under an FP8 recipe the columnwise codes (and block scales) those
// GEMMs read, in the backend's layout of them, as the saved buffer's ln_q and act_q.
struct DeferredLayout {
  Region ln;           // [T, H] norm output: unquantized, when the saved buffer has no ln_out
  Region act;          // [T, F] activation output: unquantized, when the saved buffer has none
  Region dy;           // [T, H] all-gathered dy: unquantized under sequence parallelism (else the caller's dy)
  Region dh;           // [T, A, F] dffn1: unquantized
  Region scales;       // per-tensor FP8: float[kQuantizerCount], dy's and dh's scales at kDy and kDh
  Region ln_q;         // FP8: ln_out's codes, when the saved buffer has none
  Region ln_q_scale;   // blocked: their scales
  Region act_q;        // FP8: act_out's codes, when the saved buffer has none
  Region act_q_scale;  // blocked: their scales
  Region dy_q;         // FP8: [T, H] dy's codes
  Region dy_q_scale;   // blocked: their scales
  Region dh_q;         // FP8: [T, A*F] dh's codes
  Region dh_q_scale;   // blocked: their scales
  int64_t total_bytes = 0;
};

// The name of saved section i (LNMLP_SAVED_*), for messages.
const char* saved_section_name(int32_t section);

// The bytes a region of `bytes` bytes takes, with its padding to kRegionAlign.
int64_t padded_region_bytes(int64_t bytes, const char* what);

SavedLayout make_saved_layout(const Config& cfg);
// The deferred buffer of a plan (or a call: cfg.for_call) whose saved buffer is `saved`; empty for
// a plan that does not train.
DeferredLayout make_deferred_layout(const Config& cfg, const SavedLayout& saved);

// a*b, or an LNMLP_ERROR_SIZE_OVERFLOW naming `what`.
int64_t checked_mul(int64_t a, int64_t b, const char* what);
int64_t checked_add(int64_t a, int64_t b, const char* what);

}  // namespace lnmlp
