#include "build_info.h"

#include <string>

#include "cpu/gemm.h"
#include "lnmlp.h"

namespace lnmlp {

const char* build_info() {
  static const std::string info = std::string("lnmlp ") + std::to_string(LNMLP_VERSION_MAJOR) + "." +
                                  std::to_string(LNMLP_VERSION_MINOR) + "." + std::to_string(LNMLP_VERSION_PATCH) +
                                  " (ABI " + std::to_string(LNMLP_ABI_VERSION) + "); CPU backend: " +
                                  cpu::gemm_library_description() + "; CUDA backend: not built";
  return info.c_str();
}

}  // namespace lnmlp
