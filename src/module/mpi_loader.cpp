// lnmlp_comm_create_mpi's communicator: the MPI module's collectives (comm/mpi_table.h). On
// first use the core loads the MPI library the build found (by its soname, into the global scope)
// and then the module liblnmlp_mpi.so.1, whose MPI symbols resolve against it; so only a program
// that asks for MPI needs an MPI library. Without either the factory says why.
#include <dlfcn.h>

#include <string>

#include "comm/comm.h"
#include "comm/mpi_table.h"
#include "common/error.h"
#include "lnmlp.h"
#include "module/loader.h"

namespace lnmlp {
namespace {

constexpr int64_t kMsgCap = 1024;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const lnmlp_mpi_module_table& m, const lnmlp_comm_callbacks& t) : m_(m), t_(t) {}
  ~MpiCommunicator() override { m_.close(t_.user); }
  CommKind kind() const override { return CommKind::Mpi; }
  int32_t size() const override { return static_cast<int32_t>(t_.group_size); }
  int32_t rank() const override { return static_cast<int32_t>(t_.rank); }
  void all_gather(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.all_gather, "MPI_Allgather", s, r, n, t, st);
  }
  void reduce_scatter_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.reduce_scatter, "MPI_Reduce_scatter_block", s, r, n, t, st);
  }
  void all_reduce_sum(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.all_reduce_sum, "MPI_Allreduce (sum)", s, r, n, t, st);
  }
  void all_reduce_max(const void* s, void* r, int64_t n, CommType t, void* st) override {
    call(t_.all_reduce_max, "MPI_Allreduce (max)", s, r, n, t, st);
  }

 private:
  void call(lnmlp_comm_fn fn, const char* what, const void* s, void* r, int64_t n, CommType t, void* st) {
    const int32_t code = fn(s, r, n, static_cast<int32_t>(t), t_.user, st);
    if (code == 0) return;
    char msg[kMsgCap] = {0};
    m_.error_string(code, msg, kMsgCap);
    fail(LNMLP_ERROR_BACKEND, what, " failed: ", msg);
  }
  const lnmlp_mpi_module_table& m_;
  lnmlp_comm_callbacks t_;
};

struct Module {
  const lnmlp_mpi_module_table* table = nullptr;
  std::string error;  // why table is NULL
};

Module load() {
  Module m;
#if defined(LNMLP_MPI_LIBRARY_SONAME)
  // The module leaves MPI's symbols to the global scope: the MPI library of the build goes there
  // first (already loaded by an MPI program or mpi4py, this only makes it global).
  if (dlopen(LNMLP_MPI_LIBRARY_SONAME, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* e = dlerror();
    m.error = std::string("could not load the MPI library lnmlp's MPI module was built with (") +
              (e ? e : LNMLP_MPI_LIBRARY_SONAME) +
              "): install it (Open MPI's libmpi.so.40: Debian libopenmpi3), or use lnmlp_comm_create_callbacks";
    return m;
  }
#endif
  std::string tried;
  void* entry = load_module_entry(LNMLP_MPI_MODULE_FILE, LNMLP_MPI_MODULE_ENTRY, &tried);
  if (entry == nullptr) {
    m.error = "could not load lnmlp's MPI module (" + tried +
              "): install it beside liblnmlp, or use lnmlp_comm_create_callbacks";
    return m;
  }
  lnmlp_mpi_module_entry_fn fn = nullptr;
  static_assert(sizeof(fn) == sizeof(entry), "function and object pointers differ in size");
  __builtin_memcpy(&fn, &entry, sizeof fn);
  const lnmlp_mpi_module_table* t = fn();
  if (t == nullptr || t->abi != LNMLP_MPI_MODULE_ABI) {
    m.error = "the MPI module " LNMLP_MPI_MODULE_FILE
              " was built from a different lnmlp version than this library; install the module of this build";
    return m;
  }
  m.table = t;
  return m;
}

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(const void* mpi_comm) {
  if (!mpi_built())
    fail(LNMLP_ERROR_NOT_SUPPORTED,
         "this build of lnmlp has no MPI module (CMake found no MPI, or LNMLP_MPI=OFF); install an MPI (Debian: "
         "libopenmpi-dev) and rebuild, or use lnmlp_comm_create_callbacks");
  static const Module m = load();  // thread-safe, once
  if (m.table == nullptr) fail(LNMLP_ERROR_NOT_SUPPORTED, m.error);
  lnmlp_comm_callbacks table{};
  char msg[kMsgCap] = {0};
  const int32_t status = m.table->open(mpi_comm, &table, msg, kMsgCap);
  if (status != LNMLP_SUCCESS) fail(status, msg);
  return std::make_shared<MpiCommunicator>(*m.table, table);
}

bool mpi_built() {
#if defined(LNMLP_MPI_MODULE_BUILT)
  return true;
#else
  return false;
#endif
}

}  // namespace lnmlp
