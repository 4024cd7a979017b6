// When the library is unloaded (dlclose by a plugin host) or the process exits, and the caller has
// destroyed every handle, the objects lnmlp keeps for the process -- the handle registry and
// oneDNN's engine -- are freed, so that loading and unloading lnmlp leaks nothing (valgrind,
// scripts/valgrind.sh). With handles still alive both stay: their objects may yet be released
// during exit, after this runs.
#include "cpu/gemm.h"
#include "handles.h"

namespace {

__attribute__((destructor)) void release_process_objects() {
  if (lnmlp::release_registry_if_empty()) lnmlp::cpu::release_gemm_library();
}

}  // namespace
