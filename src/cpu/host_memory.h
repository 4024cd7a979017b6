// Host memory for the CPU backend's workspace and state (lnmlp_plan_get_alignment: 64; the
// regions inside are 256-byte aligned). Out of line, in code compiled for the baseline ISA, like
// every error path of the CPU backend (cpu/isa.h).
#pragma once

#include <cstdint>

namespace lnmlp::cpu {

constexpr int64_t kCpuAlignment = 64;

// Throws LNMLP_ERROR_OUT_OF_MEMORY when the memory cannot be had.
void* allocate_host(int64_t bytes);
void release_host(void* p) noexcept;

}  // namespace lnmlp::cpu
