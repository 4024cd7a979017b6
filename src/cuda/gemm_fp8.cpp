#include "gemm_fp8.h"

#include "common/error.h"
#include "check.h"
#include "gemm_cublaslt.h"

namespace lnmlp::cuda {
namespace {

cudaDataType_t fp8_type(numerics::Fp8Format f) {
  return f == numerics::Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* v, size_t n, const char* what) {
  cublas_check(cublasLtMatmulDescSetAttribute(d, a, v, n), what);
}

}  // namespace

LtFp8Gemm::LtFp8Gemm(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, numerics::Fp8Format x_format,
                     numerics::Fp8Format y_format, int64_t max_workspace, const char* name)
    : handle_(handle), name_(name) {
  try {
    // Column-major view: C^T [n, m] = Y [n, k] @ X^T [k, m]. cuBLAS's A is Y, stored [k, n]
    // (k contiguous) and transposed; cuBLAS's B is X, stored [k, m], not transposed.
    cublas_check(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    set_attr(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t, "cublasLtMatmulDescSetAttribute(TRANSA)");
    set_attr(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt, "cublasLtMatmulDescSetAttribute(TRANSB)");
    const int8_t fast_accum = 0;  // exact fp32 accumulation, as the CPU backend's contract
    set_attr(desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum,
             "cublasLtMatmulDescSetAttribute(FAST_ACCUM)");
    auto layout = [](cudaDataType_t type, int64_t rows, int64_t cols, const char* what) {
      cublasLtMatrixLayout_t l = nullptr;
      cublas_check(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), rows),
                   what);
      return l;
    };
    layout_y_ = layout(fp8_type(y_format), k, n, "cublasLtMatrixLayoutCreate(FP8 A)");
    layout_x_ = layout(fp8_type(x_format), k, m, "cublasLtMatrixLayoutCreate(FP8 B)");
    layout_c_ = layout(CUDA_R_32F, n, m, "cublasLtMatrixLayoutCreate(FP8 C)");

    cublasLtMatmulPreference_t pref = nullptr;
    cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = static_cast<uint64_t>(max_workspace);
    cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(handle_, desc_, layout_y_, layout_x_, layout_c_, layout_c_, pref, 1, &result,
                                          &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) cublas_check(st, "cublasLtMatmulAlgoGetHeuristic");
    if (found < 1)
      fail(LNMLP_ERROR_NOT_SUPPORTED, "cuBLASLt has no FP8 algorithm for the ", name, " GEMM (m ", m, ", n ", n, ", k ",
           k, ", ", numerics::fp8_name(x_format), " x ", numerics::fp8_name(y_format),
           ") on this GPU; FP8 GEMMs need a GPU with FP8 tensor cores (sm_89 or newer)");
    algo_ = result.algo;
    workspace_bytes_ = static_cast<int64_t>(result.workspaceSize);
  } catch (...) {
    destroy();
    throw;
  }
}

LtFp8Gemm::~LtFp8Gemm() { destroy(); }

void LtFp8Gemm::destroy() noexcept {
  if (layout_c_) cublasLtMatrixLayoutDestroy(layout_c_);
  if (layout_x_) cublasLtMatrixLayoutDestroy(layout_x_);
  if (layout_y_) cublasLtMatrixLayoutDestroy(layout_y_);
  if (desc_) cublasLtMatmulDescDestroy(desc_);
  layout_x_ = layout_y_ = layout_c_ = nullptr;
  desc_ = nullptr;
}

void LtFp8Gemm::run(const uint8_t* x, const float* x_scale_inv, const uint8_t* y, const float* y_scale_inv, float* c,
                    void* workspace, cudaStream_t stream) {
  // cuBLAS's A is y, its B is x.
  set_attr(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &y_scale_inv, sizeof y_scale_inv,
           "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
  set_attr(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale_inv, sizeof x_scale_inv,
           "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  const float one = 1.0f, zero = 0.0f;
  const cublasStatus_t st = cublasLtMatmul(handle_, desc_, &one, y, layout_y_, x, layout_x_, &zero, c, layout_c_, c,
                                           layout_c_, &algo_, workspace, static_cast<size_t>(workspace_bytes_), stream);
  if (st != CUBLAS_STATUS_SUCCESS)
    fail(LNMLP_ERROR_BACKEND, "cublasLtMatmul (", name_, " FP8 GEMM) failed: ", cublasLtGetStatusName(st), " (",
         cublasLtGetStatusString(st), ")");
}

}  // namespace lnmlp::cuda
