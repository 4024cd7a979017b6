// What a descriptor holds and a plan is built from: the whole configuration of one block.
#pragma once

#include <cstdint>

#include "numerics/activation.h"
#include "numerics/dtype.h"
#include "numerics/norm.h"

namespace lnmlp {

using numerics::Act;
using numerics::ActParams;
using numerics::DType;
using numerics::Norm;

// Values match the public LNMLP_REMAT_* constants.
enum class Remat : int32_t { SaveAll = 0, SaveFfn1 = 1, SaveStats = 2, ForwardOnly = 3 };

// Values match the public LNMLP_RECIPE_* constants.
enum class Recipe : int32_t { None = 0, Delayed = 1, Current = 2, Block = 3, Mxfp8 = 4, Nvfp4 = 5 };
// Values match LNMLP_FP8_FORMAT_*; Default resolves per recipe (fp8_recipe.h).
enum class Fp8Mix : int32_t { Default = -1, Hybrid = 0, E4M3 = 1 };

// Delayed scaling's longest amax history.
constexpr int32_t kMaxAmaxHistory = 65536;
// The most CPU threads a plan may ask for (far above any machine's cores; OpenMP counts in int).
constexpr int32_t kMaxThreads = 65536;

// The FP8 recipe and its options as the user set them (defaults: TransformerEngine's).
struct Fp8Options {
  Recipe recipe = Recipe::None;
  Fp8Mix format = Fp8Mix::Default;
  int32_t margin = 0;               // delayed
  int32_t amax_history_len = 1024;  // delayed
  bool amax_max = true;             // delayed: true = "max", false = "most_recent"
  int32_t power_2_scale = -1;       // current, block: -1 = the recipe's default
  float amax_epsilon = 0.0f;        // current, block
  // nvfp4 (TransformerEngine's NVFP4BlockScaling, whose disable_* options are these negated):
  bool nvfp4_rht = true;                  // random Hadamard transform of the wgrad GEMMs' inputs
  bool nvfp4_stochastic_rounding = true;  // of the gradients dy and dh
  bool nvfp4_2d_weights = true;           // 16x16 weight tiles (else 1x16 blocks like the rest)
};

class Communicator;  // comm.h

// Tensor-parallel sharding (docs/design.md, "Sharding", lnmlp_desc_set_sharding).
struct Sharding {
  int32_t size = 1;
  int32_t rank = 0;
  bool sequence_parallel = false;
  Communicator* comm = nullptr;  // kept alive by the descriptor / plan that holds this Config
  bool active() const { return size > 1; }
};

// Values match the public LNMLP_BACKEND_* constants.
enum class BackendKind : int32_t { Cpu = 0, Cuda = 1 };

// Values match the public LNMLP_WEIGHT_LAYOUT_* constants: W1 [H, A*F] and W2 [F, H] (in x out),
// or W1 [A*F, H] and W2 [H, F] (out x in, PyTorch's).
enum class WeightLayout : int32_t { InOut = 0, OutIn = 1 };

// A descriptor's Config holds the group's (global) shape; a plan's holds its shard's
// (shard_config in sharding.h): ffn is then F/P, while tokens stays the group's T (the rows of
// the GEMMs, which see every token) and rows() gives the rows of x, y, dy and dx.
struct Config {
  int64_t tokens = 0;  // 0 = not set yet
  int64_t hidden = 0;
  int64_t ffn = 0;
  Norm norm = Norm::LayerNorm;
  bool zero_centered_gamma = false;
  float epsilon = 1e-6f;
  int32_t num_acts = 1;
  Act acts[2] = {Act::Relu, Act::Linear};
  ActParams act_params;
  bool has_bias1 = false;
  bool has_bias2 = false;
  DType dtype = DType::F32;
  Remat remat = Remat::SaveAll;
  // Forward also writes the norm output in D to the saved buffer (lnmlp_desc_set_norm_output),
  // whatever the policy and recipe: TransformerEngine's return_layernorm_output.
  bool norm_output = false;
  BackendKind backend = BackendKind::Cpu;
  int32_t device = 0;
  int32_t num_threads = 0;  // CPU: 0 = every core
  bool external_workspace = false;
  // The parameter gradients dW1, db1, dW2, db2 (lnmlp_desc_set_weight_gradients): added into the
  // caller's buffers instead of overwriting them, and their dtype (-1: the I/O dtype).
  bool accumulate_grads = false;
  int32_t param_grad_dtype = -1;
  // The dtype of W1 and W2 (lnmlp_desc_set_weight_dtype; -1: the I/O dtype). fp32 only under an
  // FP8 recipe, whose quantizers read any dtype.
  int32_t weight_dtype = -1;
  WeightLayout weight_layout = WeightLayout::InOut;
  // GEMM math faster than exact fp32 accumulation (lnmlp_desc_set_gemm_math; the CUDA backend's):
  // fast accumulation in the per-tensor FP8 forward GEMMs, TF32 tensor cores for fp32 GEMMs.
  bool fp8_fast_accumulation = false;
  bool allow_tf32 = false;
  Fp8Options fp8;
  Sharding shard;
  // Token counts besides the maximum whose GEMMs the plan makes at creation
  // (lnmlp_desc_set_prepared_tokens): a call's counts (rows of x, as lnmlp_plan_forward's tokens),
  // distinct and ascending; checked against rows() at plan creation.
  static constexpr int32_t kMaxPreparedCounts = 32;
  int32_t num_prepared = 0;
  int64_t prepared_rows[kMaxPreparedCounts] = {};

  // Rows of x, y, dy, dx and of the norm statistics: T, or T/P under sequence parallelism.
  int64_t rows() const { return shard.sequence_parallel ? tokens / shard.size : tokens; }
  // A plan's Config for a call with `call_rows` rows of x (0 .. rows()): the Config of a plan made
  // for that many tokens, so the call computes what that plan computes.
  Config for_call(int64_t call_rows) const {
    Config c = *this;
    c.tokens = group_tokens(call_rows);
    return c;
  }
  // The group's token count of a call with `call_rows` rows of x: the inverse of rows(). (Small, so
  // it inlines in each CPU level's code, as check_cpu_levels requires; for_call copies the Config.)
  int64_t group_tokens(int64_t call_rows) const { return shard.sequence_parallel ? call_rows * shard.size : call_rows; }
  // The group's token count of the i-th prepared count.
  int64_t prepared_tokens(int32_t i) const { return group_tokens(prepared_rows[i]); }
  // Whether the plan runs the collectives of docs/design.md, "Sharding". A plan's Config keeps a
  // communicator only when it shards (shard_config): a group of P > 1, or an NCCL communicator,
  // which a CUDA plan uses even at P = 1.
  bool sharded() const { return shard.comm != nullptr; }
  bool sequence_parallel() const { return sharded() && shard.sequence_parallel; }
  bool gated() const { return num_acts == 2; }
  int64_t act_width() const { return num_acts * ffn; }  // A*F, the GEMM1 output width
  bool has_beta() const { return norm == Norm::LayerNorm; }
  bool quantized() const { return fp8.recipe != Recipe::None; }
  // The dtype of W1 and W2.
  DType weight_type() const { return weight_dtype < 0 ? dtype : static_cast<DType>(weight_dtype); }
  // W1 and W2 (and their gradients) stored out x in (lnmlp_desc_set_weight_layout).
  bool weights_out_in() const { return weight_layout == WeightLayout::OutIn; }
  // The dtype of dW1, db1, dW2 and db2.
  DType param_grad_type() const { return param_grad_dtype < 0 ? dtype : static_cast<DType>(param_grad_dtype); }
};

// Checks the whole configuration; throws lnmlp::Error with a message naming what to change.
void validate_config(const Config& cfg);
// Checks the prepared token counts against a call's (after validate_sharding: rows() needs the group).
void validate_prepared_tokens(const Config& cfg);

}  // namespace lnmlp
