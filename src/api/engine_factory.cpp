// Picks the backend a configuration names.
#include "block/backend.h"
#include "module/loader.h"
#include "common/error.h"

namespace lnmlp {

std::unique_ptr<Backend> make_backend(const Config& cfg, const SavedLayout& saved) {
  switch (cfg.backend) {
    case BackendKind::Cpu: return cfg.quantized() ? make_cpu_fp8_backend(cfg, saved) : make_cpu_backend(cfg, saved);
    case BackendKind::Cuda: return make_cuda_backend(cfg, saved);  // loads liblnmlp_cuda.so on first use
  }
  fail(LNMLP_ERROR_INTERNAL, "unhandled backend ", static_cast<int>(cfg.backend));
}

}  // namespace lnmlp
