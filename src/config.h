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

// Values match the public LNMLP_BACKEND_* constants.
enum class BackendKind : int32_t { Cpu = 0, Cuda = 1 };

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
  BackendKind backend = BackendKind::Cpu;
  int32_t device = 0;
  int32_t num_threads = 0;  // CPU: 0 = every core
  bool external_workspace = false;

  bool gated() const { return num_acts == 2; }
  int64_t act_width() const { return num_acts * ffn; }  // A*F, the GEMM1 output width
  bool has_beta() const { return norm == Norm::LayerNorm; }
};

// Checks the whole configuration; throws lnmlp::Error with a message naming what to change.
void validate_config(const Config& cfg);

}  // namespace lnmlp
