// The CUDA backend's GEMMs through cuBLASLt: one object per GEMM of the block, whose matmul
// descriptor, matrix layouts and heuristic-chosen algorithm are made once (at plan creation) and
// reused by every run. Row-major, as block/gemm_roles.h:
//
//   C[m, n] = op(A) @ op(B) * sa * sb (+ bias[n]),  fp32 accumulation (CUBLAS_COMPUTE_32F; TF32
//   only where the shape asks, lnmlp_desc_set_gemm_math)
//   op(A) is [m, k]: A stored [m, k], or [k, m] when trans_a.
//   op(B) is [k, n]: B stored [k, n], or [n, k] when trans_b.
//
// A and B are bf16, f16 or fp32 (plain operands, or FP8 codes decoded with their block scales),
// or FP8 codes (E4M3 / E5M2) with scale_invs sa, sb that cuBLASLt reads from device memory (so the
// scales never travel through the host): one per tensor, or (CUDA 12.9, sm_90) one per 1 x 128
// block along K or per 128 x 128 tile, in the layouts of numerics/quantize.h's
// gemm_vec128_scale_index / gemm_blk128_scale_index; or (CUDA 12.8, sm_100) NVFP4's E2M1 codes
// packed two to a byte with their E4M3 scales per 1 x 16 block along K, in the tiled layout of
// numerics/quantize_nvfp4.h's nvfp4_gemm_scale_index (sa, sb then point to those bytes). Hopper's
// FP8 kernels and Blackwell's FP4 ones take only K-major operands: these GEMMs are created with
// trans_a false and trans_b true (A [m, k], B [n, k]), which is why the quantizers also write
// transposed codes. FP8 accumulates in fp32 without the fast accumulation mode, unless the shape
// asks for it (fast_accumulation).
//
// cuBLASLt is column-major; a row-major C is the column-major C^T = op(B)^T op(A)^T, so each GEMM
// runs with its operands swapped (B first) and the bias, a row of the column-major result, goes to
// the BIAS epilogue.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "gemm_algorithms.h"

namespace lnmlp::cuda {

enum class LtType : int32_t { F32, BF16, F16, E4M3, E5M2, E2M1 };

// How an FP8 side's scale_invs apply: one per tensor, per 1 x 128 block along K, per 128 x 128 tile;
// an FP4 side's E4M3 scales: per 1 x 16 block along K (Vec16).
enum class LtScale : int32_t { Tensor, Vec128, Blk128, Vec16 };

struct LtShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  LtType a = LtType::F32, b = LtType::F32;  // FP8 and FP4 sides come with scales
  LtType c = LtType::F32;                   // F32, BF16 or F16
  bool bias = false;                        // the BIAS epilogue, a bias[n] of type c
  LtScale scale_a = LtScale::Tensor, scale_b = LtScale::Tensor;  // FP8 and FP4 sides only
  bool accumulate = false;  // C += the product (beta 1; the scale_invs apply to the product only)
  bool fast_accumulation = false;  // FP8 sides: the tensor cores' own accumulation, no promotion
  bool tf32 = false;               // fp32 sides: TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32)
};

// The alignment cuBLASLt may assume of every pointer it is given (the heuristic is asked for
// algorithms valid at this alignment; the backend checks the caller's pointers against it).
constexpr int64_t kGemmPointerAlignment = 16;

// cuBLASLt's FP8 GEMMs need every dimension a multiple of this.
constexpr int64_t kFp8GemmDimMultiple = 16;

class LtGemm {
 public:
  // Asks the heuristic for kGemmAlgorithmCandidates algorithms within max_workspace bytes of
  // cuBLASLt workspace, and keeps those it offers (the best in use, the others as fallbacks);
  // throws LNMLP_ERROR_NOT_SUPPORTED naming `name`, its shape and the cause
  // (gemm_refusal_reason) if it offers none (for example an FP8 GEMM on a GPU without FP8 tensor
  // cores, or block scaling off Hopper or before cuBLASLt 12.9).
  LtGemm(cublasLtHandle_t handle, const LtShape& shape, int64_t max_workspace, const char* name);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Workspace bytes every kept algorithm fits in.
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // Enqueues the GEMM on stream (with the algorithm in use; should cuBLASLt refuse it, with the
  // next kept one that it accepts). bias: NULL unless the shape has one. a_scales, b_scales: for
  // FP8 sides, their scale_invs in device memory (one float, or the fp32 block scales); for FP4
  // sides their E4M3 block scales; else NULL. workspace: workspace_bytes() bytes, 256-byte aligned.
  void run(const void* a, const void* b, const void* bias, void* c, void* workspace, cudaStream_t stream,
           const void* a_scales = nullptr, const void* b_scales = nullptr);

 private:
  void destroy() noexcept;

  cublasLtHandle_t handle_;
  LtShape shape_;
  const char* name_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_a_ = nullptr, layout_b_ = nullptr, layout_c_ = nullptr;
  GemmAlgorithms<cublasLtMatmulAlgo_t> algorithms_;
  int64_t workspace_bytes_ = 0;
};

inline bool is_fp8(LtType t) { return t == LtType::E4M3 || t == LtType::E5M2; }
// Sides that come with scales: FP8 and FP4 codes.
inline bool is_scaled(LtType t) { return is_fp8(t) || t == LtType::E2M1; }
constexpr const char* lt_type_name(LtType t) {
  return t == LtType::BF16   ? "bf16"
         : t == LtType::F16  ? "f16"
         : t == LtType::E4M3 ? "e4m3"
         : t == LtType::E5M2 ? "e5m2"
         : t == LtType::E2M1 ? "e2m1"
                             : "f32";
}

// Why cuBLASLt offers no algorithm for a GEMM of shape s on a GPU of compute capability sm
// (major * 10 + minor): the cause where the GPU or the library decides it, else where to look.
std::string gemm_refusal_reason(const LtShape& s, int sm, bool library_has_block_scaling, bool library_has_fp4);

// Whether this build and the loaded cuBLASLt have the block-scaled FP8 GEMMs (12.9 and newer).
bool cublaslt_has_block_scaling();
// Whether this build and the loaded cuBLASLt have the FP4 GEMMs (E2M1 with VEC16_UE4M3 scales,
// 12.8 and newer).
bool cublaslt_has_fp4();

// Name and version of cuBLASLt, for the build info.
const char* cublaslt_description();

}  // namespace lnmlp::cuda
