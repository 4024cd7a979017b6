#include "devices.h"

#include <cstdint>

#include "check.h"

namespace lnmlp::cuda {

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(LNMLP_ERROR_NOT_SUPPORTED, "the CUDA backend cannot run on this machine: ", cudaGetErrorName(e), " (",
         cudaGetErrorString(e), "); it needs an NVIDIA GPU and driver, or use LNMLP_BACKEND_CPU");
  }
  if (n < 1)
    fail(LNMLP_ERROR_NOT_SUPPORTED, "the CUDA backend found no CUDA device on this machine; use LNMLP_BACKEND_CPU");
  return n;
}

void check_stream(cudaStream_t stream, int device) {
  int stream_device = -1;
  const cudaError_t e = cudaStreamGetDevice(stream, &stream_device);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the stream (", static_cast<void*>(stream),
         ") is not a stream the CUDA runtime knows (", cudaGetErrorName(e), "); pass a cudaStream_t of device ", device,
         ", or NULL for its default stream");
  }
  if (stream_device != device)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the stream belongs to CUDA device ", stream_device,
         ", but this plan runs on device ", device, "; pass a stream of device ", device,
         " (or NULL for its default stream)");
}

void check_device_pointers(std::initializer_list<NamedPointer> list, int device, int64_t alignment,
                           cudaStream_t stream) {
  check_stream(stream, device);
  for (const NamedPointer& p : list) {
    if (p.ptr != nullptr && reinterpret_cast<uintptr_t>(p.ptr) % static_cast<uintptr_t>(alignment) != 0)
      fail(LNMLP_ERROR_MISALIGNED, p.name, " (", p.ptr, ") is not aligned to ", alignment,
           " bytes, which the CUDA backend's GEMMs need (cudaMalloc returns 256-byte aligned memory)");
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;
  for (const NamedPointer& p : list) {
    if (p.ptr == nullptr) continue;
    cudaPointerAttributes at{};
    const cudaError_t e = cudaPointerGetAttributes(&at, p.ptr);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: clear it
      fail(LNMLP_ERROR_INVALID_ARGUMENT, p.name, " (", p.ptr, ") is not memory the CUDA runtime knows (",
           cudaGetErrorString(e), "); a CUDA plan takes device pointers");
    }
    if (at.type == cudaMemoryTypeUnregistered)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, p.name, " (", p.ptr,
           ") is host memory; a CUDA plan takes device pointers (cudaMalloc, cudaMallocManaged or "
           "cudaHostRegister'ed memory)");
    if (at.type == cudaMemoryTypeDevice && at.device != device)
      fail(LNMLP_ERROR_INVALID_ARGUMENT, p.name, " is memory of CUDA device ", at.device,
           ", but this plan runs on device ", device, "; create the plan for that device or copy the tensor");
  }
}

}  // namespace lnmlp::cuda
