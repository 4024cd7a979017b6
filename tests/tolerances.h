// Per-dtype tolerances of the library against the float64 reference, in ONE place.
//
// The metric (normalised max error, robust to cancellation): for each output tensor,
//
//     max_i ( |got_i - ref_i| - allow_i )  <=  atol + rtol * max_i |ref_i|
//
// i.e. every element's error is measured against the scale of the whole tensor, not against its
// own value, so an element that is the small difference of large terms (a gradient summed over
// tokens, an output near zero) is not held to an impossible relative standard. allow_i is 0 except
// where the reference's GEMM1 output lies so close to a kink of the activation (relu at 0, the
// clamped SwiGLU's limits) that the library's rounded value may fall on the other side of it; there
// the derivative legitimately differs by the kink's jump, and allow_i bounds that difference (see
// kink_allowance in test_numerics.cpp). The reported "normalised error" is the left side divided by
// max_i |ref_i|.
//
// The reference gets exactly the same (rounded) inputs as the library, so input rounding is not in
// these numbers; only the library's arithmetic and its intermediate roundings are.
#pragma once

#include "lnmlp.h"

namespace lnmlp_test {

struct Tolerance {
  double atol;  // absolute floor, for tensors whose reference is (almost) all zero
  double rtol;  // relative to max |ref| over the tensor
};

// float32: everything stays in fp32; GEMMs accumulate K (H, A*F or T) fp32 products, whose
// rounding error grows like sqrt(K) * 2^-24 in practice (K * 2^-24 worst case), and the chain
// norm -> GEMM1 -> act -> GEMM2 -> back again compounds a handful of those. At K <= 160 that is a
// few 1e-6 at most (observed: below 1e-6); 1e-5 leaves margin for other GEMM kernels (other
// instruction sets sum in other orders) without hiding a wrong formula (errors ~1e-2 and up).
constexpr Tolerance kTolF32{1e-6, 1e-5};

// bfloat16: 8-bit significand (7 stored), unit roundoff 2^-9, i.e. a relative error up to
// ~2^-8 (0.4%) per rounding at worst when consecutive roundings add up. Besides the outputs, the
// intermediates ln_out, h (GEMM1 output), act_out and dh (the GEMM1 gradient operand) are rounded
// to bf16, and each rounding feeds the next GEMM, so an output carries 3-5 such roundings (plus
// the derivative of the activation amplifying h's rounding). 2^-5 (~3%) is 8 roundings' worth.
constexpr Tolerance kTolBF16{1e-4, 0.03125};

// float16: 11-bit significand (10 stored), unit roundoff 2^-12; the same intermediates are rounded
// to f16 (GEMMs run in fp32 on the f16 values), so 8x tighter than bf16.
constexpr Tolerance kTolF16{1e-5, 0.004};

// FP8 recipes against the UNQUANTIZED float64 reference. E4M3 keeps 3 mantissa bits (unit
// roundoff 2^-4, 6.25%), E5M2 2 bits (2^-3, 12.5%, the gradients under HYBRID); each GEMM reads two
// quantized operands, and with per-tensor scales small elements fall into the subnormal range and
// lose more. A float64 simulation of per-tensor E4M3 quantization alone gives a normalised error of
// 0.068 on y for tests/test_fp8_plan.cpp's problem, and gradients pass through two quantized GEMMs.
// So 0.15 (about 2^-3 relative to the tensor's max) is the bound; it is still ~6x below what a
// wrong scale (a factor of 2 or more) gives. The exact check of the FP8 arithmetic is the
// simulation of each recipe in bindings/python/tests/test_fp8_recipes.py (tight tolerance).
constexpr Tolerance kTolFp8{1e-3, 0.15};

// NVFP4 against the UNQUANTIZED float64 reference: E2M1 keeps 1 mantissa bit (between 4 and 6 the
// step is a third of the value; unit roundoff 2^-2 at best), under an E4M3 block scale that rounds
// too. A float64 simulation of the recipe (bindings/python/tests/test_nvfp4_recipe.py, whose exact
// check of NVFP4's arithmetic this is not) puts y at 0.14-0.24 of its max from the reference, the
// gradients a little further; 0.5 bounds that and still fails a wrong scale (a factor of 2: ~1).
constexpr Tolerance kTolFp4{1e-2, 0.5};

inline Tolerance tolerance_for(int32_t dtype) {
  switch (dtype) {
    case LNMLP_DTYPE_BF16: return kTolBF16;
    case LNMLP_DTYPE_F16: return kTolF16;
    default: return kTolF32;
  }
}

// The CUDA backend against the CPU backend on identical inputs (tests/gpu). Each backend is within
// tolerance_for(dtype) of the float64 reference, so their difference is within twice that; the
// GPU-specific sources of difference are all inside that budget: other GEMM summation orders
// (cuBLASLt's split-K and tile orders), the device's expf/tanhf (a few ulp of fp32, far below any
// I/O rounding), f16 GEMMs run natively on f16 operands rather than on fp32 copies of the same f16
// values (identical products, fp32 accumulation either way), and intermediates (ln_out, h, act, dh)
// that may round to the neighbouring value of the dtype when the fp32 sums behind them differ in the
// last bits. No other widening is needed; it is the only GPU tolerance, here in one place.
inline Tolerance gpu_vs_cpu_tolerance(int32_t dtype) {
  const Tolerance t = tolerance_for(dtype);
  return {2.0 * t.atol, 2.0 * t.rtol};
}

// FP8 recipes, CUDA backend against CPU backend. Both quantize with the same formulas (shared
// src/numerics) to the same codes, and the products of two FP8 values are exact in fp32 on both.
// The sums are not alike: the CPU accumulates every product in fp32, while Hopper's FP8 tensor
// cores accumulate a run of products in a narrower accumulator (about 2^-14 relative, measured by
// others on H100/H800) before cuBLASLt promotes the partial sum into fp32 (with FAST_ACCUM off,
// as lnmlp sets it, every few K-blocks), and the two sum in different orders. So a GEMM result
// differs between the backends by up to ~1e-4 relative, and an intermediate (h, act_out, dh)
// that lies at an FP8 rounding boundary can take the neighbouring code on one backend (one E5M2
// step is 25% of the value, one E4M3 step 12.5%), in a few elements; the Python simulation tests
// measured such flips at up to 1.4e-2 of a tensor's max. 0.04 bounds a handful of them and is
// still 4x below the error a wrong scale or a mis-oriented block gives (0.15 and up,
// tests/test_fp8_plan.cpp).
constexpr Tolerance kTolFp8Backends{1e-3, 0.04};

// NVFP4, CUDA backend against CPU backend: the same codes, scales and random bits from the same
// inputs (the quantizers are checked bit for bit in tests/gpu/test_cuda_fp8_kernels.cpp), the
// GEMMs summing decoded operands in different orders. As for FP8 an intermediate at a rounding
// boundary can take the neighbouring code on one backend, but an E2M1 step is up to a third of the
// value (4 to 6), not an eighth, and an element that is its block's max moves the block's E4M3
// scale and so all 16 codes. Measured in the CUDA emulation (tests/gpu/test_cuda_fp8.cpp, which
// prints each case's worst; nvfp4_bf16_gelu_T256_H128_F192): two rows of y, 0.032 of its max
// (lnmlp_emulated_gpu_tests --gtest_filter='*CudaFp8VsCpu.Forward*nvfp4*'). 3x the FP8 bound, by the ratio
// of the steps; a wrong global scale or alpha (a factor of 2 and up) gives 0.5 and more.
constexpr Tolerance kTolFp4Backends{1e-3, 0.12};

// An fp32 plan with TF32 GEMMs (LNMLP_GEMM_MATH_TF32) against the CPU backend (exact fp32). TF32
// tensor cores read each fp32 input with an 11-bit significand (unit roundoff 2^-11, ~4.9e-4) and
// accumulate in fp32; an output of forward + backward has passed through up to four GEMMs, each
// rounding both of its inputs, and the norm's backward and the activation's derivative carry those
// errors on: 16 roundings' worth, 2^-7 (~0.8%), bounds it. A GEMM that ignored the flag is caught
// by comparing bits with the exact plan, not by this bound; a wrong formula gives ~1e-2 and up.
constexpr Tolerance kTolTf32{1e-5, 0.0078125};

// Delayed scaling's recorded amaxes of the tensors the block computes (act_out, and dh, both
// outputs of an FP8 GEMM and an activation), CUDA against CPU, relative. Each is the max over a
// tensor of values whose GEMM sums differ between the backends as above: by up to ~1e-4 relative
// from the tensor cores' narrower accumulation between promotions (2^-14 per run of products,
// growing with the number of runs summed), and the activation (and its derivative for dh) carries
// that difference on, amplified by up to its slope. 1e-3 covers it with margin; a wrong scale or
// a missed element changes an amax by far more (a factor of 2, or a different element's value).
// The amaxes of the inputs (w1, w2, dy) come from the same bits on both backends and must be
// equal; ln_out's (computed before any GEMM) differs only by the order of its row sums, far inside
// this bound.
constexpr double kFp8ComputedAmaxRtol = 1e-3;

// FP8 recipes, a sharded group (tests/test_sharding.cpp) against the unsharded plan. Every rank
// quantizes with the unsharded plan's per-tensor scales (amaxes max-reduced over the group); with
// shards of whole blocks (F/P a multiple of the block) blocked scales are the unsharded plan's
// too, and with partial blocks (ShardingFp8Blocked) the scales are powers of 2 (MXFP8, BLOCK's
// default; plan creation refuses BLOCK without them), which commute with FP8 rounding, so the
// codes differ only in the subnormal range (measured: ~2e-3 at most). What differs is the order
// of fp32 sums (GEMM2's and dn's partial sums over F/P, and any other order the GEMM library
// picks for a narrower matrix). As between the backends (kTolFp8Backends) that can move an
// intermediate across an FP8 rounding boundary in a few elements, so the same bound holds for the
// same reason.
constexpr Tolerance kTolFp8Sharded = kTolFp8Backends;

// The CUDA kernels, each against the host's arithmetic (tests/gpu/test_cuda_kernels.cpp), where
// they cannot agree bit for bit (everything else there is compared bitwise):
//  - a transcendental activation (gelu's tanhf, silu's and sigmoid's expf, ...): CUDA's expf and
//    tanhf are within 2 ulp of the correctly rounded value and glibc's within 1, and an activation
//    (and its derivative, and the gated product) takes a handful of operations on top, so the
//    fp32 results differ by a few ulp (2^-23 relative each). 1e-5 relative (about 80 ulp) bounds
//    that and is orders of magnitude below the error of a wrong formula or constant (1e-3 and up).
constexpr double kKernelTranscendentalRtol = 1e-5;
//  - a sum in another order (a norm row's statistics over up to 4100 elements, a column's sum over
//    a chunk's rows): either order's rounding error is below n * 2^-24 of the sum of the terms'
//    magnitudes in the worst case (2.4e-4 at n = 4100) and about sqrt(n) * 2^-24 in practice
//    (4e-6); 1e-4, relative to the sum of magnitudes (or to 1 for the norm's O(1) outputs), bounds
//    the practice with margin, while a wrong term or a missed row is off by the size of a term.
constexpr double kKernelSumRtol = 1e-4;

// Unit roundoff of each dtype (half an ulp, relative): used to size the kink windows.
inline double unit_roundoff(int32_t dtype) {
  switch (dtype) {
    case LNMLP_DTYPE_BF16: return 1.0 / 512.0;   // 2^-9
    case LNMLP_DTYPE_F16: return 1.0 / 4096.0;   // 2^-12
    default: return 1.0 / 16777216.0;            // 2^-24
  }
}

// The reference's own gradients against central differences in float64 (test_reference_gradcheck):
// with step 1e-5 the truncation error is ~1e-10 and the cancellation error ~1e-11 relative.
constexpr double kGradcheckRtol = 1e-6;

}  // namespace lnmlp_test
