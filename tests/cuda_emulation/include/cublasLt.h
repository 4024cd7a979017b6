// The cuBLASLt names lnmlp's CUDA backend uses outside its GEMM wrapper, for the CPU emulation
// (tests/cuda_emulation/README.md); the GEMMs themselves are emulated_gemm.cpp's LtGemm.
#pragma once

#include "cuda_runtime_api.h"

typedef struct EmulatedLtHandle* cublasLtHandle_t;
typedef struct EmulatedLtMatmulDesc* cublasLtMatmulDesc_t;
typedef struct EmulatedLtMatrixLayout* cublasLtMatrixLayout_t;
struct cublasLtMatmulAlgo_t {
  int unused;
};
enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0, CUBLAS_STATUS_ALLOC_FAILED = 3, CUBLAS_STATUS_NOT_SUPPORTED = 15 };

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  static char tag;
  *handle = reinterpret_cast<cublasLtHandle_t>(&tag);
  return CUBLAS_STATUS_SUCCESS;
}
inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t) { return CUBLAS_STATUS_SUCCESS; }
inline const char* cublasLtGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_EMULATION"; }
inline const char* cublasLtGetStatusString(cublasStatus_t) { return "an error of the cuBLASLt emulation"; }
