// Helpers of the CUDA backend tests: whether a GPU is usable (else the tests skip, saying why),
// device buffers, and running one problem (test_util.h's Problem) on a CPU or CUDA plan through the
// public C API.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"

namespace lnmlp_gpu_test {

using namespace lnmlp_test;

#define CUDA_TEST_CHECK(call)                                                                              \
  do {                                                                                                     \
    const cudaError_t e_ = (call);                                                                         \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

// Empty when the CUDA backend can run here; else the library's reason (for GTEST_SKIP).
inline std::string cuda_unavailable_reason() {
  int32_t yes = 0;
  if (lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &yes) != LNMLP_SUCCESS)
    return std::string("lnmlp_query_support failed: ") + lnmlp_last_error();
  if (yes == 1) return "";
  // Ask for a plan to get the library's own words for why not.
  lnmlp_desc* d = nullptr;
  lnmlp_desc_create(&d);
  lnmlp_desc_set_shape(d, 1, 8, 8);
  lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0);
  lnmlp_plan* p = nullptr;
  const int32_t st = lnmlp_plan_create(d, &p);
  std::string why = st == LNMLP_SUCCESS ? "lnmlp_query_support says no CUDA backend" : lnmlp_last_error();
  lnmlp_plan_destroy(p);
  lnmlp_desc_destroy(d);
  return "no usable GPU, CUDA tests skipped: " + why;
}

// Skips a test where the CUDA backend cannot run. In the CPU emulation it always can, so there an
// unusable backend (a module that fails to load) fails the test instead of passing as "no GPU".
#ifdef LNMLP_CUDA_EMULATED_RUNTIME
#define SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                    \
    const std::string why_ = cuda_unavailable_reason();                                   \
    if (!why_.empty()) GTEST_FAIL() << "the emulated CUDA backend is unusable: " << why_; \
  } while (0)
#else
#define SKIP_WITHOUT_GPU()                                         \
  do {                                                             \
    const std::string why_ = cuda_unavailable_reason();            \
    if (!why_.empty()) GTEST_SKIP() << why_;                       \
  } while (0)
#endif

// cudaMalloc'ed memory (256-byte aligned), freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) CUDA_TEST_CHECK(cudaMalloc(&p_, bytes));
  }
  // Synchronous (cudaMemcpy from pageable memory may return before the copy lands, and the tests
  // also run on non-blocking streams that do not wait for the legacy stream).
  DeviceBuffer(const void* host, size_t bytes) : DeviceBuffer(bytes) {
    if (bytes > 0) {
      CUDA_TEST_CHECK(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice));
      CUDA_TEST_CHECK(cudaDeviceSynchronize());
    }
  }
  explicit DeviceBuffer(const Buffer& b) : DeviceBuffer(b.data(), b.bytes.size()) {}
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }
  // All bytes 0xFF (NaN in every dtype), so an element the library forgets cannot pass.
  // Synchronous, for the same reason as the upload.
  void poison() const {
    if (p_) {
      CUDA_TEST_CHECK(cudaMemset(p_, 0xFF, bytes_));
      CUDA_TEST_CHECK(cudaDeviceSynchronize());
    }
  }
  void to_host(Buffer& b) const {
    if (!b.bytes.empty()) CUDA_TEST_CHECK(cudaMemcpy(b.data(), p_, b.bytes.size(), cudaMemcpyDeviceToHost));
  }
  std::vector<unsigned char> to_host() const {
    std::vector<unsigned char> v(bytes_);
    if (bytes_ > 0) CUDA_TEST_CHECK(cudaMemcpy(v.data(), p_, bytes_, cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// lnmlp_desc_set_sharding's arguments and the communicator (test_cuda_sharding.cpp).
struct PlanSharding {
  int32_t group_size = 1, rank = 0, sequence_parallel = 0;
  lnmlp_comm* comm = nullptr;
};

// ABI 2's options of a plan's calls: its most tokens (0: the problem's), its weight gradients, its
// GEMM math (LNMLP_GEMM_MATH_*) and whether it gives the norm output (lnmlp_desc_set_norm_output).
struct PlanCalls {
  int64_t max_tokens = 0;
  int32_t accumulate = 0;
  int32_t grad_dtype = -1;
  int32_t gemm_math = LNMLP_GEMM_MATH_EXACT;
  int32_t norm_output = 0;
};

// A plan for the problem on one backend.
inline lnmlp_plan* make_plan(const Problem& pr, int32_t remat, int32_t backend, int32_t device = 0,
                             int32_t recipe = LNMLP_RECIPE_NONE, const PlanSharding& shard = PlanSharding{},
                             const PlanCalls& calls = PlanCalls{},
                             const std::vector<int64_t>& prepared_tokens = {}) {  // lnmlp_desc_set_prepared_tokens
  const auto& c = pr.cfg;
  lnmlp_desc* d = nullptr;
  LNMLP_TEST_CHECK(lnmlp_desc_create(&d));
  std::unique_ptr<lnmlp_desc, int32_t (*)(lnmlp_desc*)> guard(d, lnmlp_desc_destroy);
  LNMLP_TEST_CHECK(lnmlp_desc_set_shape(d, calls.max_tokens > 0 ? calls.max_tokens : c.tokens, c.hidden, c.ffn));
  LNMLP_TEST_CHECK(lnmlp_desc_set_weight_gradients(d, calls.accumulate, calls.grad_dtype));
  set_block(d, pr);
  // fp32 weights with a bf16/f16 problem (lnmlp_desc_set_weight_dtype, FP8 recipes only).
  if (pr.bw1.dtype != pr.dtype) LNMLP_TEST_CHECK(lnmlp_desc_set_weight_dtype(d, pr.bw1.dtype));
  LNMLP_TEST_CHECK(lnmlp_desc_set_remat(d, remat));
  LNMLP_TEST_CHECK(lnmlp_desc_set_backend(d, backend, device));
  LNMLP_TEST_CHECK(lnmlp_desc_set_recipe(d, recipe));
  LNMLP_TEST_CHECK(lnmlp_desc_set_gemm_math(d, calls.gemm_math));
  LNMLP_TEST_CHECK(lnmlp_desc_set_norm_output(d, calls.norm_output));
  LNMLP_TEST_CHECK(
      lnmlp_desc_set_prepared_tokens(d, static_cast<int32_t>(prepared_tokens.size()), prepared_tokens.data()));
  if (backend == LNMLP_BACKEND_CPU) LNMLP_TEST_CHECK(lnmlp_desc_set_num_threads(d, 1));
  if (shard.comm != nullptr) LNMLP_TEST_CHECK(lnmlp_desc_set_communicator(d, shard.comm));
  LNMLP_TEST_CHECK(lnmlp_desc_set_sharding(d, shard.group_size, shard.rank, shard.sequence_parallel));
  lnmlp_plan* p = nullptr;
  LNMLP_TEST_CHECK(lnmlp_plan_create(d, &p));
  return p;
}

using PlanPtr = std::unique_ptr<lnmlp_plan, int32_t (*)(lnmlp_plan*)>;
inline PlanPtr plan_ptr(lnmlp_plan* p) { return PlanPtr(p, lnmlp_plan_destroy); }

// The problem's inputs on the device.
struct DeviceInputs {
  DeviceBuffer x, dy, gamma, beta, w1, b1, w2, b2;
  explicit DeviceInputs(const Problem& pr)
      : x(pr.bx), dy(pr.bdy), gamma(pr.bgamma), beta(pr.bbeta), w1(pr.bw1), b1(pr.bb1), w2(pr.bw2), b2(pr.bb2) {}
};

// Device outputs of one forward + backward.
struct DeviceOutputs {
  DeviceBuffer y, saved, dx, dgamma, dbeta, dw1, db1, dw2, db2;
  DeviceOutputs(const Problem& pr, int64_t saved_bytes) {
    const auto& c = pr.cfg;
    const size_t e = static_cast<size_t>(dtype_size(pr.dtype));
    const size_t T = static_cast<size_t>(c.tokens), H = static_cast<size_t>(c.hidden),
                 F = static_cast<size_t>(c.ffn), AF = c.acts.size() * F;
    const bool ln = c.norm == lnmlp_ref::Norm::LayerNorm;
    y = DeviceBuffer(T * H * e);
    saved = DeviceBuffer(static_cast<size_t>(saved_bytes));
    dx = DeviceBuffer(T * H * e);
    dgamma = DeviceBuffer(H * e);
    if (ln) dbeta = DeviceBuffer(H * e);
    dw1 = DeviceBuffer(H * AF * e);
    if (c.has_bias1) db1 = DeviceBuffer(AF * e);
    dw2 = DeviceBuffer(F * H * e);
    if (c.has_bias2) db2 = DeviceBuffer(H * e);
    for (const DeviceBuffer* b : {&y, &saved, &dx, &dgamma, &dbeta, &dw1, &db1, &dw2, &db2}) b->poison();
  }
};

inline int32_t device_forward(lnmlp_plan* p, const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  return lnmlp_plan_forward(p, plan_tokens(p), in.x.get(), in.gamma.get(), in.beta.get(), in.w1.get(), in.b1.get(),
                            in.w2.get(), in.b2.get(), out.y.get(), out.saved.get(), nullptr, LNMLP_CALL_DEFAULT,
                            stream);
}

inline int32_t device_backward(lnmlp_plan* p, const DeviceInputs& in, const DeviceOutputs& out, void* stream) {
  return lnmlp_plan_backward(p, plan_tokens(p), in.dy.get(), in.x.get(), in.gamma.get(), in.beta.get(), in.w1.get(),
                             in.b1.get(), in.w2.get(), out.saved.get(), out.dx.get(), out.dgamma.get(), out.dbeta.get(),
                             out.dw1.get(), out.db1.get(), out.dw2.get(), out.db2.get(), nullptr, LNMLP_CALL_DEFAULT,
                             stream);
}

// Forward then backward of `p` captured on `stream` into a CUDA graph, instantiated into *exec
// (the caller destroys it).
// "" on success, else what failed (the capture, a call under capture with its message, the
// instantiation).
inline std::string capture_step(lnmlp_plan* p, const DeviceInputs& in, const DeviceOutputs& out, cudaStream_t stream,
                                cudaGraphExec_t* exec) {
  cudaGraph_t graph = nullptr;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess)
    return "cudaStreamBeginCapture failed";
  const int32_t fst = device_forward(p, in, out, stream);
  const int32_t bst = device_backward(p, in, out, stream);
  const std::string err = lnmlp_last_error();
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess) return "cudaStreamEndCapture failed";
  std::string why;
  if (fst != LNMLP_SUCCESS || bst != LNMLP_SUCCESS) {
    why = "forward or backward under capture failed: " + err;
  } else if (cudaGraphInstantiate(exec, graph, 0) != cudaSuccess) {
    why = "cudaGraphInstantiate failed";
  }
  cudaGraphDestroy(graph);  // the instantiated graph does not need it
  return why;
}

// The outputs as host buffers, in RunResult's shape.
inline RunResult to_host(const Problem& pr, const DeviceOutputs& out, bool backward) {
  const auto& c = pr.cfg;
  const size_t T = static_cast<size_t>(c.tokens), H = static_cast<size_t>(c.hidden),
               F = static_cast<size_t>(c.ffn), AF = c.acts.size() * F;
  RunResult r;
  r.y = Buffer(pr.dtype, T * H);
  out.y.to_host(r.y);
  if (!backward) return r;
  r.dx = Buffer(pr.dtype, T * H);
  r.dgamma = Buffer(pr.dtype, H);
  if (out.dbeta.get()) r.dbeta = Buffer(pr.dtype, H);
  r.dw1 = Buffer(pr.dtype, H * AF);
  if (out.db1.get()) r.db1 = Buffer(pr.dtype, AF);
  r.dw2 = Buffer(pr.dtype, F * H);
  if (out.db2.get()) r.db2 = Buffer(pr.dtype, H);
  out.dx.to_host(r.dx);
  out.dgamma.to_host(r.dgamma);
  out.dbeta.to_host(r.dbeta);
  out.dw1.to_host(r.dw1);
  out.db1.to_host(r.db1);
  out.dw2.to_host(r.dw2);
  out.db2.to_host(r.db2);
  return r;
}

// A plan's outputs with its saved buffer's bytes, as run_cuda and run_cpu return them.
struct PlanRun {
  RunResult r;
  std::vector<unsigned char> saved;
};

// Forward (+ backward unless FORWARD_ONLY) on a CUDA plan, on the default stream.
inline PlanRun run_cuda(const Problem& pr, int32_t remat, int32_t recipe = LNMLP_RECIPE_NONE) {
  PlanPtr p = plan_ptr(make_plan(pr, remat, LNMLP_BACKEND_CUDA, 0, recipe));
  const int64_t saved_bytes = saved_bytes_of(p.get());
  const DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved_bytes);
  LNMLP_TEST_CHECK(device_forward(p.get(), in, out, nullptr));
  const bool backward = remat != LNMLP_REMAT_FORWARD_ONLY;
  if (backward) LNMLP_TEST_CHECK(device_backward(p.get(), in, out, nullptr));
  CUDA_TEST_CHECK(cudaDeviceSynchronize());
  PlanRun run;
  run.r = to_host(pr, out, backward);
  run.r.saved_bytes = saved_bytes;
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes_per_token(p.get(), &run.r.saved_bytes_per_token));
  run.saved = out.saved.to_host();
  return run;
}

// Forward (+ backward unless FORWARD_ONLY) on a CPU plan.
inline PlanRun run_cpu(const Problem& pr, int32_t remat, int32_t recipe = LNMLP_RECIPE_NONE) {
  PlanPtr p = plan_ptr(make_plan(pr, remat, LNMLP_BACKEND_CPU, 0, recipe));
  const bool backward = remat != LNMLP_REMAT_FORWARD_ONLY;
  PlanRun run;
  RunResult& r = run.r;
  r = output_buffers(pr, pr.cfg.tokens, backward);
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes(p.get(), &r.saved_bytes));
  LNMLP_TEST_CHECK(lnmlp_plan_get_saved_bytes_per_token(p.get(), &r.saved_bytes_per_token));
  AlignedMemory saved(r.saved_bytes, 256, 0xFF);
  LNMLP_TEST_CHECK(lnmlp_plan_forward(p.get(), plan_tokens(p.get()), pr.bx.data(), pr.bgamma.data(), pr.bbeta.data(),
                                      pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), pr.bb2.data(), r.y.data(),
                                      saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
  if (backward) {
    LNMLP_TEST_CHECK(lnmlp_plan_backward(p.get(), plan_tokens(p.get()), pr.bdy.data(), pr.bx.data(), pr.bgamma.data(),
                                         pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), saved.get(),
                                         r.dx.data(), r.dgamma.data(), r.dbeta.data(), r.dw1.data(), r.db1.data(),
                                         r.dw2.data(), r.db2.data(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
  }
  const auto* s = static_cast<const unsigned char*>(saved.get());
  run.saved.assign(s, s + r.saved_bytes);
  return run;
}

}  // namespace lnmlp_gpu_test
