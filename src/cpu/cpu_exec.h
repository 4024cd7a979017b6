// The CPU backend: the block schedule's primitives (block/exec.h) on the host. GEMMs go to the
// GEMM library (gemm.h, as gemm_plan.h says); everything else is one of the row kernels of
// kernels.h or the FP8 layouts of fp8_operands.h, split over the plan's threads (parallel.h).
// cpu_exec.cpp is compiled once per x86-64 ISA level (isa.h); make_cpu_exec runs the best one.
#pragma once

#include <memory>

#include "block/exec.h"
#include "plan/config.h"

namespace lnmlp::cpu {

std::unique_ptr<block::Exec> make_cpu_exec(const Config& cfg);

// The ISA level the CPU backend's kernels run at and how it was chosen, for lnmlp_get_build_info.
const char* cpu_kernels_description();

}  // namespace lnmlp::cpu
