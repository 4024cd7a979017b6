// FP8 recipe arithmetic (docs/design.md, "FP8"): how each recipe turns an amax into a scale.
//
// Conventions shared by every recipe:
//   q = cast(x * scale)           quantize (cast: float_to_fp8, round to nearest even, saturating)
//   x ~ q * scale_inv             dequantize, scale_inv = 1 / scale
//   amax = max |x| over the tensor / block; NaN-propagating (see quantize.h: amax_of), always >= 0
//          or NaN.
//
// Recipes and the function that implements each:
//   delayed  delayed_scale_update + the amax history (history_push / history_reduce)
//   current  current_scale
//   block    block_scale (1x128 activation/gradient blocks, 128x128 weight blocks, fp32 scales)
//   mxfp8    mxfp8_scale_inv_exponent / mxfp8_scale_e8m0 (1x32 blocks, E8M0 scale_inv)
//   nvfp4    nvfp4_global_scale / nvfp4_block_scale_e4m3 / nvfp4_element_scale (1x16 blocks or
//            16x16 weight tiles of E2M1, an E4M3 scale per block, an fp32 scale per tensor)
//
// Everything is LNMLP_HD and branch-free where it sits in a hot loop (selects, not branches), so
// it compiles for the CUDA backend and vectorizes in the CPU backend. Exact powers of two are
// computed from exponent bits, never with logf/exp2f.
#pragma once

#include <cstdint>

#include "dtype.h"
#include "fp4.h"
#include "fp8.h"
#include "hd.h"

namespace lnmlp::numerics {

// The largest finite fp32, the scale used when fmt_max / amax overflows (as TransformerEngine).
constexpr float kFloatMax = 3.40282346638528859811704183484516925e+38f;
constexpr float kFloatMinNormal = 1.17549435082228750796873653722224568e-38f;  // 2^-126

// 2^e as a float, exactly, for e in [-126, 127] (normal floats); e is clamped to that range.
LNMLP_HD float pow2_float(int e) {
  e = e < -126 ? -126 : e;
  e = e > 127 ? 127 : e;
  return bits_float(static_cast<uint32_t>(e + 127) << 23);
}

// True when v is finite and > 0 (false for 0, negatives, ±inf and NaN).
LNMLP_HD bool positive_finite(float v) {
  return v > 0.0f && (float_bits(v) & 0x7fffffffu) < 0x7f800000u;
}

// ---- delayed scaling (per tensor, stateful) ---------------------------------------------------

// docs/design.md, "FP8": scale = (fmt_max / amax_h) / 2^margin, where amax_h is the reduced amax history.
// If amax_h is 0 or not finite (NaN, inf) -- or negative, which no amax is -- the old scale is
// returned unchanged.
// If the quotient overflows fp32 (amax_h tiny), the scale is FLT_MAX, as TransformerEngine does:
// the tensor's amax then maps below fmt_max, the best fp32 can do. If it leaves the normal range
// at the other end (amax_h near FLT_MAX with a large margin: (448 / 1e30) / 2^127 is 0 in fp32),
// the scale is the smallest normal float, 2^-126, so that it stays > 0 with a finite inverse (a
// state the plan's own lnmlp_plan_set_quantizer_state accepts; found by tests/fuzz's fuzz_state).
// margin is clamped to [-126, 127]; the division by 2^margin is exact (a power of two) except
// where the result leaves fp32's normal range.
LNMLP_HD float delayed_scale_update(float old_scale, float amax_h, float fmt_max, int margin) {
  float scale = (fmt_max / amax_h) / pow2_float(margin);
  scale = bits_float(select_bits((float_bits(scale) & 0x7fffffffu) == 0x7f800000u,
                                 float_bits(kFloatMax), float_bits(scale)));
  scale = bits_float(select_bits(scale < kFloatMinNormal, float_bits(kFloatMinNormal), float_bits(scale)));
  return bits_float(select_bits(positive_finite(amax_h), float_bits(scale), float_bits(old_scale)));
}

// The amax history of one quantizer: a plain float array of length len >= 1,
//   hist[0]  the newest amax (the pass just run), hist[i] the amax i passes before it,
// i.e. newest first, the order TransformerEngine's JAX side reports it. Initially all zeros: zero
// entries never raise the max, and an all-zero history (amax_h = 0) leaves the scale unchanged.
//
// A push shifts every entry one place towards the end (the oldest, hist[len-1], falls off) and
// writes the newest amax at index 0. On the host, history_push does that in place. On the device,
// where one thread per entry would race with an in-place shift, a kernel computes the new array
// out of place (double-buffered, no host synchronization), each thread i writing
// history_pushed_entry(old, i, amax) into the other buffer; or a single thread calls history_push.
//
// Reductions (docs/design.md, "FP8": the amax reduction MAX or MOST_RECENT):
//   use_max = true   "max": the largest entry over the whole history (newest included);
//   use_max = false  "most_recent": hist[0].
// The max propagates NaN: a NaN recorded in the history makes amax_h NaN (so the delayed update
// keeps the old scale) until it has been shifted out, len pushes later. This matches torch.max over
// TransformerEngine's PyTorch history.

// Entry i of the history after pushing `newest` onto `hist`.
LNMLP_HD float history_pushed_entry(const float* hist, int i, float newest) {
  return i == 0 ? newest : hist[i - 1];
}

// Pushes `newest` onto hist (length len >= 1) in place: shift by one, newest at index 0.
LNMLP_HD void history_push(float* hist, int len, float newest) {
  for (int i = len - 1; i > 0; --i) hist[i] = hist[i - 1];
  hist[0] = newest;
}

// NaN-propagating max of two amax values.
LNMLP_HD float amax_max(float a, float b) {
  const bool take_b = (b > a) | (b != b);
  const bool a_nan = a != a;
  return bits_float(select_bits(take_b & !a_nan, float_bits(b), float_bits(a)));
}

// amax_h of the history: its max (use_max) or its newest entry hist[0] (most_recent).
LNMLP_HD float history_reduce(const float* hist, int len, bool use_max) {
  if (!use_max) return hist[0];
  float m = hist[0];
  for (int i = 1; i < len; ++i) m = amax_max(m, hist[i]);
  return m;
}

// One delayed-scaling step after a pass that quantized with `scale` and measured `amax`:
// record amax into the history, reduce it, update the scale. Returns the new scale.
LNMLP_HD float delayed_record_and_update(float* hist, int len, float amax, float scale,
                                         bool use_max, float fmt_max, int margin) {
  history_push(hist, len, amax);
  return delayed_scale_update(scale, history_reduce(hist, len, use_max), fmt_max, margin);
}

// ---- current scaling (per tensor, stateless) --------------------------------------------------

// docs/design.md, "FP8": scale = fmt_max / max(amax, amax_epsilon); with power_2_scale
// rounded DOWN to a power of two, scale = 2^floor(log2(scale)), taken exactly from the fp32
// scale's exponent bits (its mantissa cleared). As TransformerEngine's compute_scale_from_amax:
//   - max(amax, amax_epsilon) == 0 (amax 0 and no epsilon) -> scale 1.0 (a zero tensor quantizes
//     to zeros with any scale; 1.0 keeps scale_inv finite);
//   - amax not finite (inf, NaN) -> scale 1.0 (NaN: max(NaN, eps) is taken as NaN);
//   - fmt_max / amax overflowing fp32 (amax tiny, e.g. subnormal) -> FLT_MAX (2^127 when rounded
//     to a power of two).
// fmt_max >= 1 (448 or 57344) keeps every scale a normal float, so the power-of-two rounding never
// sees a subnormal.
LNMLP_HD float current_scale(float amax, float fmt_max, bool power_2_scale, float amax_epsilon) {
  const float a = bits_float(select_bits(amax < amax_epsilon, float_bits(amax_epsilon), float_bits(amax)));
  float scale = fmt_max / a;
  scale = bits_float(select_bits((float_bits(scale) & 0x7fffffffu) == 0x7f800000u,
                                 float_bits(kFloatMax), float_bits(scale)));
  const uint32_t rounded = select_bits(power_2_scale, float_bits(scale) & 0xff800000u, float_bits(scale));
  return bits_float(select_bits(positive_finite(a), rounded, float_bits(1.0f)));
}

// The scale of one per-tensor quantization (delayed or current scaling), as every backend chooses
// it: *given when given is not NULL (forward's scale, so that backward re-quantizes to forward's
// codes), else *state_scale when not NULL (delayed scaling's scale), else current scaling's scale
// from the tensor's amax.
LNMLP_HD float per_tensor_scale(const float* given, const float* state_scale, float amax, float fmt_max,
                                bool power_2_scale, float amax_epsilon) {
  if (given != nullptr) return *given;
  if (state_scale != nullptr) return *state_scale;
  return current_scale(amax, fmt_max, power_2_scale, amax_epsilon);
}

// ---- block scaling (1x128 / 128x128 blocks, fp32 scales) --------------------------------------

// docs/design.md, "FP8", BLOCK: each block is scaled as current scaling scales a tensor, from
// the block's own amax: scale = fmt_max / max(amax_block, amax_epsilon), optionally rounded down
// to a power of two. An all-zero block (amax 0) gets scale 1.0; a block holding inf or NaN gets scale 1.0.
LNMLP_HD float block_scale(float amax_block, float fmt_max, bool power_2_scale,
                           float amax_epsilon = 0.0f) {
  return current_scale(amax_block, fmt_max, power_2_scale, amax_epsilon);
}

// ---- mxfp8 (OCP MX, 1x32 blocks, E8M0 scales) -------------------------------------------------

// E8M0: an 8-bit biased exponent, value 2^(byte - 127); bytes 0..254 are 2^-127 .. 2^127, 0xFF is
// NaN. No sign, no zero.
constexpr int kE8M0Bias = 127;
constexpr int kE8M0MinExp = -127;
constexpr int kE8M0MaxExp = 127;
constexpr uint8_t kE8M0Nan = 0xff;

// Exponent e in [-127, 127] -> E8M0 byte (e is clamped to that range).
LNMLP_HD uint8_t e8m0_encode(int e) {
  e = e < kE8M0MinExp ? kE8M0MinExp : e;
  e = e > kE8M0MaxExp ? kE8M0MaxExp : e;
  return static_cast<uint8_t>(e + kE8M0Bias);
}

// E8M0 byte -> its value 2^(byte - 127) as fp32, exactly (2^-127 is the fp32 subnormal
// 0x00400000); 0xFF -> NaN.
LNMLP_HD float e8m0_to_float(uint8_t b) {
  const uint32_t normal = static_cast<uint32_t>(b) << 23;
  uint32_t bits = select_bits(b == 0, 0x00400000u, normal);
  bits = select_bits(b == kE8M0Nan, 0x7fc00000u, bits);
  return bits_float(bits);
}

// docs/design.md, "FP8", MXFP8: scale_inv = 2^e, e = ceil(log2(amax_block / fmt_max)), computed exactly (no division,
// no log): write amax = ma * 2^ea and fmt_max = mm * 2^em with ma, mm in [1, 2). Then
//   log2(amax / fmt_max) = (ea - em) + log2(ma / mm),  ma / mm in (1/2, 2),
// so the ceiling is ea - em + 1 when ma > mm and ea - em otherwise (ma == mm: an exact power of
// two times fmt_max; ma < mm: log2 of the ratio in (-1, 0)). The mantissas compare as integers.
// Subnormal amax is normalized first (exactly, by 2^32).
// This is the exact ceiling; TransformerEngine multiplies amax by a rounded 1/fmt_max first and
// can land one exponent higher at amax = fmt_max * 2^k (E4M3: 448 is not a power of two).
// Edge cases (e is clamped to E8M0's range [-127, 127]):
//   amax 0 -> -127, the smallest exponent (the block is all zeros; any scale codes them as 0);
//   amax so small that e < -127 -> -127 (elements then quantize with scale 2^127, still exact);
//   amax so large that e > 127 (only with fmt_max < 1), or amax = +inf -> 127;
//   amax NaN -> 127 here; mxfp8_scale_e8m0 encodes NaN amax as the E8M0 NaN instead.
// fmt_max must be a positive normal float.
LNMLP_HD int mxfp8_scale_inv_exponent(float amax_block, float fmt_max) {
  const uint32_t raw = float_bits(amax_block) & 0x7fffffffu;
  const bool sub = raw < 0x00800000u;  // zero or subnormal
  const uint32_t a = select_bits(sub, float_bits(bits_float(raw) * 4294967296.0f), raw);  // * 2^32
  const int ea = static_cast<int>(a >> 23) - 127 - (sub ? 32 : 0);
  const uint32_t m = float_bits(fmt_max) & 0x7fffffffu;
  const int em = static_cast<int>(m >> 23) - 127;
  int e = ea - em + static_cast<int>((a & 0x7fffffu) > (m & 0x7fffffu));
  e = raw == 0 ? kE8M0MinExp : e;
  e = raw >= 0x7f800000u ? kE8M0MaxExp : e;  // inf, NaN
  e = e < kE8M0MinExp ? kE8M0MinExp : e;
  e = e > kE8M0MaxExp ? kE8M0MaxExp : e;
  return e;
}

// The block's E8M0 scale_inv byte: e8m0_encode(mxfp8_scale_inv_exponent(...)), except that a NaN
// amax (the block holds a NaN) gives the E8M0 NaN 0xFF, so the whole block dequantizes to NaN (OCP
// MX semantics, and what TransformerEngine writes). amax +inf gives 0xFE (2^127).
LNMLP_HD uint8_t mxfp8_scale_e8m0(float amax_block, float fmt_max) {
  const uint8_t b = e8m0_encode(mxfp8_scale_inv_exponent(amax_block, fmt_max));
  return static_cast<uint8_t>(select_bits(amax_block != amax_block, kE8M0Nan, b));
}

// The quantization scale that goes with scale_inv = 2^e: 2^-e, exactly (2^127 for e = -127; the
// subnormal 2^-127 for e = 127).
LNMLP_HD float mxfp8_scale_from_exponent(int e) {
  const float p = pow2_float(-e);  // exact for -e in [-126, 127]
  return bits_float(select_bits(e >= 127, 0x00400000u, float_bits(p)));
}

// ---- the block-scale choice of both blocked recipes -------------------------------------------

// What a block of a blocked recipe gets from its amax: the scale its elements are multiplied by
// before the cast, and what its scale slot stores: BLOCK an fp32 scale_inv = 1 / scale
// (block_scale), MXFP8 the E8M0 byte of scale_inv = 2^e (mxfp8_scale_e8m0) with scale = 2^-e.
struct BlockScaleChoice {
  float scale;
  float scale_inv;  // BLOCK's stored value
  uint8_t e8m0;     // MXFP8's stored value
};
LNMLP_HD BlockScaleChoice choose_block_scale(float amax_block, float fmt_max, bool mxfp8, bool power_2_scale,
                                             float amax_epsilon) {
  BlockScaleChoice c;
  if (mxfp8) {  // mxfp8_scale_e8m0's byte, with the exponent computed once
    const int e = mxfp8_scale_inv_exponent(amax_block, fmt_max);
    c.scale = mxfp8_scale_from_exponent(e);
    c.e8m0 = static_cast<uint8_t>(select_bits(amax_block != amax_block, kE8M0Nan, e8m0_encode(e)));
    c.scale_inv = e8m0_to_float(c.e8m0);
  } else {
    c.scale = block_scale(amax_block, fmt_max, power_2_scale, amax_epsilon);
    c.scale_inv = 1.0f / c.scale;
    c.e8m0 = 0;
  }
  return c;
}

// ---- nvfp4 (1x16 blocks or 16x16 tiles of E2M1, E4M3 block scales, an fp32 global scale) ----
//
// docs/design.md, "NVFP4". Two levels, as TransformerEngine's NVFP4 kernels compute them (its
// core_nvfp4.cuh; every step in fp32, IEEE division):
//   S_enc    = 448 * 6 / global_amax, at most FLT_MAX; 1 where global_amax is 0 or the quotient 0
//              (global_amax +inf)                                            (nvfp4_global_scale)
//   s_block  = e4m3( min(block_amax * (S_enc * (1/6)), FLT_MAX) ), the block's stored decode
//              scale, saturating at 448                                    (nvfp4_block_scale_e4m3)
//   scale    = min(1 / (float(s_block) * (1 / S_enc)), FLT_MAX), what the block's elements are
//              multiplied by before float_to_e2m1                             (nvfp4_element_scale)
// and an element x decodes to e2m1_to_float(code) * float(s_block) / S_enc. A NaN amax (lnmlp's
// amax propagates NaN) makes the minimum FLT_MAX (as fminf does), so S_enc = FLT_MAX and the
// block's s_block = 448.
constexpr float kNvfp4GlobalNumerator = kFp8E4M3Max * kFp4E2M1Max;  // 2688

// min(v, FLT_MAX) as fminf computes it: a NaN v gives FLT_MAX.
LNMLP_HD float at_most_float_max(float v) {
  return bits_float(select_bits(v < kFloatMax, float_bits(v), float_bits(kFloatMax)));
}

LNMLP_HD float nvfp4_global_scale(float global_amax) {
  const float s = at_most_float_max(kNvfp4GlobalNumerator / global_amax);
  return global_amax == 0.0f || s == 0.0f ? 1.0f : s;
}

LNMLP_HD uint8_t nvfp4_block_scale_e4m3(float block_amax, float global_scale) {
  constexpr float inv_fp4_max = 1.0f / kFp4E2M1Max;
  return float_to_fp8<Fp8Format::E4M3>(at_most_float_max(block_amax * (global_scale * inv_fp4_max)));
}

LNMLP_HD float nvfp4_element_scale(uint8_t block_scale_e4m3, float global_scale) {
  const float global_decode = 1.0f / global_scale;
  return at_most_float_max(1.0f / (fp8_to_float<Fp8Format::E4M3>(block_scale_e4m3) * global_decode));
}

}  // namespace lnmlp::numerics
