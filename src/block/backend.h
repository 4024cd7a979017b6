// The seam between the plan (validation, handles, buffers) and an execution backend (CPU, CUDA).
// A backend is built for one validated Config; it sizes its workspace at construction and never
// allocates while running. Arguments reach it already checked (non-NULL where required, aligned,
// not overlapping).
#pragma once

#include <cstdint>
#include <memory>

#include "plan/config.h"
#include "plan/layout.h"

namespace lnmlp {

struct ForwardArgs {
  const void* x;
  const void* gamma;
  const void* beta;  // NULL for rmsnorm
  const void* w1;
  const void* b1;    // NULL without bias1
  const void* w2;
  const void* b2;    // NULL without bias2
  void* y;
  void* saved;       // NULL when the plan saves nothing
  void* stream;
  float* fp8_state;  // the plan's quantizer state in backend memory (fp8_state.h); NULL without FP8
};

struct BackwardArgs {
  const void* dy;
  const void* x;
  const void* gamma;
  const void* beta;
  const void* w1;
  const void* b1;
  const void* w2;
  const void* saved;
  void* dx;
  void* dgamma;
  void* dbeta;
  void* dw1;
  void* db1;
  void* dw2;
  void* db2;
  void* stream;
  float* fp8_state;  // as in ForwardArgs
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual int64_t workspace_bytes() const = 0;
  // Alignment required of the saved buffer and of attached workspace.
  virtual int64_t alignment() const = 0;
  virtual void forward(const ForwardArgs& args, void* workspace) = 0;
  virtual void backward(const BackwardArgs& args, void* workspace) = 0;
  // Allocates / frees memory of the kind the backend executes on (host or device).
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  // Copies between host memory and memory from allocate(), synchronously (state export/import).
  virtual void copy_to_host(void* host_dst, const void* src, int64_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, int64_t bytes) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(const Config& cfg, const SavedLayout& saved);
// The CPU backend under an FP8 recipe (cfg.fp8.recipe != None).
std::unique_ptr<Backend> make_cpu_fp8_backend(const Config& cfg, const SavedLayout& saved);
// The backend cfg.backend names (backend_factory.cpp).
std::unique_ptr<Backend> make_backend(const Config& cfg, const SavedLayout& saved);

}  // namespace lnmlp
