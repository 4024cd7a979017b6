// The end of backward that the CUDA backend's unquantized and FP8 paths share: norm backward from
// dn (dx per row, dgamma/dbeta partial column sums) and the final, in-order pass of every column
// reduction (deterministic).
#pragma once

#include <cuda_runtime_api.h>

#include "../backend.h"
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

inline void finish_backward(const Config& c, const NormSpec& ns, const Chunking& chunk_h, const Chunking& chunk_f,
                            const float* dn, const float* mu, const float* rs, const BackwardPartials& p,
                            const BackwardArgs& a, cudaStream_t st) {
  const DType d = c.dtype;
  const int64_t H = c.hidden, AF = c.act_width();
  norm_backward_dx(d, ns, dn, a.x, a.gamma, mu, rs, a.dx, st);
  norm_param_grads(d, ns, chunk_h, dn, a.x, mu, rs, p.dgamma, p.dbeta, st);
  reduce_partials(d, chunk_h.chunks, H, p.dgamma, a.dgamma, st);
  if (p.dbeta) reduce_partials(d, chunk_h.chunks, H, p.dbeta, a.dbeta, st);
  if (p.db1) reduce_partials(d, chunk_f.chunks, AF, p.db1, a.db1, st);
  if (p.db2) reduce_partials(d, chunk_h.chunks, H, p.db2, a.db2, st);
}

}  // namespace lnmlp::cuda
