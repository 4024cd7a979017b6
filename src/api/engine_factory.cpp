#include "engine_factory.h"

#include "common/error.h"
#include "cpu/cpu_exec.h"
#include "cuda_engine.h"

namespace lnmlp {

std::unique_ptr<block::Engine> make_engine(const Config& cfg, const SavedLayout& saved) {
  switch (cfg.backend) {
    case BackendKind::Cpu: return std::make_unique<block::BlockEngine>(cfg, saved, cpu::make_cpu_exec(cfg));
    case BackendKind::Cuda: return make_cuda_engine(cfg, saved);  // loads liblnmlp_cuda.so.1 on first use
  }
  fail(LNMLP_ERROR_INTERNAL, "unhandled backend ", static_cast<int>(cfg.backend));
}

}  // namespace lnmlp
