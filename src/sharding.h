// Sharding at plan creation: the checks of DESIGN section 4's preconditions and the shard's Config.
#pragma once

#include "config.h"

namespace lnmlp {

// Throws (LNMLP_ERROR_INVALID_ARGUMENT / NOT_SUPPORTED) with what to change, unless cfg's sharding
// is runnable: a communicator of the same size and rank, F (and under sequence parallelism T)
// divisible by the group size, a backend that shards (the CPU's).
void validate_sharding(const Config& cfg);

// The plan's Config for its shard: ffn = F/P (tokens stays the group's T; Config::rows()).
Config shard_config(const Config& global);

}  // namespace lnmlp
