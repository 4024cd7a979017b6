// What every CUDA backend (unquantized and FP8) shares: memory on the plan's device, and the
// synchronous host copies the state functions use.
#pragma once

#include <cuda_runtime_api.h>

#include "block/backend.h"
#include "check.h"

namespace lnmlp::cuda {

class DeviceMemoryBackend : public Backend {
 public:
  explicit DeviceMemoryBackend(int device) : device_(device) {}

  void* allocate(int64_t bytes) override {
    ScopedDevice dev(device_);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(LNMLP_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of GPU memory on device ", device_, " (",
           cudaGetErrorString(e), ")");
    }
    return p;
  }
  void release(void* p) noexcept override {
    if (p == nullptr) return;
    int prev = 0;
    const bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != device_ && cudaSetDevice(device_) == cudaSuccess;
    cudaFree(p);
    if (switched) cudaSetDevice(prev);
  }
  void copy_to_host(void* dst, const void* src, int64_t n) override {
    ScopedDevice dev(device_);
    cuda_check(cudaMemcpy(dst, src, static_cast<size_t>(n), cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
  }
  void copy_from_host(void* dst, const void* src, int64_t n) override {
    ScopedDevice dev(device_);
    cuda_check(cudaMemcpy(dst, src, static_cast<size_t>(n), cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
  }

 protected:
  int device_;
};

// The CUDA backend under an FP8 recipe (cuda_fp8_backend.cpp).
std::unique_ptr<Backend> make_cuda_fp8_backend(const Config& cfg, const SavedLayout& saved);

}  // namespace lnmlp::cuda
