// What a plan runs: its Engine, created once at plan creation. A CPU plan's is the block schedule
// over the CPU backend's primitives, in the core library; a CUDA plan's lives in the dlopen'ed
// CUDA module (the same schedule over the CUDA primitives), and the core holds a proxy that
// forwards each call across the module's C table (api/cuda_engine.cpp).
#pragma once

#include <cstdint>
#include <memory>

#include "exec.h"
#include "plan/call_args.h"
#include "plan/config.h"
#include "plan/layout.h"
#include "weight_copies.h"

namespace lnmlp::block {

class Engine {
 public:
  virtual ~Engine() = default;
  virtual int64_t workspace_bytes() const = 0;
  // Alignment required of the saved buffer and of an attached workspace.
  virtual int64_t alignment() const = 0;
  // One call of args.tokens rows (0 .. the plan's; checked by the C API).
  virtual void forward(const ForwardArgs& args, void* workspace) = 0;
  virtual void backward(const BackwardArgs& args, void* workspace) = 0;
  // Memory of the kind the engine executes on (host or device), and synchronous copies between it
  // and the host (the FP8 state's export and import).
  virtual void* allocate(int64_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void copy_to_host(void* host_dst, const void* src, int64_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, int64_t bytes) = 0;
};

// The block schedule (schedule.h) over one backend's primitives. Its workspace is what a sizing
// run of the schedule takes (workspace.h).
class BlockEngine final : public Engine {
 public:
  BlockEngine(const Config& cfg, const SavedLayout& saved, std::unique_ptr<Exec> exec);

  int64_t workspace_bytes() const override { return workspace_bytes_; }
  int64_t alignment() const override { return exec_->alignment(); }
  void forward(const ForwardArgs& args, void* workspace) override;
  void backward(const BackwardArgs& args, void* workspace) override;
  void* allocate(int64_t bytes) override { return exec_->allocate(bytes); }
  void release(void* p) noexcept override { exec_->release(p); }
  void copy_to_host(void* host_dst, const void* src, int64_t bytes) override {
    exec_->copy_to_host(host_dst, src, bytes);
  }
  void copy_from_host(void* dst, const void* host_src, int64_t bytes) override {
    exec_->copy_from_host(dst, host_src, bytes);
  }

 private:
  // Forgets the kept weight copies unless the call's weights are unchanged and its workspace is
  // the one they live in.
  void keep_weights(bool unchanged, const void* workspace);
  // The backend's checks of a call's saved sections, when it passes them apart.
  void check_sections(const SavedBuffer& saved, void* stream);
  // One pass (run_forward or run_backward) of a call with a.tokens > 0 tokens.
  template <typename Args, typename Pass> void run_call(const Args& a, void* workspace, Pass pass);

  Config cfg_;
  SavedLayout saved_;
  std::unique_ptr<Exec> exec_;
  int64_t workspace_bytes_ = 0;
  WeightCopies weights_;
};

}  // namespace lnmlp::block
