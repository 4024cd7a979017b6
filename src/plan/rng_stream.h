// The random stream of a backward call's stochastic rounding (NVFP4's dy and dh): the plan's random
// state (lnmlp_plan_set_rng_state) and where the call's tensors lie in the whole tensors the stream
// is drawn over (lnmlp_plan_set_rng_place), for fp8_recipe.h's nvfp4_rounding.
#pragma once

#include <cstdint>

namespace lnmlp {

struct RngStream {
  uint64_t seed = 0, offset = 0;
  // The call's tokens are rows first_token .. of whole_tokens (0: the call's own count), and its F
  // is part ffn_part of ffn_parts equal parts of each activation half (a caller's split; a sharded
  // plan's part is its rank).
  int64_t first_token = 0, whole_tokens = 0;
  int32_t ffn_part = 0, ffn_parts = 1;
};

}  // namespace lnmlp
