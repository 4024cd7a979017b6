// The end of backward that the CUDA backend's unquantized and FP8 paths share: norm backward from
// dn (dx per row, dgamma/dbeta partial column sums) and the final, in-order pass of every column
// reduction (deterministic); under sequence parallelism the replicated parameters' gradients
// (dgamma, dbeta, db2) are then summed over the group in fp32 before the rounding.
#pragma once

#include <cuda_runtime_api.h>

#include "block/backend.h"
#include "collectives.h"
#include "fp8_kernels.h"
#include "kernels.h"

namespace lnmlp::cuda {

// Partial column sums the passes before have written (db1/db2 NULL when that bias is absent), and
// the workspace for dgamma's and dbeta's (dbeta's NULL for rmsnorm).
struct BackwardPartials {
  float* dgamma;
  float* dbeta;
  const float* db1;
  const float* db2;
};

// dn: this rank's rows of the group-summed dn (ns.rows of them).
inline void finish_backward(const Config& c, const NormSpec& ns, const Chunking& chunk_h, const Chunking& chunk_f,
                            const float* dn, const float* mu, const float* rs, const BackwardPartials& p,
                            const BackwardArgs& a, const GroupSum& group, cudaStream_t st) {
  const DType d = c.dtype;
  const int64_t H = c.hidden, AF = c.act_width();
  norm_backward_dx(d, ns, dn, a.x, a.gamma, mu, rs, a.dx, st);
  norm_param_grads(d, ns, chunk_h, dn, a.x, mu, rs, p.dgamma, p.dbeta, st);
  // A replicated parameter's gradient: the chunks in order, then (sequence parallelism) the
  // group's sum in fp32, rounded once.
  auto replicated = [&](const float* partials, void* out) {
    if (group.buffer == nullptr) {
      reduce_partials(d, chunk_h.chunks, H, partials, out, st);
      return;
    }
    reduce_partials(DType::F32, chunk_h.chunks, H, partials, group.buffer, st);
    group.comm->all_reduce_sum(group.buffer, group.buffer, H, CommType::F32, st);
    fp8_bias_round(d, group.buffer, 1, H, nullptr, out, st);
  };
  replicated(p.dgamma, a.dgamma);
  if (p.dbeta) replicated(p.dbeta, a.dbeta);
  if (p.db1) reduce_partials(d, chunk_f.chunks, AF, p.db1, a.db1, st);  // b1 is sharded: no group sum
  if (p.db2) replicated(p.db2, a.db2);
}

}  // namespace lnmlp::cuda
