// Marks functions that compile for both the host (CPU backend) and the device (CUDA backend), so
// every formula in src/numerics/ exists exactly once.
#pragma once

#if defined(__CUDACC__)
#define LNMLP_HD __host__ __device__ __forceinline__
#else
#define LNMLP_HD inline __attribute__((always_inline))
#endif

// Host-only functions of src/numerics/ with loops (the reference quantizers): always inlined where
// they are used, so that code compiled for one ISA level (the CPU backend's, src/cpu/isa.h) never
// calls another level's out-of-line copy of them.
#define LNMLP_HOST_INLINE inline __attribute__((always_inline))
