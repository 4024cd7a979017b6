// The CUDA backend's NVFP4 kernels (docs/fp8.md, "NVFP4"), as host-callable launchers: the global
// amaxes, the quantization of a tensor into one representation (E2M1 codes, the scale region with
// its fp32 global amax, and the decoded GEMM operand e2m1 * s_block in the same pass), and the
// decoding of saved codes. The arithmetic is numerics/quantize_nvfp4.h's and numerics/hadamard.h's
// per 1x16 block, the layouts those of the CPU backend (src/cpu/nvfp4_operands.h), so that both
// backends make and save the same bits. H100/H200 have no FP4 tensor cores: the GEMMs multiply
// the decoded operands in bf16 and the epilogue applies nvfp4_gemm_alpha (fp8_kernels.h's
// bias_round), the contract of numerics/quantize_nvfp4.h.
//
// `x` comes in `in` (the I/O dtype for weights and dy, F32 for the backend's intermediates); a
// scale region is QuantKind::scale_region_bytes: the fp32 global amax, then the E4M3 scales.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "numerics/quantize_nvfp4.h"
#include "plan/fp8_recipe.h"

namespace lnmlp::cuda {

// The fp32 global amax at the front of a scale region (device memory).
inline float* nvfp4_region_amax(void* scale_region) { return static_cast<float*>(scale_region); }
inline const float* nvfp4_region_amax(const void* scale_region) { return static_cast<const float*>(scale_region); }

// *amax_bits = the bits of the amax of the matrix k quantizes for x [rows, cols]: x's own, or
// for a transposed kind with the Hadamard transform its columns transformed in whole blocks of 16
// rows (a partial last block as it is).
void nvfp4_amax(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols, uint32_t* amax_bits,
                cudaStream_t stream);

// Quantizes x [rows, cols] for k into codes and the scale region, rounding as `rounding` says,
// with the global amax *given_amax_bits where that is not NULL (a group's) else the quantized
// matrix's own, and where op is not NULL also into the GEMM operand op [rows, cols] (fp32 when
// f32_op, else bf16). A transposed kind needs `transposed`, rows * cols floats of device memory.
void nvfp4_quantize(DType in, const QuantKind& k, const void* x, int64_t rows, int64_t cols,
                    const numerics::Nvfp4Rounding& rounding, const uint32_t* given_amax_bits, uint8_t* codes,
                    void* scale_region, float* transposed, bool f32_op, void* op, cudaStream_t stream);

// Decodes a representation (codes and scale region as nvfp4_quantize made them) into the GEMM
// operand out [rows, cols]: e2m1 * s_block, fp32 when f32_out, else bf16.
void nvfp4_decode_operand(const QuantKind& k, const uint8_t* codes, const void* scale_region, int64_t rows,
                          int64_t cols, bool f32_out, void* out, cudaStream_t stream);

// The block scales of a representation (its scale region as nvfp4_quantize made it, for x [rows,
// cols]) in cuBLASLt's tiled layout for its FP4 GEMMs, into out (numerics'
// nvfp4_gemm_scale_bytes of the matrix k quantizes, padding zeroed).
void nvfp4_gemm_scales(const QuantKind& k, const void* scale_region, int64_t rows, int64_t cols, uint8_t* out,
                       cudaStream_t stream);

}  // namespace lnmlp::cuda
