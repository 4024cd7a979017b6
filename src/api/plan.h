// The opaque handles of the C API.
#pragma once

#include <atomic>
#include <memory>

#include "block/engine.h"
#include "comm/comm.h"
#include "plan/config.h"
#include "plan/fp8_recipe.h"
#include "plan/layout.h"
#include "plan/rng_stream.h"

struct lnmlp_desc {
  lnmlp::Config cfg;
  std::shared_ptr<lnmlp::Communicator> comm;  // cfg.shard.comm's owner
};

struct lnmlp_comm {
  std::shared_ptr<lnmlp::Communicator> impl;
};

struct lnmlp_plan {
  lnmlp::Config cfg;                          // the shard's (sharding.h)
  std::shared_ptr<lnmlp::Communicator> comm;  // cfg.shard.comm's owner
  lnmlp::SavedLayout saved;
  lnmlp::ResolvedRecipe recipe;
  std::unique_ptr<lnmlp::block::Engine> engine;  // what forward and backward run
  int64_t workspace_bytes = 0;
  void* owned_workspace = nullptr;  // allocated by the plan (unless external workspace)
  void* workspace = nullptr;        // what execution uses: owned or attached
  float* fp8_state = nullptr;       // the plan's own quantizer state in the engine's memory (fp8_state.h), DELAYED only
  float* attached_fp8_state = nullptr;  // the caller's, in use instead when attached (lnmlp_plan_attach_fp8_state)
  // The random stream of stochastic rounding (lnmlp_plan_set_rng_state, _place): each backward that
  // draws uses it and then moves its offset on by one.
  lnmlp::RngStream rng;

  // The saved and deferred buffers of a call with `tokens` rows (0 .. cfg.rows()).
  lnmlp::SavedLayout saved_of_call(int64_t tokens) const {
    return tokens == cfg.rows() ? saved : lnmlp::make_saved_layout(cfg.for_call(tokens));
  }
  int64_t deferred_bytes(int64_t tokens) const {
    return lnmlp::make_deferred_layout(cfg.for_call(tokens), saved_of_call(tokens)).total_bytes;
  }

  // The state forward, backward and the state functions use when a call passes none.
  float* state() const { return attached_fp8_state != nullptr ? attached_fp8_state : fp8_state; }
  std::atomic<bool> busy{false};    // set while a thread runs forward/backward or attaches

  ~lnmlp_plan() {
    if (owned_workspace != nullptr) engine->release(owned_workspace);
    if (fp8_state != nullptr) engine->release(fp8_state);
  }
};
