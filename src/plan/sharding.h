// Sharding at plan creation: the preconditions of docs/design.md, "Sharding", checked, and the shard's Config.
#pragma once

#include "config.h"

namespace lnmlp {

// Throws (LNMLP_ERROR_INVALID_ARGUMENT) with what to change, unless cfg's sharding is runnable: a
// communicator of the same size and rank, F (and under sequence parallelism T) divisible by the
// group size, and a communicator of the backend's kind (NCCL for the CUDA backend, MPI or callbacks
// for the CPU backend). A CUDA plan given an NCCL communicator uses it even with group_size 1.
void validate_sharding(const Config& cfg);

// The plan's Config for its shard: ffn = F/P (tokens stays the group's T; Config::rows()).
Config shard_config(const Config& global);

}  // namespace lnmlp
