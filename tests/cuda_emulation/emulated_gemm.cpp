// lnmlp's cuBLASLt wrapper (src/cuda/gemm_cublaslt.h) for the CPU emulation: LtGemm computes its
// GEMM on the host from the same LtShape, with src/numerics' conversions, docs/fp8.md's contract
// (products of FP8 values accumulated in fp32, each 128-block of K scaled by its two scale_invs,
// or the whole K by the per-tensor ones; NVFP4's E2M1 codes, each 16-block of K scaled by its two
// E4M3 scales), the block scales read where numerics/quantize.h's gemm_*_scale_index and
// quantize_nvfp4.h's nvfp4_gemm_scale_index put them, the bias, the result in its type (added to
// C's values with beta 1). It checks what cuBLASLt would refuse that lnmlp relies on (FP8 and FP4
// operands K-major, FP4 only on a GPU of sm_100 or newer (LNMLP_EMULATION_SM), a bias pointer with
// a bias epilogue).
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
#include "numerics/fp4.h"
#include "numerics/fp8.h"
#include "numerics/quantize.h"
#include "numerics/quantize_nvfp4.h"

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
    case LtType::E2M1: return numerics::e2m1_to_float(numerics::unpack_e2m1(static_cast<const uint8_t*>(p), i));
  }
  return 0.0f;
}

void put(LtType t, void* p, int64_t i, float v) {
  switch (t) {
    case LtType::F32: static_cast<float*>(p)[i] = v; return;
    case LtType::BF16: static_cast<uint16_t*>(p)[i] = numerics::store<DType::BF16>(v); return;
    case LtType::F16: static_cast<uint16_t*>(p)[i] = numerics::store<DType::F16>(v); return;
    case LtType::E4M3:
    case LtType::E5M2:
    case LtType::E2M1: break;
  }
  fail(LNMLP_ERROR_INTERNAL, "an FP8 or FP4 GEMM result");
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

// The scale_inv (FP4: the E4M3 block scale) of element (o, k) of a side stored K-major as [outer, K].
float scale_of(LtScale s, const void* scales, int64_t o, int64_t k, int64_t outer, int64_t K) {
  const auto* f = static_cast<const float*>(scales);
  switch (s) {
    case LtScale::Tensor: return f[0];
    case LtScale::Vec128: return f[numerics::gemm_vec128_scale_index(o, k, outer)];
    case LtScale::Blk128: return f[numerics::gemm_blk128_scale_index(o, k, K)];
    case LtScale::Vec16: {
      const uint8_t e4m3 =
          static_cast<const uint8_t*>(scales)[numerics::nvfp4_gemm_scale_index(o, k / numerics::kNvfp4BlockLength, K)];
      return numerics::fp8_to_float<Fp8Format::E4M3>(e4m3);
    }
  }
  return 0.0f;
}

// The compute capability the emulated device reports (runtime.cpp's, LNMLP_EMULATION_SM).
int emulated_sm() {
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  return p.major * 10 + p.minor;
}

bool refuse(const char* variable) { return std::getenv(variable) != nullptr; }

}  // namespace

bool cublaslt_has_block_scaling() { return !refuse("LNMLP_EMULATION_NO_BLOCK_SCALING"); }

bool cublaslt_has_fp4() { return true; }

const char* cublaslt_description() { return "cuBLASLt (CPU emulation)"; }

LtGemm::LtGemm(cublasLtHandle_t handle, const LtShape& s, int64_t, const char* name)
    : handle_(handle), shape_(s), name_(name) {
  cuda_emulation::note_gemm_made();
  const bool fp4 = s.a == LtType::E2M1 || s.b == LtType::E2M1;
  if (fp4 && emulated_sm() < 100)
    fail(LNMLP_ERROR_NOT_SUPPORTED, "cuBLASLt has no algorithm for the ", name,
         " GEMM: FP4 GEMMs need FP4 tensor cores (sm_100 or newer); this GPU is sm_", emulated_sm());
  if (fp4 && (s.a != s.b || s.scale_a != LtScale::Vec16 || s.scale_b != LtScale::Vec16 || s.k % 2 != 0))
    fail(LNMLP_ERROR_NOT_SUPPORTED, "FP4 GEMMs take two FP4 sides with VEC16_UE4M3 scales and an even K (", name, ")");
  if (!fp4 && (s.scale_a != LtScale::Tensor || s.scale_b != LtScale::Tensor) && !cublaslt_has_block_scaling())
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
  if ((is_scaled(s.a) || is_scaled(s.b)) && (s.trans_a || !s.trans_b))
    fail(LNMLP_ERROR_NOT_SUPPORTED, "FP8 and FP4 GEMMs take K-major operands only (", name, ")");
  workspace_bytes_ = 0;
}

LtGemm::~LtGemm() { destroy(); }

void LtGemm::destroy() noexcept {}

void LtGemm::run(const void* a, const void* b, const void* bias, void* c, void*, cudaStream_t, const void* a_scales,
                 const void* b_scales) {
  const LtShape& s = shape_;
  if (s.bias && bias == nullptr) fail(LNMLP_ERROR_INTERNAL, "the ", name_, " GEMM's bias epilogue has no bias");
  if ((is_scaled(s.a) && a_scales == nullptr) || (is_scaled(s.b) && b_scales == nullptr))
    fail(LNMLP_ERROR_INTERNAL, "the ", name_, " GEMM's FP8 or FP4 operands have no scales");
  const bool blocks = s.scale_a != LtScale::Tensor || s.scale_b != LtScale::Tensor;
  const int64_t kb = s.scale_a == LtScale::Vec16 ? numerics::kNvfp4BlockLength
                     : blocks                    ? numerics::kBlockScalingLength
                                                 : std::max<int64_t>(s.k, 1);
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
        const float sa = is_scaled(s.a) ? scale_of(s.scale_a, a_scales, i, k0, s.m, s.k) : 1.0f;
        const float sb = is_scaled(s.b) ? scale_of(s.scale_b, b_scales, j, k0, s.n, s.k) : 1.0f;
        acc += part * sa * sb;
      }
      if (s.bias) acc += value(s.c, bias, j);
      if (s.accumulate) acc += value(s.c, c, i * s.n + j);  // beta 1
      put(s.c, c, i * s.n + j, acc);
    }
}

}  // namespace lnmlp::cuda
