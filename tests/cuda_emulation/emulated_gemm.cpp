// lnmlp's cuBLASLt wrapper (src/cuda/gemm_cublaslt.h) for the CPU emulation: LtGemm computes its
// GEMM on the host from the same LtShape, with src/numerics' conversions, docs/fp8.md's contract
// (products of FP8 values accumulated in fp32, each 128-block of K scaled by its two scale_invs,
// or the whole K by the per-tensor ones), the block scales read where numerics/quantize.h's
// gemm_*_scale_index put them, the bias, the result in its type (added to C's values with beta 1). It checks what
// cuBLASLt would refuse that lnmlp relies on (FP8 operands K-major, a bias pointer with a bias epilogue).
// LNMLP_EMULATION_NO_BLOCK_SCALING, LNMLP_EMULATION_NO_FUSED_OUTPUT and
// LNMLP_EMULATION_NO_BIAS_EPILOGUE make it refuse block scaling, FP8 results in bf16/f16, or any
// bias epilogue, as a GPU or cuBLASLt without them does, so the backend's fallbacks run too;
// LNMLP_EMULATION_NO_FUSED_OUTPUT_BELOW_M=N refuses any result but fp32 without a bias for GEMMs
// of fewer than N rows only (a token count that would need more staging than the plan's).
// A TF32 shape (lnmlp_desc_set_gemm_math) reads its fp32 inputs as the TF32 tensor cores do, with
// 10 mantissa bits; fast FP8 accumulation has no model here (its precision is the hardware's), so
// it computes exactly.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "cuda/gemm_cublaslt.h"
#include "numerics/dtype.h"
#include "numerics/fp8.h"
#include "numerics/quantize.h"

namespace lnmlp::cuda {
namespace {

using numerics::DType;
using numerics::Fp8Format;

float value(LtType t, const void* p, int64_t i) {
  switch (t) {
    case LtType::F32: return static_cast<const float*>(p)[i];
    case LtType::BF16: return numerics::load<DType::BF16>(static_cast<const uint16_t*>(p)[i]);
    case LtType::F16: return numerics::load<DType::F16>(static_cast<const uint16_t*>(p)[i]);
    case LtType::E4M3: return numerics::fp8_to_float<Fp8Format::E4M3>(static_cast<const uint8_t*>(p)[i]);
    case LtType::E5M2: return numerics::fp8_to_float<Fp8Format::E5M2>(static_cast<const uint8_t*>(p)[i]);
  }
  return 0.0f;
}

void put(LtType t, void* p, int64_t i, float v) {
  switch (t) {
    case LtType::F32: static_cast<float*>(p)[i] = v; return;
    case LtType::BF16: static_cast<uint16_t*>(p)[i] = numerics::store<DType::BF16>(v); return;
    case LtType::F16: static_cast<uint16_t*>(p)[i] = numerics::store<DType::F16>(v); return;
    case LtType::E4M3:
    case LtType::E5M2: break;
  }
  fail(LNMLP_ERROR_INTERNAL, "an FP8 GEMM result");
}

// x as a TF32 tensor core reads it: 10 mantissa bits, rounded to nearest with ties away from zero
// (PTX's cvt.rna.tf32.f32).
float tf32(float x) {
  if (!std::isfinite(x)) return x;
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

// The scale_inv of element (o, k) of a side stored K-major as [outer, K].
float scale_of(LtScale s, const float* scales, int64_t o, int64_t k, int64_t outer, int64_t K) {
  if (s == LtScale::Tensor) return scales[0];
  if (s == LtScale::Vec128) return scales[numerics::gemm_vec128_scale_index(o, k, outer)];
  return scales[numerics::gemm_blk128_scale_index(o, k, K)];
}

bool refuse(const char* variable) { return std::getenv(variable) != nullptr; }

}  // namespace

bool cublaslt_has_block_scaling() { return !refuse("LNMLP_EMULATION_NO_BLOCK_SCALING"); }

const char* cublaslt_description() { return "cuBLASLt (CPU emulation)"; }

LtGemm::LtGemm(cublasLtHandle_t handle, const LtShape& s, int64_t, const char* name)
    : handle_(handle), shape_(s), name_(name) {
  cuda_emulation::note_gemm_made();
  if ((s.scale_a != LtScale::Tensor || s.scale_b != LtScale::Tensor) && !cublaslt_has_block_scaling())
    fail(LNMLP_ERROR_NOT_SUPPORTED, "no block-scaled FP8 GEMM for ", name, " (LNMLP_EMULATION_NO_BLOCK_SCALING)");
  if (is_fp8(s.a) && s.c != LtType::F32 && refuse("LNMLP_EMULATION_NO_FUSED_OUTPUT"))
    fail(LNMLP_ERROR_NOT_SUPPORTED, "no FP8 GEMM with a ", lt_type_name(s.c), " result for ", name,
         " (LNMLP_EMULATION_NO_FUSED_OUTPUT)");
  const char* below = std::getenv("LNMLP_EMULATION_NO_FUSED_OUTPUT_BELOW_M");
  if (below != nullptr && s.m < std::atoll(below) && (s.c != LtType::F32 || s.bias))
    fail(LNMLP_ERROR_NOT_SUPPORTED, "no ", lt_type_name(s.c), " result", s.bias ? " with a bias" : "", " for ", name,
         " at ", s.m, " rows (LNMLP_EMULATION_NO_FUSED_OUTPUT_BELOW_M)");
  if (s.bias && refuse("LNMLP_EMULATION_NO_BIAS_EPILOGUE"))
    fail(LNMLP_ERROR_NOT_SUPPORTED, "no bias epilogue with a ", lt_type_name(s.c), " result for ", name,
         " (LNMLP_EMULATION_NO_BIAS_EPILOGUE)");
  if ((is_fp8(s.a) || is_fp8(s.b)) && (s.trans_a || !s.trans_b))
    fail(LNMLP_ERROR_NOT_SUPPORTED, "FP8 GEMMs take K-major operands only (", name, ")");
  workspace_bytes_ = 0;
}

LtGemm::~LtGemm() { destroy(); }

void LtGemm::destroy() noexcept {}

void LtGemm::run(const void* a, const void* b, const void* bias, void* c, void*, cudaStream_t, const float* a_scale_inv,
                 const float* b_scale_inv) {
  const LtShape& s = shape_;
  if (s.bias && bias == nullptr) fail(LNMLP_ERROR_INTERNAL, "the ", name_, " GEMM's bias epilogue has no bias");
  if ((is_fp8(s.a) && a_scale_inv == nullptr) || (is_fp8(s.b) && b_scale_inv == nullptr))
    fail(LNMLP_ERROR_INTERNAL, "the ", name_, " GEMM's FP8 operands have no scale_inv");
  const bool blocks = s.scale_a != LtScale::Tensor || s.scale_b != LtScale::Tensor;
  const int64_t kb = blocks ? numerics::kBlockScalingLength : std::max<int64_t>(s.k, 1);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t j = 0; j < s.n; ++j) {
      float acc = 0.0f;
      for (int64_t k0 = 0; k0 < s.k; k0 += kb) {
        float part = 0.0f;
        for (int64_t k = k0; k < std::min(s.k, k0 + kb); ++k) {
          float va = value(s.a, a, s.trans_a ? k * s.m + i : i * s.k + k);
          float vb = value(s.b, b, s.trans_b ? j * s.k + k : k * s.n + j);
          if (s.tf32) va = tf32(va), vb = tf32(vb);
          part += va * vb;
        }
        const float sa = is_fp8(s.a) ? scale_of(s.scale_a, a_scale_inv, i, k0, s.m, s.k) : 1.0f;
        const float sb = is_fp8(s.b) ? scale_of(s.scale_b, b_scale_inv, j, k0, s.n, s.k) : 1.0f;
        acc += part * sa * sb;
      }
      if (s.bias) acc += value(s.c, bias, j);
      if (s.accumulate) acc += value(s.c, c, i * s.n + j);  // beta 1
      put(s.c, c, i * s.n + j, acc);
    }
}

}  // namespace lnmlp::cuda
