// The CPU backends' collective steps of a sharded plan (DESIGN section 4, docs/sharding.md), shared
// by the unquantized and the FP8 backend. With comm == NULL (an unsharded plan) they reduce to the
// local computation.
#pragma once

#include <cstdint>

#include "../comm.h"
#include "kernels.h"

namespace lnmlp::cpu {

// A rank's fp32 partial sums [rows, width] (all T rows) summed over the group: in place
// (all-reduce), or under sequence parallelism into this rank's rows `local` [rows/P, width]
// (reduce-scatter). Returns where this rank's summed rows are.
inline float* group_sum_rows(Communicator* comm, bool sp, float* partial, float* local, int64_t rows, int64_t width,
                             void* stream) {
  if (comm == nullptr) return partial;
  if (sp) {
    comm->reduce_scatter_sum(partial, local, rows / comm->size() * width, CommType::F32, stream);
    return local;
  }
  comm->all_reduce_sum(partial, partial, rows * width, CommType::F32, stream);
  return partial;
}

// A parameter gradient from the per-chunk partials [chunks, n]: summed in chunk order
// (deterministic), then, with `group` (n floats of workspace; sequence parallelism), summed over
// the group, and rounded to D into out.
template <DType D>
void finish_param_grad(const float* partials, int chunks, int64_t n, storage_t<D>* out, Communicator* comm,
                       float* group, void* stream) {
  auto sum = [&](int64_t j) {
    float s = 0.0f;
    for (int ch = 0; ch < chunks; ++ch) s += partials[ch * n + j];
    return s;
  };
  if (group == nullptr) {
    for (int64_t j = 0; j < n; ++j) out[j] = store<D>(sum(j));
    return;
  }
  for (int64_t j = 0; j < n; ++j) group[j] = sum(j);
  comm->all_reduce_sum(group, group, n, CommType::F32, stream);
  for (int64_t j = 0; j < n; ++j) out[j] = store<D>(group[j]);
}

}  // namespace lnmlp::cpu
