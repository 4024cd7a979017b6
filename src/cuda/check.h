// CUDA runtime and cuBLASLt failures as lnmlp errors (LNMLP_ERROR_BACKEND naming the call, or
// LNMLP_ERROR_OUT_OF_MEMORY for an allocation that failed), and the checks after each launch.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

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

// The environment variable of the synchronous check (sync_check_after).
constexpr const char* kSyncCheckVariable = "LNMLP_CUDA_SYNC_CHECK";

// Whether LNMLP_CUDA_SYNC_CHECK is set to anything but "" or "0" (read once per process).
inline bool sync_check() {
  static const bool on = [] {
    const char* v = std::getenv(kSyncCheckVariable);
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// A fault while a kernel runs (an illegal address, a trap) is asynchronous: it surfaces at the
// first later call that waits for the device, blamed on whatever that call was, and it poisons
// the context from then on. With LNMLP_CUDA_SYNC_CHECK=1 the stream is waited for after each
// `what` (a kernel, a GEMM, a collective) is enqueued, and a fault is reported as `what`'s own: a
// debugging mode (slow: the GPU idles between launches), which the GPU check's rerun of failed
// tests uses. A stream being captured into a CUDA graph is not waited for (that would invalidate
// the capture).
inline void sync_check_after(const char* what, cudaStream_t stream) {
  if (!sync_check()) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;
  const cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess)
    fail(LNMLP_ERROR_BACKEND, what, " failed while running: ", cudaGetErrorName(e), " (", cudaGetErrorString(e),
         ") (found by ", kSyncCheckVariable, ")");
}

// After `kernel` was launched on `stream`: a launch that failed (a bad configuration, too many
// resources) is reported naming it, and under LNMLP_CUDA_SYNC_CHECK so is a fault while it ran.
inline void check_launch(const char* kernel, cudaStream_t stream) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    const char* name = cudaGetErrorName(e);
    const char* text = cudaGetErrorString(e);
    // Without the synchronous check, a fault of an earlier kernel surfaces here as well.
    if (sync_check()) fail(LNMLP_ERROR_BACKEND, "the launch of ", kernel, " failed: ", name, " (", text, ")");
    fail(LNMLP_ERROR_BACKEND, "the launch of ", kernel, " failed: ", name, " (", text,
         "); if an earlier kernel faulted, ", kSyncCheckVariable, "=1 names it");
  }
  sync_check_after(kernel, stream);
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
