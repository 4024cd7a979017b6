// Validation of a whole configuration at plan creation.
#include "common/error.h"
#include "config.h"
#include "layout.h"

namespace lnmlp {

void validate_config(const Config& cfg) {
  if (cfg.tokens == 0 || cfg.hidden == 0 || cfg.ffn == 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the shape is not set; call lnmlp_desc_set_shape(desc, tokens, hidden, ffn)");

  // Every tensor's element count and byte size must fit, with room for the workspace sums.
  const int64_t e = numerics::dtype_bytes(cfg.dtype);
  const int64_t af = checked_mul(cfg.num_acts, cfg.ffn, "A x ffn");
  checked_mul(checked_mul(cfg.tokens, cfg.hidden, "x [tokens, hidden]"), 4 * e, "x [tokens, hidden] in bytes");
  checked_mul(checked_mul(cfg.tokens, af, "ffn1 [tokens, A, ffn]"), 4 * e, "ffn1 [tokens, A, ffn] in bytes");
  checked_mul(checked_mul(cfg.hidden, af, "W1 [hidden, A, ffn]"), 4 * e, "W1 [hidden, A, ffn] in bytes");
  // GEMM libraries index with 32-bit dimensions.
  constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
  if (cfg.tokens > kMaxDim || cfg.hidden > kMaxDim || af > kMaxDim)
    fail(LNMLP_ERROR_SIZE_OVERFLOW, "tokens (", cfg.tokens, "), hidden (", cfg.hidden, ") and A x ffn (", af,
         ") must each be below 2^31");

  const bool clamped0 = cfg.acts[0] == Act::ClampedSilu || cfg.acts[0] == Act::ClampedLinear;
  const bool clamped1 = cfg.num_acts == 2 && (cfg.acts[1] == Act::ClampedSilu || cfg.acts[1] == Act::ClampedLinear);
  if (clamped0 || clamped1) {
    if (!(cfg.num_acts == 2 && cfg.acts[0] == Act::ClampedSilu && cfg.acts[1] == Act::ClampedLinear))
      fail(LNMLP_ERROR_INVALID_ARGUMENT,
           "clamped_silu and clamped_linear only come as the pair (clamped_silu, clamped_linear)");
  }

  if (cfg.param_grad_type() != cfg.dtype && cfg.param_grad_type() != DType::F32)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the weight gradients' dtype (", cfg.param_grad_dtype,
         ") must be LNMLP_DTYPE_F32 or the plan's dtype (", static_cast<int32_t>(cfg.dtype),
         "); see lnmlp_desc_set_weight_gradients");

  if (cfg.weight_type() != cfg.dtype) {
    if (cfg.weight_type() != DType::F32)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "the weights' dtype (", cfg.weight_dtype,
           ") must be LNMLP_DTYPE_F32 or the plan's dtype (", static_cast<int32_t>(cfg.dtype),
           "); see lnmlp_desc_set_weight_dtype");
    if (!cfg.quantized())
      fail(LNMLP_ERROR_NOT_SUPPORTED,
           "fp32 weights with a bf16 or f16 plan need an FP8 recipe (which quantizes them directly); without one the "
           "GEMMs multiply in the plan's dtype: convert W1 and W2 to it, or keep the default weight dtype (-1)");
  }

  if (cfg.fp8.recipe == Recipe::Nvfp4) {
    if (cfg.fp8.format == Fp8Mix::Hybrid)
      fail(LNMLP_ERROR_INVALID_ARGUMENT,
           "NVFP4 quantizes every tensor to E2M1 with E4M3 block scales; its FP8 format must be "
           "LNMLP_FP8_FORMAT_DEFAULT or _E4M3, not _HYBRID");
  }

  // CUDA: any ordinal >= 0 (the setter checks that); whether it exists is the module's check at
  // plan creation (LNMLP_ERROR_NOT_SUPPORTED naming the devices present).
  if (cfg.backend == BackendKind::Cpu && cfg.device != 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the CPU backend has one device, 0; got device ", cfg.device);
}

void validate_prepared_tokens(const Config& cfg) {
  for (int32_t i = 0; i < cfg.num_prepared; ++i)
    if (cfg.prepared_rows[i] > cfg.rows())
      fail(LNMLP_ERROR_INVALID_ARGUMENT, "a prepared token count (", cfg.prepared_rows[i],
           ", lnmlp_desc_set_prepared_tokens) is more than a call of this plan takes (", cfg.rows(),
           cfg.shard.sequence_parallel ? " rows per rank under sequence parallelism" : " tokens", ")");
}

}  // namespace lnmlp
