// A communicator over an NCCL communicator (lnmlp_comm_create_nccl). NCCL is the CUDA module's
// business (cuda/nccl_comm.cpp): the core never links it, it asks the module for an opaque
// communicator (module/table.h) and forwards the collectives to it. The CUDA backend, which runs in
// the module too, receives that communicator at plan creation (cuda_module_comm).
#include <string>

#include "comm/comm.h"
#include "common/error.h"
#include "module/loader.h"
#include "module/table.h"
#include "nccl_communicator.h"

namespace lnmlp {
namespace {

constexpr int64_t kMsgCap = 1024;

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const lnmlp_cuda_module_table& t, const void* nccl_comm) : t_(t) {
    char msg[kMsgCap] = {0};
    check(t_.nccl_create(nccl_comm, &c_, &size_, &rank_, &device_, msg, kMsgCap), msg);
  }
  ~NcclCommunicator() override { t_.nccl_destroy(c_); }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  CommKind kind() const override { return CommKind::Nccl; }
  int32_t size() const override { return size_; }
  int32_t rank() const override { return rank_; }
  void all_gather(const void* s, void* r, int64_t n, CommType t, void* st) override {
    run(LNMLP_CUDA_ALL_GATHER, s, r, n, t, st);
  }
  void reduce_scatter_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    run(LNMLP_CUDA_REDUCE_SCATTER_SUM, s, r, n, t, st);
  }
  void all_reduce_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    run(LNMLP_CUDA_ALL_REDUCE_SUM, s, r, n, t, st);
  }
  void all_reduce_max(const void* s, void* r, int64_t n, CommType t, void* st) override {
    run(LNMLP_CUDA_ALL_REDUCE_MAX, s, r, n, t, st);
  }
  lnmlp_cuda_comm* module_comm() const { return c_; }
  int32_t device() const { return device_; }

 private:
  void run(int32_t op, const void* s, void* r, int64_t n, CommType t, void* st) {
    char msg[kMsgCap] = {0};
    check(t_.nccl_collective(c_, op, s, r, n, static_cast<int32_t>(t), st, msg, kMsgCap), msg);
  }
  static void check(int32_t status, const char* msg) {
    if (status != LNMLP_SUCCESS) fail(status, msg[0] != '\0' ? msg : "the NCCL communicator failed without a message");
  }
  const lnmlp_cuda_module_table& t_;
  lnmlp_cuda_comm* c_ = nullptr;
  int32_t size_ = 1, rank_ = 0, device_ = 0;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const void* nccl_comm) {
#if defined(LNMLP_CUDA_MODULE_BUILT)
  const lnmlp_cuda_module_table* t = nullptr;
  try {
    t = &cuda_module_table();
  } catch (const Error& e) {
    fail(LNMLP_ERROR_NOT_SUPPORTED,
         "the NCCL communicator runs in the CUDA backend module, which is unavailable: ", e.what());
  }
  if (t->nccl_built == 0)
    fail(LNMLP_ERROR_NOT_SUPPORTED,
         "the CUDA backend module was built without NCCL (CMake found no nccl.h); install NCCL's development files "
         "(for example libnccl-dev) and rebuild lnmlp, or shard on the CPU backend (lnmlp_comm_create_mpi or "
         "lnmlp_comm_create_callbacks)");
  return std::make_shared<NcclCommunicator>(*t, nccl_comm);
#else
  (void)nccl_comm;
  fail(LNMLP_ERROR_NOT_SUPPORTED,
       "this build of lnmlp has no CUDA backend (LNMLP_CUDA=OFF, or CMake found no CUDA toolkit), so no NCCL "
       "communicator; rebuild with the CUDA toolkit and NCCL, or shard on the CPU backend (lnmlp_comm_create_mpi or "
       "lnmlp_comm_create_callbacks)");
#endif
}

lnmlp_cuda_comm* cuda_module_comm(const Communicator* c) {
  if (c == nullptr || c->kind() != CommKind::Nccl) return nullptr;
  return static_cast<const NcclCommunicator*>(c)->module_comm();
}

}  // namespace lnmlp
