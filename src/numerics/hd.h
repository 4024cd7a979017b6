// Marks functions that compile for both the host (CPU backend) and the device (CUDA backend), so
// every formula in src/numerics/ exists exactly once.
#pragma once

#if defined(__CUDACC__)
#define LNMLP_HD __host__ __device__ __forceinline__
#else
#define LNMLP_HD inline __attribute__((always_inline))
#endif
