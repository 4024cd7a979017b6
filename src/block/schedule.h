// THE block schedule: the steps of one forward and one backward of the feed-forward block
// (docs/design.md, sections 1-4), written once for every backend, FP8 recipe, remat policy and
// sharding, over the primitives of an Exec (exec.h).
//
//   forward:  norm -> ln | GEMM1 (+ b1) -> h | act -> a | GEMM2 (+ b2) -> y
//   backward: what forward did not save, recomputed (norm, GEMM1, act) | dy: db2 | dact = dy W2^T
//             | dW2 = a^T dy | dh = dact * act'(h), db1 | dn = dh W1^T | dW1 = ln^T dh
//             | norm backward -> dx, dgamma, dbeta
//
// Saving (the remat policy, plan/layout.h): forward writes the statistics, ln, h and a into the
// saved buffer as the policy says; under an FP8 recipe ln and a are saved as the columnwise codes
// their weight-gradient GEMMs read, with the per-tensor scales forward used, so that backward's
// operands are forward's bits.
//
// Quantization (FP8 recipes, plan/fp8_recipe.h): each GEMM operand is one quantizer's tensor;
// per-tensor recipes measure its amax (max-reduced over a sharded group), take the scale from
// delayed scaling's state or from the amax, and delayed scaling records the amaxes after the pass;
// backward re-quantizes forward's tensors with forward's scales.
//
// Sharding (docs/design.md, "Sharding"): W1 column- and W2 row-parallel, so GEMM2's fp32 partial sums are
// all-reduced (reduce-scattered to this rank's rows under sequence parallelism) before b2, and dn
// likewise before norm backward. Under sequence parallelism the norm runs on this rank's rows and
// its output is all-gathered (as FP8 codes under a per-tensor recipe, whose scale is the group's;
// blocked recipes gather fp32 and quantize the whole, since blocks may span ranks), dy is
// all-gathered, and the replicated parameters' gradients (dgamma, dbeta, db2) are summed over
// the group.
//
// Over a sizing Workspace (workspace.h) the same code runs without running anything and counts
// the plan's workspace.
#pragma once

#include "exec.h"
#include "plan/call_args.h"
#include "plan/config.h"
#include "plan/layout.h"
#include "weight_copies.h"
#include "workspace.h"

namespace lnmlp::block {

// One forward / backward of the plan whose (shard's) Config is c, over x, in the workspace ws.
// weights: the plan's kept copies of W1 and W2, which the pass uses where they were made and keeps
// what it makes (NULL: none kept, as while sizing).
void run_forward(Exec& x, const Config& c, const SavedLayout& saved, const ForwardArgs& args, Workspace& ws,
                 WeightCopies* weights);
void run_backward(Exec& x, const Config& c, const SavedLayout& saved, const BackwardArgs& args, Workspace& ws,
                  WeightCopies* weights);

}  // namespace lnmlp::block
