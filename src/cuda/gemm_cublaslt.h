// The CUDA backend's GEMMs through cuBLASLt: one object per GEMM of the block, whose matmul
// descriptor, matrix layouts and heuristic-chosen algorithm are made once (at plan creation) and
// reused by every run. Row-major, like src/cpu/gemm.h:
//
//   C[m, n] = op(A) @ op(B) (+ bias[n]),  fp32 accumulation (CUBLAS_COMPUTE_32F, no TF32)
//   op(A) is [m, k]: A is stored [m, k], or [k, m] when trans_a.
//   op(B) is [k, n]: B is stored [k, n], or [n, k] when trans_b.
//
// cuBLASLt is column-major; a row-major C is the column-major C^T = op(B)^T op(A)^T, so each GEMM
// runs with its operands swapped (B first) and the bias, a row of the column-major result, goes to
// the BIAS epilogue.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "numerics/dtype.h"

namespace lnmlp::cuda {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  numerics::DType input = numerics::DType::F32;  // A, B and the bias
  bool output_f32 = false;                       // C in fp32, else in the input type
  bool bias = false;
};

// The six GEMMs of the block for one I/O dtype D (the same shapes as src/cpu/block_gemms.h; on
// the GPU every dtype runs natively, f16 included). The forward GEMMs add their bias in the
// epilogue; dact and dn come out in fp32, the weight gradients in D.
struct BlockGemmShapes {
  GemmShape gemm1;  // h[T, A*F]  = ln[T, H] @ W1[H, A*F] (+ b1)
  GemmShape gemm2;  // y[T, H]    = act[T, F] @ W2[F, H] (+ b2)
  GemmShape dact;   // dact[T, F] = dy[T, H] @ W2^T        (fp32)
  GemmShape dw2;    // dW2[F, H]  = act^T @ dy
  GemmShape dn;     // dn[T, H]   = dh[T, A*F] @ W1^T      (fp32)
  GemmShape dw1;    // dW1[H, A*F] = ln^T @ dh
};

BlockGemmShapes block_gemm_shapes(int64_t T, int64_t H, int64_t F, int64_t A, numerics::DType d, bool has_bias1,
                                  bool has_bias2);

// The alignment cuBLASLt may assume of every pointer it is given (the heuristic is asked for
// algorithms valid at this alignment; the backend checks the caller's pointers against it).
constexpr int64_t kGemmPointerAlignment = 16;

class LtGemm {
 public:
  // Chooses the algorithm (the heuristic's first) for at most max_workspace bytes of cuBLASLt
  // workspace; throws LNMLP_ERROR_NOT_SUPPORTED naming `name` if cuBLASLt has none.
  LtGemm(cublasLtHandle_t handle, const GemmShape& shape, int64_t max_workspace, const char* name);
  ~LtGemm();
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // Workspace bytes the chosen algorithm needs.
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // Enqueues the GEMM on stream. bias: NULL unless the shape has one.
  void run(const void* a, const void* b, const void* bias, void* c, void* workspace, cudaStream_t stream);

 private:
  void destroy() noexcept;

  cublasLtHandle_t handle_;
  GemmShape shape_;
  const char* name_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_a_ = nullptr, layout_b_ = nullptr, layout_c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  int64_t workspace_bytes_ = 0;
};

// Name and version of cuBLASLt, for the build info.
const char* cublaslt_description();

}  // namespace lnmlp::cuda
