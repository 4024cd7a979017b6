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
              "): install that MPI (for Open MPI's libmpi.so.40, Debian's libopenmpi3), or use "
              "lnmlp_comm_create_callbacks";
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
  const lnmlp_mpi_module_table* t = call_module_entry<lnmlp_mpi_module_table>(entry);
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
  const lnmlp_mpi_module_table* module = m.table;
  void* user = table.user;
  return make_table_communicator(
      table, CommKind::Mpi,
      [module](const char* name, int32_t code) {
        char text[kMsgCap] = {0};
        module->error_string(code, text, kMsgCap);
        return "MPI's " + std::string(name) + " failed: " + text;
      },
      [module, user] { module->close(user); });
}

bool mpi_built() {
#if defined(LNMLP_MPI_MODULE_BUILT)
  return true;
#else
  return false;
#endif
}

}  // namespace lnmlp
