// What the CUDA backends' collective steps of a sharded plan (DESIGN section 4, docs/sharding.md)
// need besides comm.h's group_sum_rows, which runs them over the module's NCCL communicator on the
// plan's stream.
#pragma once

#include "comm/comm.h"

namespace lnmlp::cuda {

// What a sharded plan needs to sum a replicated parameter's gradient over the group: the
// communicator and an fp32 vector of workspace as long as the longest such gradient (H). NULL
// members (unsharded, or without sequence parallelism, where every rank already has the sum):
// no group sum.
struct GroupSum {
  Communicator* comm = nullptr;
  float* buffer = nullptr;
};

}  // namespace lnmlp::cuda
