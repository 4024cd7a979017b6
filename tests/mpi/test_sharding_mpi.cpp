// Sharded plans over MPI (lnmlp_comm_create_mpi), run by CTest under `mpirun -np 2`: every rank
// runs the unsharded plan on the whole problem and its shard of the sharded plan; the shards are
// all-gathered (MPI) and assembled into the group's tensors, which must equal the unsharded plan's
// and the float64 reference's within the dtype's tolerance (tests/tolerances.h), with replicated
// outputs bit-identical on every rank. Exit status 0 when every case passes on every rank.
#include <mpi.h>

#include <cmath>
#include <cstdio>

#include "../sharding_util.h"

namespace lnmlp_test {
namespace {

Buffer gathered(const Buffer& mine, int P) {  // every rank's buffer, same size, in rank order
  std::vector<unsigned char> all(mine.bytes.size() * static_cast<size_t>(P));
  MPI_Allgather(mine.bytes.data(), static_cast<int>(mine.bytes.size()), MPI_BYTE, all.data(),
                static_cast<int>(mine.bytes.size()), MPI_BYTE, MPI_COMM_WORLD);
  Buffer b(mine.dtype, 0);
  b.bytes = std::move(all);
  return b;
}

// rank r's part of an all-gathered buffer
Buffer part(const Buffer& all, int P, int r) {
  Buffer b(all.dtype, 0);
  const size_t n = all.bytes.size() / static_cast<size_t>(P);
  b.bytes.assign(all.bytes.begin() + static_cast<std::ptrdiff_t>(n * r), all.bytes.begin() + static_cast<std::ptrdiff_t>(n * (r + 1)));
  return b;
}

int run_case(lnmlp_ref::Norm norm, std::vector<int> acts, int32_t dtype, bool bias, bool sp, int32_t remat,
             int32_t recipe, lnmlp_comm* comm, int P, int rank, double* worst) {
  const bool fp8 = recipe != LNMLP_RECIPE_NONE;
  // FP8: F/P = 128, whole blocks (tests/tolerances.h, kTolFp8Sharded)
  lnmlp_ref::Config cfg = lnmlp_ref::biased_config(fp8 ? 32 : 12, fp8 ? 64 : 40, fp8 ? 256 : 24, acts, norm);
  cfg.has_bias1 = cfg.has_bias2 = bias;
  const Problem pr = make_problem(cfg, dtype, 1234 + static_cast<uint64_t>(remat));
  RunOptions o;
  o.remat = remat;
  o.backward = remat != LNMLP_REMAT_FORWARD_ONLY;
  o.recipe = recipe;
  o.amax_history_len = 4;
  o.steps = recipe == LNMLP_RECIPE_DELAYED ? 3 : 1;  // delayed: scales from the recorded history
  const RunResult single = run_library(pr, o);
  RunOptions ro = o;
  ro.group_size = P;
  ro.rank = rank;
  ro.sequence_parallel = sp ? 1 : 0;
  ro.comm = comm;
  const RunResult mine = run_library(shard_problem(pr, P, rank, sp), ro);

  std::vector<RunResult> ranks(static_cast<size_t>(P));
  Buffer RunResult::*members[] = {&RunResult::y, &RunResult::dx, &RunResult::dgamma, &RunResult::dbeta,
                                  &RunResult::dw1, &RunResult::db1, &RunResult::dw2, &RunResult::db2};
  for (auto m : members) {
    const Buffer all = gathered(mine.*m, P);
    for (int r = 0; r < P; ++r) ranks[static_cast<size_t>(r)].*m = part(all, P, r);
  }
  std::string mismatch;
  const RunResult got = assemble(pr, ranks, sp, &mismatch);
  // Delayed scaling: every rank's state, bit for bit, is rank 0's.
  Buffer state(LNMLP_DTYPE_F32, 0);
  state.bytes = mine.state;
  const Buffer states = gathered(state, P);
  for (int r = 1; r < P; ++r)
    if (part(states, P, r).bytes != mine.state) mismatch += "FP8 state differs on rank " + std::to_string(r) + "; ";
  int failures = mismatch.empty() ? 0 : 1;
  if (!mismatch.empty() && rank == 0) std::printf("  replicated outputs differ: %s\n", mismatch.c_str());

  const Tolerance tol = fp8 ? kTolFp8Sharded : tolerance_for(dtype), tol_ref = fp8 ? kTolFp8 : tolerance_for(dtype);
  const GroupComparison c = compare_group(pr, got, single, o.backward, tol, tol_ref);
  worst[0] = std::max(worst[0], c.worst_vs_plan);
  worst[1] = std::max(worst[1], c.worst_vs_ref);
  if (!c.failures.empty()) {
    ++failures;
    if (rank == 0) std::printf("  %s\n", c.failures.c_str());
  }
  return failures;
}

}  // namespace
}  // namespace lnmlp_test

int main(int argc, char** argv) {
  using namespace lnmlp_test;
  MPI_Init(&argc, &argv);
  int P = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm world = MPI_COMM_WORLD;
  lnmlp_comm* comm = nullptr;
  if (lnmlp_comm_create_mpi(&world, &comm) != LNMLP_SUCCESS) {
    std::printf("lnmlp_comm_create_mpi: %s\n", lnmlp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int failures = 0, n = 0;
  double worst[3][2] = {}, worst_fp8[5][2] = {};
  for (auto norm : {lnmlp_ref::Norm::LayerNorm, lnmlp_ref::Norm::RmsNorm})
    for (const auto& acts : {std::vector<int>{LNMLP_ACT_GELU}, std::vector<int>{LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}})
      for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
        for (bool bias : {false, true})
          for (bool sp : {false, true}) {
            const int32_t remat = n % 4 == 3 ? LNMLP_REMAT_FORWARD_ONLY : n % 4;
            int f = 0;
            try {
              f = run_case(norm, acts, dtype, bias, sp, remat, LNMLP_RECIPE_NONE, comm, P, rank, worst[dtype]);
            } catch (const std::exception& e) {
              std::printf("rank %d: %s\n", rank, e.what());
              f = 1;
            }
            if (f != 0 && rank == 0)
              std::printf("FAILED: %s %s %s bias=%d sp=%d remat=%d\n", norm == lnmlp_ref::Norm::LayerNorm ? "layernorm" : "rmsnorm",
                          acts.size() == 2 ? "swiglu" : "gelu", dtype_label(dtype), bias, sp, remat);
            failures += f;
            ++n;
          }
  // Every FP8 recipe, with and without sequence parallelism, gated and not (bf16 and f32 alternating).
  static const char* const recipe_names[] = {"none", "delayed", "current", "block", "mxfp8"};
  for (int32_t recipe : {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8})
    for (bool sp : {false, true})
      for (bool gated : {false, true}) {
        const int32_t dtype = n % 2 == 0 ? LNMLP_DTYPE_BF16 : LNMLP_DTYPE_F32;
        int f = 0;
        try {
          f = run_case(gated ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm, swiglu_or_gelu(gated), dtype,
                       true, sp, n % 3, recipe, comm, P, rank, worst_fp8[recipe]);
        } catch (const std::exception& e) {
          std::printf("rank %d: %s\n", rank, e.what());
          f = 1;
        }
        if (f != 0 && rank == 0)
          std::printf("FAILED: %s %s %s sp=%d\n", recipe_names[recipe], gated ? "swiglu" : "gelu", dtype_label(dtype), sp);
        failures += f;
        ++n;
      }
  // A NaN in the last rank's W1 shard reaches every rank's W1 amax (MPI_MAX on floats need not
  // propagate it; lnmlp's MPI communicator max-reduces the amaxes' bits).
  {
    const Problem pr = nan_in_last_shard_problem();
    RunOptions o = nan_in_last_shard_options();
    o.group_size = P;
    o.rank = rank;
    o.comm = comm;
    const RunResult mine = run_library(shard_problem(pr, P, rank, false), o);
    const bool nan = std::isnan(newest_amax(mine.state, LNMLP_QUANTIZER_W1));
    if (!nan) {
      std::printf("FAILED: rank %d's W1 amax is not NaN though the last rank's shard holds a NaN\n", rank);
      ++failures;
    }
    ++n;
  }
  int all = 0;
  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    for (int32_t d : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
      std::printf("%s: largest normalised error vs unsharded plan %.3g, vs float64 reference %.3g\n", dtype_label(d),
                  worst[d][0], worst[d][1]);
    for (int32_t r : {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8})
      std::printf("%s: largest normalised error vs unsharded plan %.3g, vs float64 reference %.3g\n", recipe_names[r],
                  worst_fp8[r][0], worst_fp8[r][1]);
    std::printf("%d cases on %d ranks: %s\n", n, P, all == 0 ? "all passed" : "FAILURES");
  }
  lnmlp_comm_destroy(comm);
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}
