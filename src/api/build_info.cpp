#include "build_info.h"

#include <string>

#include "comm/comm.h"
#include "cpu/cpu_exec.h"
#include "cpu/gemm.h"
#include "lnmlp.h"
#include "module/loader.h"

namespace lnmlp {
namespace {

std::string describe(const std::string& cuda_backend) {
  return std::string("lnmlp ") + std::to_string(LNMLP_VERSION_MAJOR) + "." + std::to_string(LNMLP_VERSION_MINOR) + "." +
         std::to_string(LNMLP_VERSION_PATCH) + " (ABI " + std::to_string(LNMLP_ABI_VERSION) +
         "); CPU backend: " + cpu::gemm_library_description() + "; CPU kernels: " + cpu::cpu_kernels_description() +
         "; CUDA backend: " + cuda_backend + "; MPI communicator: " + (mpi_built() ? "built" : "not built");
}

}  // namespace

// Two texts, each made once and never freed (callers keep the pointer): before anything has asked
// for the CUDA module, and after, when it names the module and the cuBLASLt and NCCL it found.
// Asking for the build info does not load the module itself: that maps cuBLASLt (hundreds of MB).
const char* build_info() {
#if defined(LNMLP_CUDA_MODULE_BUILT)
  const std::string loaded = cuda_module_description();
  if (!loaded.empty()) {
    static const std::string after = describe(loaded);
    return after.c_str();
  }
  static const std::string before = describe("module liblnmlp_cuda.so.1 built (loaded on first use)");
#else
  static const std::string before = describe("not built");
#endif
  return before.c_str();
}

}  // namespace lnmlp
