// The CPU backends' collective steps of a sharded plan (DESIGN section 4, docs/sharding.md), shared
// by the unquantized and the FP8 backend. With comm == NULL (an unsharded plan) they reduce to the
// local computation.
#pragma once

#include <cstdint>

#include "comm/comm.h"
#include "kernels.h"

namespace lnmlp::cpu {

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
