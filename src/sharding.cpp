#include "sharding.h"

#include "comm.h"
#include "error.h"

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
}

Config shard_config(const Config& global) {
  Config c = global;
  c.ffn = global.ffn / global.shard.size;
  return c;
}

}  // namespace lnmlp
