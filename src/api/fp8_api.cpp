// The FP8 conversions of the C API (lnmlp_fp8_encode / lnmlp_fp8_decode): host arrays, the
// numerics of src/numerics/fp8.h. Same conventions as api.cpp: validate everything, then write;
// nothing escapes api_guard.
#include <cmath>
#include <cstdint>

#include "common/error.h"
#include "cpu/fork_child.h"
#include "lnmlp.h"
#include "numerics/fp8.h"

using namespace lnmlp;
using numerics::Fp8Format;

namespace {

// Large arrays are split over the OpenMP threads; small ones are not worth waking them.
constexpr int64_t kParallelMin = int64_t{1} << 18;

Fp8Format check_args(int32_t dtype, const void* in, int64_t count, float scale, const char* scale_name,
                     const void* out) {
  if (dtype != LNMLP_DTYPE_FP8_E4M3 && dtype != LNMLP_DTYPE_FP8_E5M2)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "dtype ", dtype,
         " is not an FP8 element type (expected LNMLP_DTYPE_FP8_E4M3 = ", LNMLP_DTYPE_FP8_E4M3,
         " or LNMLP_DTYPE_FP8_E5M2 = ", LNMLP_DTYPE_FP8_E5M2, ")");
  if (count < 0) fail(LNMLP_ERROR_INVALID_ARGUMENT, "count must be >= 0, got ", count);
  if (!std::isfinite(scale) || scale == 0.0f)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, scale_name, " must be finite and nonzero, got ", scale);
  if (count > 0 && in == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "in is NULL, but count is ", count);
  if (count > 0 && out == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "out is NULL, but count is ", count);
  return dtype == LNMLP_DTYPE_FP8_E4M3 ? Fp8Format::E4M3 : Fp8Format::E5M2;
}

template <Fp8Format F> void encode(const float* in, int64_t count, float scale, uint8_t* out) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelMin && !cpu::in_forked_child())
  for (int64_t i = 0; i < count; ++i) out[i] = numerics::float_to_fp8<F>(in[i] * scale);
}

template <Fp8Format F> void decode(const uint8_t* in, int64_t count, float scale_inv, float* out) {
#pragma omp parallel for simd schedule(static) if (count >= kParallelMin && !cpu::in_forked_child())
  for (int64_t i = 0; i < count; ++i) out[i] = numerics::fp8_to_float<F>(in[i]) * scale_inv;
}

}  // namespace

extern "C" {

LNMLP_API int32_t lnmlp_fp8_encode(int32_t dtype, const float* in, int64_t count, float scale, uint8_t* out) {
  return api_guard(__func__, [&] {
    const Fp8Format f = check_args(dtype, in, count, scale, "scale", out);
    if (f == Fp8Format::E4M3) encode<Fp8Format::E4M3>(in, count, scale, out);
    else encode<Fp8Format::E5M2>(in, count, scale, out);
  });
}

LNMLP_API int32_t lnmlp_fp8_decode(int32_t dtype, const uint8_t* in, int64_t count, float scale_inv, float* out) {
  return api_guard(__func__, [&] {
    const Fp8Format f = check_args(dtype, in, count, scale_inv, "scale_inv", out);
    if (f == Fp8Format::E4M3) decode<Fp8Format::E4M3>(in, count, scale_inv, out);
    else decode<Fp8Format::E5M2>(in, count, scale_inv, out);
  });
}

}  // extern "C"
