// Picks the backend a configuration names.
#include "backend.h"
#include "error.h"

namespace lnmlp {

std::unique_ptr<Backend> make_backend(const Config& cfg, const SavedLayout& saved) {
  switch (cfg.backend) {
    case BackendKind::Cpu: return cfg.quantized() ? make_cpu_fp8_backend(cfg, saved) : make_cpu_backend(cfg, saved);
    case BackendKind::Cuda: break;
  }
  fail(LNMLP_ERROR_NOT_SUPPORTED, "the CUDA backend is not part of this build; use LNMLP_BACKEND_CPU");
}

}  // namespace lnmlp
