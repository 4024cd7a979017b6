// The CUDA backend: orchestrates the block's passes on one GPU over the plan's device workspace.
// GEMMs go to cuBLASLt (gemm_cublaslt.h); everything else is a kernel of kernels.h.
//
// Data flow per I/O dtype D (every dtype, f16 included, runs its GEMMs natively in D with fp32
// accumulation; the CPU backend widens f16 operands to fp32, which gives the same values):
//   forward:  norm -> ln (D) | GEMM1 + b1 (epilogue) -> h (D) | act -> a (D) | GEMM2 + b2 -> y (D)
//   backward: dy col-sums -> db2 | dact = dy W2^T (fp32) | dW2 = a^T dy | dh = dact * act'(h) (D),
//             db1 col-sums | dn = dh W1^T (fp32) | dW1 = ln^T dh | norm backward -> dx;
//             dgamma, dbeta col-sums
// What the remat policy did not save is recomputed with the same kernels and GEMM algorithms, so
// it has the same bits as forward's.
#pragma once

#include <memory>

#include "block/backend.h"

namespace lnmlp::cuda {

// The saved buffer and attached workspace must be aligned to this (lnmlp_plan_get_alignment).
constexpr int64_t kCudaAlignment = 256;

// Throws lnmlp::Error: NOT_SUPPORTED when cfg.device is not a device of this machine or cuBLASLt
// has no algorithm for a GEMM; BACKEND for CUDA failures.
std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, const SavedLayout& saved);

// Number of CUDA devices; throws NOT_SUPPORTED (naming the CUDA error) when there is no usable
// driver or no device.
int device_count();

}  // namespace lnmlp::cuda
