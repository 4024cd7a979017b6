// The CPU backend's kernels are compiled once per x86-64 ISA level (src/CMakeLists.txt: the
// baseline x86-64, x86-64-v3 with AVX2 and FMA, x86-64-v4 with AVX-512) and the best level the
// CPU has is chosen at plan creation (isa_dispatch.cpp), so that a default build runs on any x86-64
// CPU at the speed of its vector units. Each level's code lives in its own inline namespace
// (LNMLP_CPU_ISA, set by the build; `portable` otherwise): its templates and inline functions then
// have names of their own, and the linker cannot hand one level's copy of them to another
// level's caller (which would run AVX-512 code on a CPU without it). Every header whose inline code
// runs in the kernels opens `namespace lnmlp::cpu { inline namespace LNMLP_CPU_ISA {`; the host
// loops of src/numerics/ are always inlined for the same reason (LNMLP_HOST_INLINE).
#pragma once

#ifndef LNMLP_CPU_ISA
#define LNMLP_CPU_ISA portable
#endif

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {}
}  // namespace lnmlp::cpu
