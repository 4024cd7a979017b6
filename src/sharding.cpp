#include "sharding.h"

#include "comm.h"
#include "error.h"
#include "fp8_recipe.h"

namespace lnmlp {

void validate_sharding(const Config& c) {
  const Sharding& s = c.shard;
  if (!s.active()) return;
  const int32_t P = s.size;
  if (c.backend != BackendKind::Cpu)
    fail(LNMLP_ERROR_NOT_SUPPORTED, "sharding (group_size ", P,
         ") runs on the CPU backend only in this release; use LNMLP_BACKEND_CPU or group_size 1");
  if (s.comm == nullptr)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "group_size is ", P,
         " but the descriptor has no communicator; call lnmlp_desc_set_communicator");
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
         numerics::kBlockScalingLength, "-element blocks, but ffn / group_size = ", c.ffn, " / ", P, " = ",
         c.ffn / P, "; keep power-of-2 scales (lnmlp_desc_set_scaling_options power_2_scale -1 or 1) or "
         "choose ffn and group_size with ffn / group_size a multiple of ", numerics::kBlockScalingLength);
}

Config shard_config(const Config& global) {
  Config c = global;
  c.ffn = global.ffn / global.shard.size;
  return c;
}

}  // namespace lnmlp
