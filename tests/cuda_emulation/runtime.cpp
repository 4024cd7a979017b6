// The CPU emulation of CUDA's runtime (include/cuda_runtime_api.h). A launch runs its blocks one
// after another under one process-wide lock, on the launching thread; a block's threads are fibers
// (ucontext), run in turn until each reaches a barrier (__syncthreads for the block, a warp's for
// the shuffles), where it waits until every live thread of its group has arrived. Device memory is
// host memory; cudaMalloc'ed ranges are remembered, so that cudaPointerGetAttributes tells device
// memory from host memory as the real runtime does.
#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_runtime_api.h"

uint3 threadIdx;
uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace {

std::mutex g_launch;  // one block at a time: __shared__ variables are statics, threadIdx a global
std::mutex g_memory;
std::map<const char*, size_t> g_device_ranges;
std::atomic<long> g_device_allocations{0};
std::atomic<long> g_gemms_made{0};

// Errors as the runtime reports them (cuda_runtime_api.h's run_grid): a launch's configuration
// error, per thread until cudaGetLastError reads it; an injected kernel fault, for the process,
// pending until a call waits for the device and sticky from then on.
thread_local cudaError_t t_launch_error = cudaSuccess;
enum class Fault { None, Pending, Reported };
std::atomic<Fault> g_fault{Fault::None};
std::atomic<bool> g_fault_injected{false};

// The result of a call that waits for the device: the fault, once the kernel has faulted.
cudaError_t device_wait() {
  if (g_fault.load() == Fault::None) return cudaSuccess;
  g_fault = Fault::Reported;
  return cudaErrorIllegalAddress;
}

// The devices (LNMLP_EMULATION_DEVICES, default 1), the calling thread's current one, and a
// stream: the device it was made on (streams are otherwise all one, in order).
int device_count() {
  const char* n = std::getenv("LNMLP_EMULATION_DEVICES");
  return n == nullptr || std::atoi(n) < 1 ? 1 : std::atoi(n);
}
thread_local int t_device = 0;
struct EmulatedStream {
  int device;
};

// Whether this launch of `kernel` is the one LNMLP_EMULATION_FAULT_IN names (its first).
bool faults(const char* kernel) {
  const char* name = std::getenv("LNMLP_EMULATION_FAULT_IN");
  if (name == nullptr || std::strcmp(name, kernel) != 0) return false;
  return !g_fault_injected.exchange(true);
}

bool is_device_memory(const void* p) {
  std::lock_guard<std::mutex> lock(g_memory);
  const char* c = static_cast<const char*>(p);
  auto it = g_device_ranges.upper_bound(c);
  if (it == g_device_ranges.begin()) return false;
  --it;
  return c >= it->first && c < it->first + std::max<size_t>(it->second, 1);
}

// A fiber's stack: mapped once per thread slot and kept (pages are committed as they are touched).
constexpr size_t kStackBytes = size_t{1} << 20;

enum class State { Runnable, Waiting, Done };

struct Fiber {
  ucontext_t context;
  char* stack = nullptr;
  State state = State::Runnable;
};

// A barrier group: the block (0) or one of its warps (1 + w).
struct Group {
  unsigned size = 0, arrived = 0;
};

struct Block {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  std::vector<Group> groups;
  std::vector<unsigned> exchange;  // a slot per thread, for the shuffles
  unsigned current = 0;
  dim3 block_dim;
  const std::function<void()>* body = nullptr;
};
Block* g_block = nullptr;

void set_thread_index(const Block& b, unsigned t) {
  threadIdx = {t % b.block_dim.x, (t / b.block_dim.x) % b.block_dim.y, t / (b.block_dim.x * b.block_dim.y)};
}

// Releases group g's waiting threads once every live one has arrived.
void release_if_complete(Block& b, unsigned g) {
  Group& grp = b.groups[g];
  if (grp.arrived < grp.size) return;
  grp.arrived = 0;
  for (unsigned t = 0; t < b.fibers.size(); ++t) {
    const bool member = g == 0 || t / 32 == g - 1;
    if (member && b.fibers[t].state == State::Waiting) b.fibers[t].state = State::Runnable;
  }
}

void wait_at(unsigned g) {
  Block& b = *g_block;
  ++b.groups[g].arrived;
  Fiber& f = b.fibers[b.current];
  f.state = State::Waiting;
  release_if_complete(b, g);  // the last to arrive releases the others, and itself
  if (f.state == State::Waiting) swapcontext(&f.context, &b.scheduler);
}

void fiber_main() {
  Block& b = *g_block;
  (*b.body)();
  // A thread that returned no longer holds its groups up.
  const unsigned t = b.current;
  b.fibers[t].state = State::Done;
  for (unsigned g : {0u, 1 + t / 32}) {
    --b.groups[g].size;
    release_if_complete(b, g);
  }
  swapcontext(&b.fibers[t].context, &b.scheduler);
}

// Out of line: getcontext returns twice, which the caller's loop must not see.
__attribute__((noinline)) void start_fiber(Fiber& f, char* stack) {
  f.state = State::Runnable;
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = nullptr;
  makecontext(&f.context, fiber_main, 0);
}

std::vector<char*>& stacks() {
  static auto* s = new std::vector<char*>;  // never unmapped
  return *s;
}

}  // namespace

void __syncthreads() { wait_at(0); }

unsigned cuda_emulation_shfl_xor(unsigned v, int lane_mask) {
  Block& b = *g_block;
  const unsigned t = b.current, warp = t >> 5, lane = t & 31;
  b.exchange[t] = v;
  wait_at(1 + warp);
  const unsigned r = b.exchange[(warp << 5) | (lane ^ static_cast<unsigned>(lane_mask))];
  wait_at(1 + warp);
  return r;
}

unsigned atomicMax(unsigned* address, unsigned v) {  // one block at a time: a plain max
  const unsigned old = *address;
  if (v > old) *address = v;
  return old;
}

namespace cuda_emulation {
void run_grid(dim3 grid, dim3 block_dim, const char* kernel, const std::function<void()>& body) {
  // The limits of every device lnmlp runs on (compute capability 8.0 and up).
  const uint64_t n_threads = uint64_t{block_dim.x} * block_dim.y * block_dim.z;
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 ||
      n_threads < 1 || n_threads > 1024 || block_dim.z > 64) {
    t_launch_error = cudaErrorInvalidConfiguration;
    return;
  }
  if (faults(kernel) && g_fault.load() == Fault::None) g_fault = Fault::Pending;
  std::lock_guard<std::mutex> lock(g_launch);
  const unsigned n = static_cast<unsigned>(n_threads), warps = (n + 31) / 32;
  while (stacks().size() < n) {
    void* s = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s == MAP_FAILED) {
      std::fprintf(stderr, "CUDA emulation: no memory for a thread's stack\n");
      std::abort();
    }
    stacks().push_back(static_cast<char*>(s));
  }
  Block b;
  b.block_dim = block_dim;
  b.body = &body;
  b.fibers.resize(n);
  b.exchange.assign(warps * 32, 0);
  gridDim = grid;
  blockDim = block_dim;
  g_block = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = {x, y, z};
        b.groups.assign(1 + warps, Group{});
        b.groups[0].size = n;
        for (unsigned w = 0; w < warps; ++w) b.groups[1 + w].size = std::min(32u, n - 32 * w);
        for (unsigned t = 0; t < n; ++t) start_fiber(b.fibers[t], stacks()[t]);
        for (unsigned done = 0; done < n;) {
          bool ran = false;
          done = 0;
          for (unsigned t = 0; t < n; ++t) {
            if (b.fibers[t].state == State::Done) {
              ++done;
              continue;
            }
            if (b.fibers[t].state != State::Runnable) continue;
            b.current = t;
            set_thread_index(b, t);
            ran = true;
            swapcontext(&b.scheduler, &b.fibers[t].context);
          }
          if (!ran && done < n) {
            std::fprintf(stderr, "CUDA emulation: the threads of block (%u, %u, %u) wait at barriers forever\n", x, y,
                         z);
            std::abort();
          }
        }
      }
  g_block = nullptr;
}
}  // namespace cuda_emulation

namespace cuda_emulation {
Counts counts() { return Counts{g_device_allocations.load(), g_gemms_made.load()}; }
void note_gemm_made() { ++g_gemms_made; }
}  // namespace cuda_emulation

cudaError_t cudaMalloc(void** p, size_t bytes) {
  ++g_device_allocations;
  *p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(g_memory);
  g_device_ranges[static_cast<const char*>(*p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaMallocManaged(void** p, size_t bytes, unsigned) { return cudaMalloc(p, bytes); }
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(g_memory);
    g_device_ranges.erase(static_cast<const char*>(p));
  }
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned) {
  std::lock_guard<std::mutex> lock(g_memory);
  g_device_ranges[static_cast<const char*>(p)] = bytes;
  return cudaSuccess;
}
cudaError_t cudaHostUnregister(void* p) {
  std::lock_guard<std::mutex> lock(g_memory);
  g_device_ranges.erase(static_cast<const char*>(p));
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind) {
  std::lock_guard<std::mutex> lock(g_launch);  // ordered against kernels, as on the legacy stream
  if (const cudaError_t e = device_wait(); e != cudaSuccess) return e;
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(dst, src, bytes, kind);
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_launch);
  if (bytes > 0) std::memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t) { return cudaMemset(dst, value, bytes); }
cudaError_t cudaDeviceSynchronize() { return device_wait(); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return device_wait(); }
cudaError_t cudaStreamCreate(cudaStream_t* s) {
  *s = reinterpret_cast<cudaStream_t>(new EmulatedStream{t_device});
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { return cudaStreamCreate(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<EmulatedStream*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* device) {
  *device = s == nullptr ? t_device : reinterpret_cast<EmulatedStream*>(s)->device;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) { return cudaErrorNotSupported; }
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t*) { return cudaErrorNotSupported; }
cudaError_t cudaGraphInstantiate(cudaGraphExec_t*, cudaGraph_t, unsigned long long) { return cudaErrorNotSupported; }
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t) { return cudaErrorNotSupported; }
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) { return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t) { return cudaSuccess; }
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  fn(data);
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return cudaErrorInvalidDevice;
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  std::memset(prop, 0, sizeof *prop);
  // sm_90 (Hopper), or LNMLP_EMULATION_SM's (100: Blackwell, whose FP4 GEMMs emulated_gemm.cpp has).
  const char* sm = std::getenv("LNMLP_EMULATION_SM");
  const int cc = sm != nullptr && std::atoi(sm) > 0 ? std::atoi(sm) : 90;
  std::snprintf(prop->name, sizeof prop->name, "CPU emulation (sm_%d)", cc);
  prop->major = cc / 10;
  prop->minor = cc % 10;
  prop->totalGlobalMem = size_t{1} << 34;
  prop->multiProcessorCount = 132;
  return cudaSuccess;
}
cudaError_t cudaPeekAtLastError() {
  if (g_fault.load() == Fault::Reported) return cudaErrorIllegalAddress;
  return t_launch_error;
}
cudaError_t cudaGetLastError() {
  const cudaError_t e = cudaPeekAtLastError();
  t_launch_error = cudaSuccess;
  return e;
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    default: return "an error of the CUDA emulation";
  }
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    default: return "cudaErrorEmulation";
  }
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  std::memset(attributes, 0, sizeof *attributes);
  attributes->type = is_device_memory(p) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) {
  static char tag;
  *e = reinterpret_cast<cudaEvent_t>(&tag);
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return cudaSuccess; }  // all in order here
cudaError_t cudaEventSynchronize(cudaEvent_t) { return device_wait(); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  *ms = 1.0f;  // no timing here
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) { return cudaSuccess; }
