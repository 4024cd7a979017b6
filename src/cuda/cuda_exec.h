// The CUDA backend: the block schedule's primitives (block/exec.h) on one GPU, enqueued on the
// caller's stream without host synchronization (capturable into a CUDA graph). GEMMs go to
// cuBLASLt (gemm_cublaslt.h); everything else is a kernel of kernels.h or fp8_kernels.h, whose
// formulas are src/numerics/'s.
//
// Operands: plain ones are the tensors themselves (every dtype, f16 included, multiplies natively
// with fp32 accumulation). Per-tensor FP8 recipes (delayed, current) run on FP8 tensor cores:
// codes in the K-major orientation each GEMM needs (rowwise, and the transposed copy as the
// columnwise representation, written in the same pass) with their scale_invs in device memory.
// Blocked recipes (block, mxfp8, nvfp4) are emulated exactly as the CPU backend does: quantized in
// the same layouts (the same bits), decoded into bf16 operands (fp32 for block scales that are not
// powers of two) and multiplied with fp32 accumulation -- except BLOCK on Hopper's block-scaled
// FP8 GEMMs and NVFP4 on Blackwell's FP4 GEMMs, which read the codes themselves with their block
// scales in cuBLASLt's layouts. FP8 GEMMs whose result is in the I/O dtype stage it in fp32 and
// round it (with the bias) in a second kernel.
#pragma once

#include <memory>

#include "block/exec.h"
#include "plan/config.h"

namespace lnmlp::cuda {

// The saved buffer and attached workspace must be aligned to this (lnmlp_plan_get_alignment):
// 128, what XLA:GPU guarantees for the buffers it allocates, so that JAX's saved and workspace
// buffers serve as they are. Nothing in the plan needs more, except cuBLASLt's workspace, which
// wants 256 and is realigned inside the plan's scratch (kGemmWorkspaceAlignment in cuda_exec.cpp).
constexpr int64_t kCudaAlignment = 128;

// Throws lnmlp::Error: NOT_SUPPORTED when cfg.device is not a device of this machine or cuBLASLt
// has no algorithm for a GEMM; BACKEND for CUDA failures.
std::unique_ptr<block::Exec> make_cuda_exec(const Config& cfg);

// How `recipe` runs on `device` (lnmlp_query_support's answer): LNMLP_SUPPORTED where its GEMMs
// run on FP8 tensor cores (per-tensor recipes from sm_89; BLOCK's block-scaled GEMMs on sm_90 with
// cuBLASLt 12.9, for shapes whose dimensions are multiples of 16), LNMLP_SUPPORTED_EMULATED where
// they are emulated exactly (MXFP8 everywhere; BLOCK elsewhere), LNMLP_UNSUPPORTED where they
// cannot run (per-tensor recipes below sm_89).
int32_t fp8_support(Recipe recipe, int device);

}  // namespace lnmlp::cuda
