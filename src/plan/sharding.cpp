#include "sharding.h"

#include "comm/comm.h"
#include "common/error.h"
#include "fp8_recipe.h"

namespace lnmlp {

void validate_sharding(const Config& c) {
  const Sharding& s = c.shard;
  const int32_t P = s.size;
  // The communicator must suit the backend: NCCL runs on the GPU, MPI and callbacks on the host.
  const bool cuda = c.backend == BackendKind::Cuda;
  const bool nccl = s.comm != nullptr && s.comm->kind() == CommKind::Nccl;
  if (!cuda && nccl)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the descriptor's communicator is ", comm_kind_name(CommKind::Nccl),
         ", which exchanges GPU buffers; the CPU backend shards over an MPI or callback communicator "
         "(lnmlp_comm_create_mpi, lnmlp_comm_create_callbacks), or select LNMLP_BACKEND_CUDA");
  if (cuda && s.active() && s.comm != nullptr && !nccl)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the CUDA backend shards over an NCCL communicator, but the descriptor's is ",
         comm_kind_name(s.comm->kind()),
         "; create one with lnmlp_comm_create_nccl from your ncclComm_t, or use "
         "LNMLP_BACKEND_CPU");
  // An NCCL communicator is used even by a one-rank plan, so its size must agree then too.
  if (!s.active() && !nccl) return;
  if (s.comm == nullptr)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "group_size is ", P,
         " but the descriptor has no communicator; call lnmlp_desc_set_communicator",
         cuda ? " with an NCCL communicator (lnmlp_comm_create_nccl)" : "");
  if (s.comm->size() != P || s.comm->rank() != s.rank)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the communicator is rank ", s.comm->rank(), " of ", s.comm->size(),
         " but lnmlp_desc_set_sharding set rank ", s.rank, " of ", P, "; make them agree");
  if (c.ffn % P != 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "ffn (", c.ffn, ") must be divisible by group_size (", P,
         ") to split W1's columns and W2's rows; change ffn or group_size");
  if (s.sequence_parallel && c.tokens % P != 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "under sequence parallelism tokens (", c.tokens,
         ", the group's total) must be divisible by group_size (", P, "); change tokens or group_size");
  // Blocked FP8 recipes scale per block, and a shard whose F/P is not a whole number of blocks
  // groups W1's, W2's, act_out's and dh's elements into other blocks than the unsharded plan.
  // With power-of-2 scales (MXFP8's E8M0 always, BLOCK's default) that changes nothing but the
  // subnormal range: scaling by 2^k commutes with FP8 rounding, so the group still equals the
  // unsharded plan (tests/test_sharding.cpp, ShardingFp8Blocked: at most ~2e-3 of a tensor's max).
  // BLOCK with arbitrary scales moves each element's rounding grid with its block's amax: the
  // group then differs from the unsharded plan by a whole FP8 rounding (measured 0.03-0.04 of a
  // tensor's max, kTolFp8Sharded's bound itself), so that case is refused.
  const ResolvedRecipe r = resolve_recipe(c.fp8);
  if (r.recipe == Recipe::Block && !r.power_2_scale && (c.ffn / P) % numerics::kBlockScalingLength != 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the BLOCK recipe without power-of-2 scales shards only whole ",
         numerics::kBlockScalingLength, "-element blocks, but ffn / group_size = ", c.ffn, " / ", P, " = ", c.ffn / P,
         "; keep power-of-2 scales (lnmlp_desc_set_scaling_options power_2_scale -1 or 1) or "
         "choose ffn and group_size with ffn / group_size a multiple of ",
         numerics::kBlockScalingLength);
  // NVFP4's E4M3 block scales are not powers of 2 either; its 1x16 blocks and 16x16 weight tiles
  // (and its random streams' halves, fp8_recipe.h's nvfp4_rounding) need whole blocks per shard.
  if (r.nvfp4() && (c.ffn / P) % numerics::kNvfp4BlockLength != 0)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "LNMLP_RECIPE_NVFP4 shards only whole ", numerics::kNvfp4BlockLength,
         "-element blocks, but ffn / group_size = ", c.ffn, " / ", P, " = ", c.ffn / P,
         "; choose ffn and group_size with ffn / group_size a multiple of ", numerics::kNvfp4BlockLength);
}

Config shard_config(const Config& global) {
  Config c = global;
  c.ffn = global.ffn / global.shard.size;
  // A one-rank group over callbacks or MPI runs no collectives (an NCCL one does: see sharded()).
  const bool nccl = c.shard.comm != nullptr && c.shard.comm->kind() == CommKind::Nccl;
  if (!c.shard.active() && !nccl) c.shard.comm = nullptr;
  return c;
}

}  // namespace lnmlp
