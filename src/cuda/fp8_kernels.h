// The CUDA backend's FP8 kernels (docs/fp8.md), as host-callable launchers: amax, per-tensor
// scales and the delayed-scaling update computed on the device (no host synchronization),
// quantization (per tensor with the transposed copy FP8 GEMMs need; in blocks laid out as the CPU
// backend lays them, for the emulated recipes; in blocks laid out as cuBLASLt's block-scaled GEMMs
// read them, for native block scaling), decoding into GEMM operands for the emulated recipes, and
// the GEMM epilogue. Every formula is src/numerics/'s (scaling.h, fp8.h, quantize.h), shared with
// the CPU backend.
//
// Inputs named `x` come in `in` (the plan's I/O dtype for weights and dy; F32 for the backend's
// own fp32 intermediates).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "plan/fp8_recipe.h"

namespace lnmlp::cuda {

// *amax_bits = the bits of max |x| over n elements (NaN-propagating, as numerics::amax_of).
void fp8_amax(DType in, const void* x, int64_t n, uint32_t* amax_bits, cudaStream_t stream);

// The per-tensor scale of a pass, chosen as the CPU backend chooses it: *given (forward's scale,
// for re-quantization in backward) when given is not NULL, else *state_scale (delayed scaling)
// when not NULL, else current scaling's scale from *amax_bits. Writes scale_out[0] = scale,
// scale_out[1] = 1 / scale, and *used_out = scale when used_out is not NULL.
void fp8_per_tensor_scale(const float* given, const float* state_scale, const uint32_t* amax_bits, float fmt_max,
                          bool power_2_scale, float amax_epsilon, float* scale_out, float* used_out,
                          cudaStream_t stream);

// codes [rows, cols] = cast(x * scale[0]) and/or its transpose codes_t [cols, rows] (either may
// be NULL), in one pass.
void fp8_quantize_per_tensor(DType in, Fp8Format f, const void* x, int64_t rows, int64_t cols, const float* scale,
                             uint8_t* codes, uint8_t* codes_t, cudaStream_t stream);

// out [cols, rows] = the transpose of codes [rows, cols].
void fp8_transpose_codes(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* out, cudaStream_t stream);

// Delayed scaling after a pass, for one quantizer's state (state_q[0] the scale, state_q[1 ..]
// the history, newest first): push *amax_bits, reduce, update the scale; the history_len entries
// move in parallel (numerics/scaling.h's history_pushed_entry).
void fp8_delayed_update(float* state_q, int32_t history_len, const uint32_t* amax_bits, bool use_max, float fmt_max,
                        int32_t margin, cudaStream_t stream);

// BLOCK and MXFP8, emulated: codes [rows, cols] and the block scales (fp32 scale_invs, or E8M0
// bytes for mxfp8) in the CPU backend's layouts (plan/fp8_recipe.h QuantKind, numerics/quantize.h).
void fp8_quantize_blocked(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols, uint8_t* codes,
                          void* scales, cudaStream_t stream);

// BLOCK on cuBLASLt's block-scaled GEMMs: the K-major representations of x [rows, cols] for the
// GEMMs that contract its columns (rowwise: codes [rows, cols]) and its rows (columnwise: codes_t
// [cols, rows]), with their fp32 scale_invs in the layouts cuBLASLt reads
// (numerics/quantize.h's gemm_vec128_scale_index, gemm_blk128_scale_index): 1 x 128 blocks along
// the contracted dimension, or 128 x 128 tiles for weights (k.tiles(), both representations in one
// pass). NULL codes: that representation is not made. Needs rows and cols multiples of 16.
void fp8_quantize_blocked_native(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols,
                                 uint8_t* codes, float* scales, uint8_t* codes_t, float* scales_t, cudaStream_t stream);

// The GEMM operand of codes + block scales (emulated recipes): fp8 value times its block's
// scale_inv, in bf16 (f32_out false: exact for power-of-two scales) or fp32.
void fp8_decode_operand(const QuantKind& k, const uint8_t* codes, const void* scales, int64_t rows, int64_t cols,
                        bool f32_out, void* out, cudaStream_t stream);

// out [rows, cols] = rnd_D(acc * alpha + bias[col]) (bias NULL: none), or with accumulate (and no
// bias) rnd_D(out + acc * alpha): the epilogue of a GEMM whose result was staged in fp32, or of a
// collective. alpha is 1, or NVFP4's nvfp4_gemm_alpha(*amax_a, *amax_b) of the two operands' global
// amaxes (device memory) where they are not NULL. acc may be out itself (an fp32 plan's in-place
// bias).
void bias_round(DType d, const float* acc, int64_t rows, int64_t cols, const void* bias, bool accumulate, void* out,
                cudaStream_t stream, const float* amax_a = nullptr, const float* amax_b = nullptr);

}  // namespace lnmlp::cuda
