// The CPU emulation of CUDA (tests/cuda_emulation/README.md): the part of the CUDA runtime API and of
// the device language that lnmlp's kernels, its CUDA backend and their tests use, for the host
// compiler. This header stands in for the toolkit's when a target puts this directory first on its
// include path. Device memory is host memory; a launch runs its blocks one after another, each
// block's threads as host threads (runtime.cpp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>

// ---- the device language ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// One block runs at a time, so a block's shared memory can be a function's static storage.
#define __shared__ static
#define CUDART_CB

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
// One block runs at a time, on the launching thread: these are plain globals (runtime.cpp).
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

void __syncthreads();
// Every lane of a warp exchanges v with lane ^ lane_mask (all 32 lanes must call it).
unsigned cuda_emulation_shfl_xor(unsigned v, int lane_mask);
inline unsigned __shfl_xor_sync(unsigned, unsigned v, int m) { return cuda_emulation_shfl_xor(v, m); }
inline int __shfl_xor_sync(unsigned, int v, int m) {
  return static_cast<int>(cuda_emulation_shfl_xor(static_cast<unsigned>(v), m));
}
inline float __shfl_xor_sync(unsigned, float v, int m) {
  unsigned u = 0;
  std::memcpy(&u, &v, sizeof u);
  u = cuda_emulation_shfl_xor(u, m);
  std::memcpy(&v, &u, sizeof v);
  return v;
}
unsigned atomicMax(unsigned* address, unsigned v);

inline int min(int a, int b) { return a < b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// ---- the runtime API ----
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorIllegalAddress = 700,
  cudaErrorNotSupported = 801,
};
typedef cudaError_t cudaError;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;
typedef struct CUgraph_st* cudaGraph_t;
typedef struct CUgraphExec_st* cudaGraphExec_t;
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};
enum cudaStreamCaptureStatus { cudaStreamCaptureStatusNone = 0, cudaStreamCaptureStatusActive = 1 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0 };
enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
  cudaMemoryType type;
  int device;
  void* devicePointer;
  void* hostPointer;
};
struct cudaDeviceProp {
  char name[256];
  int major, minor;
  size_t totalGlobalMem;
  int multiProcessorCount;
};
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;
constexpr unsigned cudaHostRegisterDefault = 0;
constexpr unsigned cudaMemAttachGlobal = 1;
typedef void (*cudaHostFn_t)(void*);

cudaError_t cudaMalloc(void** p, size_t bytes);
template <typename T> cudaError_t cudaMalloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes);
}
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned flags = cudaMemAttachGlobal);
template <typename T> cudaError_t cudaMallocManaged(T** p, size_t bytes, unsigned flags = cudaMemAttachGlobal) {
  return cudaMallocManaged(reinterpret_cast<void**>(p), bytes, flags);
}
cudaError_t cudaFree(void* p);
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned flags);
cudaError_t cudaHostUnregister(void* p);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t s = nullptr);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamCreate(cudaStream_t* s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
// The device a stream was created on (NULL: the current device's default stream).
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* device);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status);
// Graphs are not emulated: capture fails with cudaErrorNotSupported.
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data);
// One device, or LNMLP_EMULATION_DEVICES of them (all sharing the host's memory, which belongs to
// device 0), so that a stream of another device can be made.
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);  // sm_90, or LNMLP_EMULATION_SM
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p);
cudaError_t cudaEventCreate(cudaEvent_t* e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaEventDestroy(cudaEvent_t e);

// ---- what the emulation has done, for tests of what a call allocates ----
// Defined by this header only: a test counts with it where the runtime is the emulation.
#define LNMLP_CUDA_EMULATED_RUNTIME 1
namespace cuda_emulation {
struct Counts {
  long device_allocations = 0;  // cudaMalloc and cudaMallocManaged calls
  long gemms_made = 0;          // LtGemm constructions: on a GPU, cuBLASLt descriptors, layouts and an
                                // algorithm query, i.e. host allocations (emulated_gemm.cpp)
};
// Since the process started (every thread's).
Counts counts();
void note_gemm_made();
}  // namespace cuda_emulation

// ---- launches ----
namespace cuda_emulation {
// Runs body() for every thread of every block of the grid, on the calling thread: the blocks one
// after another (every launch of the process holds one lock), a block's threads as fibers that
// take turns at their barriers. A grid or block beyond the device's limits is not run: the next
// cudaGetLastError says cudaErrorInvalidConfiguration, as on a GPU. The launch of the kernel named
// by LNMLP_EMULATION_FAULT_IN (its first launch) faults as a kernel on a GPU does: asynchronously,
// reported by the next call that waits for the device (cudaStreamSynchronize,
// cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy) and from then on by those calls and
// cudaGetLastError (a sticky cudaErrorIllegalAddress).
void run_grid(dim3 grid, dim3 block, const char* kernel, const std::function<void()>& body);

// kernel<<<grid, block, shared_bytes, stream>>>(args...), as rewrite_launches.py writes it, with the
// kernel's name. Streams do not exist here: the launch has finished when this returns.
template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t, cudaStream_t, const char* name, Kernel kernel, Args... args) {
  run_grid(grid, block, name, [&]() { kernel(args...); });
}
}  // namespace cuda_emulation
