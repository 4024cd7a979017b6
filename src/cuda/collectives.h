// The CUDA backends' collective steps of a sharded plan (DESIGN section 4, docs/sharding.md), the
// device counterparts of src/cpu/collectives.h, over the module's NCCL communicator on the plan's
// stream. With comm == NULL (an unsharded plan) they reduce to the local computation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../comm.h"

namespace lnmlp::cuda {

// What a sharded plan needs to sum a replicated parameter's gradient over the group: the
// communicator and an fp32 vector of workspace as long as the longest such gradient (H). NULL
// members (unsharded, or without sequence parallelism, where every rank already has the sum):
// no group sum.
struct GroupSum {
  Communicator* comm = nullptr;
  float* buffer = nullptr;
};

// A rank's fp32 partial sums [rows, width] (all T rows) summed over the group: in place
// (all-reduce), or under sequence parallelism into this rank's rows `local` [rows/P, width]
// (reduce-scatter). Returns where this rank's summed rows are.
inline float* group_sum_rows(Communicator* comm, bool sp, float* partial, float* local, int64_t rows, int64_t width,
                             cudaStream_t stream) {
  if (comm == nullptr) return partial;
  if (sp) {
    comm->reduce_scatter_sum(partial, local, rows / comm->size() * width, CommType::F32, stream);
    return local;
  }
  comm->all_reduce_sum(partial, partial, rows * width, CommType::F32, stream);
  return partial;
}

}  // namespace lnmlp::cuda
