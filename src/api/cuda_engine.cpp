#include "cuda_engine.h"

#include "common/error.h"
#include "module/loader.h"
#include "module/table.h"
#include "nccl_communicator.h"

namespace lnmlp {
namespace {

constexpr int64_t kMsgCap = 1024;

class CudaModuleEngine final : public block::Engine {
 public:
  CudaModuleEngine(const lnmlp_cuda_module_table& t, const Config& cfg, const SavedLayout& saved) : t_(t) {
    Message m;
    m.check(t_.create(&cfg, &saved, cuda_module_comm(cfg.shard.comm), &e_, m.text, kMsgCap));
    try {  // asked once: both are fixed at creation
      Message w, a;
      w.check(t_.workspace_bytes(e_, &workspace_bytes_, w.text, kMsgCap));
      a.check(t_.alignment(e_, &alignment_, a.text, kMsgCap));
    } catch (...) {
      t_.destroy(e_);
      throw;
    }
  }
  ~CudaModuleEngine() override { t_.destroy(e_); }
  CudaModuleEngine(const CudaModuleEngine&) = delete;
  CudaModuleEngine& operator=(const CudaModuleEngine&) = delete;

  int64_t workspace_bytes() const override { return workspace_bytes_; }
  int64_t alignment() const override { return alignment_; }
  void forward(const ForwardArgs& args, void* workspace) override {
    Message m;
    m.check(t_.forward(e_, &args, workspace, m.text, kMsgCap));
  }
  void backward(const BackwardArgs& args, void* workspace) override {
    Message m;
    m.check(t_.backward(e_, &args, workspace, m.text, kMsgCap));
  }
  void* allocate(int64_t bytes) override {
    Message m;
    void* p = nullptr;
    m.check(t_.allocate(e_, bytes, &p, m.text, kMsgCap));
    return p;
  }
  void release(void* p) noexcept override { t_.release(e_, p); }
  void copy_to_host(void* host_dst, const void* src, int64_t bytes) override {
    Message m;
    m.check(t_.copy_to_host(e_, host_dst, src, bytes, m.text, kMsgCap));
  }
  void copy_from_host(void* dst, const void* host_src, int64_t bytes) override {
    Message m;
    m.check(t_.copy_from_host(e_, dst, host_src, bytes, m.text, kMsgCap));
  }

 private:
  // The module's message for a failed call, handed on with its status as they are.
  struct Message {
    char text[kMsgCap] = {0};
    void check(int32_t status) const {
      if (status != LNMLP_SUCCESS) fail(status, text[0] != '\0' ? text : "the CUDA backend failed without a message");
    }
  };

  const lnmlp_cuda_module_table& t_;
  lnmlp_cuda_engine* e_ = nullptr;
  int64_t workspace_bytes_ = 0, alignment_ = 0;
};

}  // namespace

std::unique_ptr<block::Engine> make_cuda_engine(const Config& cfg, const SavedLayout& saved) {
  return std::make_unique<CudaModuleEngine>(cuda_module_table(), cfg, saved);
}

}  // namespace lnmlp
