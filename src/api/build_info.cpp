#include "build_info.h"

#include <string>

#include "comm/comm.h"
#include "cpu/cpu_exec.h"
#include "cpu/gemm.h"
#include "lnmlp.h"

namespace lnmlp {

const char* build_info() {
  static const std::string info = std::string("lnmlp ") + std::to_string(LNMLP_VERSION_MAJOR) + "." +
                                  std::to_string(LNMLP_VERSION_MINOR) + "." + std::to_string(LNMLP_VERSION_PATCH) +
                                  " (ABI " + std::to_string(LNMLP_ABI_VERSION) +
                                  "); CPU backend: " + cpu::gemm_library_description() +
                                  "; CPU kernels: " + cpu::cpu_kernels_description() + "; CUDA backend: " +
#if defined(LNMLP_CUDA_MODULE_BUILT)
                                  "module liblnmlp_cuda.so.1 built (loaded on first use)"
#else
                                  "not built"
#endif
                                  + std::string("; MPI communicator: ") + (mpi_built() ? "built" : "not built");
  return info.c_str();
}

}  // namespace lnmlp
