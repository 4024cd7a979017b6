// The engine a plan runs, for the backend its Config names.
#pragma once

#include <memory>

#include "block/engine.h"

namespace lnmlp {

// Throws lnmlp::Error (NOT_SUPPORTED when the CUDA module, driver or device is missing) with a
// message saying what to change.
std::unique_ptr<block::Engine> make_engine(const Config& cfg, const SavedLayout& saved);

}  // namespace lnmlp
