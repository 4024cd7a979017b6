// FP8 GEMMs through cuBLASLt (Hopper's FP8 tensor cores), for the per-tensor recipes:
//
//   C[m, n] = sa * sb * (X[m, k] @ Y[n, k]^T),  fp32 accumulation, fp32 C
//
// Both operands are K-major (K contiguous: cuBLASLt's FP8 kernels on Hopper take only the "TN"
// layout), which is why the FP8 quantizers also write transposed codes. sa and sb are the
// operands' per-tensor scale_invs, read by cuBLASLt from device memory (A/B scale pointers), so
// the scales never travel through the host. Descriptor, layouts and the heuristic's algorithm are
// made once at plan creation.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "numerics/fp8.h"

namespace lnmlp::cuda {

// cuBLASLt's FP8 GEMMs need every dimension a multiple of this.
constexpr int64_t kFp8GemmDimMultiple = 16;

class LtFp8Gemm {
 public:
  // Throws LNMLP_ERROR_NOT_SUPPORTED naming `name` if cuBLASLt has no algorithm (for example on a
  // GPU without FP8 tensor cores, or E5M2 x E5M2).
  LtFp8Gemm(cublasLtHandle_t handle, int64_t m, int64_t n, int64_t k, numerics::Fp8Format x_format,
            numerics::Fp8Format y_format, int64_t max_workspace, const char* name);
  ~LtFp8Gemm();
  LtFp8Gemm(const LtFp8Gemm&) = delete;
  LtFp8Gemm& operator=(const LtFp8Gemm&) = delete;

  int64_t workspace_bytes() const { return workspace_bytes_; }
  // x: [m, k] codes, y: [n, k] codes, x_scale_inv / y_scale_inv: one float each in device memory.
  void run(const uint8_t* x, const float* x_scale_inv, const uint8_t* y, const float* y_scale_inv, float* c,
           void* workspace, cudaStream_t stream);

 private:
  void destroy() noexcept;

  cublasLtHandle_t handle_;
  const char* name_;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_y_ = nullptr, layout_x_ = nullptr, layout_c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  int64_t workspace_bytes_ = 0;
};

}  // namespace lnmlp::cuda
