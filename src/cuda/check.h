// CUDA runtime and cuBLASLt failures as lnmlp errors (LNMLP_ERROR_BACKEND naming the call, or
// LNMLP_ERROR_OUT_OF_MEMORY for an allocation that failed).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "common/error.h"

namespace lnmlp::cuda {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // an allocation failure is not sticky: clear it
      fail(LNMLP_ERROR_OUT_OF_MEMORY, what, ": out of GPU memory (", cudaGetErrorString(e), ")");
    }
    fail(LNMLP_ERROR_BACKEND, what, " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  }
}

inline void cublas_check(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    fail(LNMLP_ERROR_OUT_OF_MEMORY, what, ": cuBLASLt could not allocate (", cublasLtGetStatusString(s), ")");
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(LNMLP_ERROR_BACKEND, what, " failed: ", cublasLtGetStatusName(s), " (", cublasLtGetStatusString(s), ")");
}

// Makes `device` current for a scope and restores the caller's device afterwards.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) cuda_check(cudaSetDevice(device), "cudaSetDevice");
    restore_ = previous_ != device;
  }
  ~ScopedDevice() {
    if (restore_) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace lnmlp::cuda
