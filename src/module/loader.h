// The core's side of the CUDA module boundary (cuda_module.h): finding and loading
// liblnmlp_cuda.so with dlopen, and a Backend that forwards to it.
#pragma once

#include <cstdint>
#include <memory>

#include "block/backend.h"

struct lnmlp_cuda_module_table;  // cuda_module.h
struct lnmlp_cuda_comm;

namespace lnmlp {

class Communicator;

// The loaded module's table; throws NOT_SUPPORTED (saying why it could not be loaded).
const lnmlp_cuda_module_table& cuda_module_table();

// The module's communicator behind an NCCL Communicator (comm_nccl.cpp); NULL for any other kind.
lnmlp_cuda_comm* cuda_module_comm(const Communicator* c);

// A CUDA backend for cfg, from the module; throws lnmlp::Error (NOT_SUPPORTED when the module, the
// driver or the device is missing) with a message saying what to change.
std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, const SavedLayout& saved);

// lnmlp_query_support's answer for the CUDA backend: tries to load the module and probe for a
// device (never throws, never crashes).
int32_t cuda_feature_supported(int32_t feature) noexcept;

}  // namespace lnmlp
