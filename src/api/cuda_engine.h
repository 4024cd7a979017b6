// A CUDA plan's engine, as the core holds it: a proxy for the block engine the CUDA module
// creates (module/table.h). Each call crosses the module's C table once; the module turns an
// error into a status and its message there, and the proxy hands them on unchanged.
#pragma once

#include <memory>

#include "block/engine.h"

namespace lnmlp {

std::unique_ptr<block::Engine> make_cuda_engine(const Config& cfg, const SavedLayout& saved);

}  // namespace lnmlp
