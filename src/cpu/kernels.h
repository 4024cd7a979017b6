// The CPU backend's own kernels: every pass over memory that is not a GEMM. Each is a template on
// the I/O dtype D, works on a range of rows (tokens) and is fused as far as the data flow allows.
// The formulas come from src/numerics/, shared with the CUDA backend.
#pragma once

#include "isa.h"

#include <cstdint>
#include <type_traits>

// glibc's libmvec has vector versions of expf and tanhf (AVX2 and AVX-512). Declaring them
// "omp declare simd" lets the `#pragma omp simd` loops below call them; glibc's own header does so
// only under -ffast-math, which we do not want (it would change NaN and rounding semantics).
#if defined(__x86_64__) && defined(__GLIBC__)
#include <cmath>
extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;
#pragma omp declare simd notinbranch
float tanhf(float) noexcept;
}
#endif

#include "numerics/activation.h"
#include "numerics/dtype.h"
#include "numerics/norm.h"

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {

using namespace lnmlp::numerics;

// The value v, rounded to D, as a GEMM operand of element type Op: D's storage, or fp32 holding
// D's value (f16, and bf16 where the CPU has no bf16 GEMM: gemm_plan.h's operand_type).
template <DType D, typename Op> inline Op to_operand(float v) {
  if constexpr (std::is_same_v<Op, float>) return round_to<D>(v);
  else return store<D>(v);
}

struct NormParams {
  Norm norm;
  bool zero_centered;
  float eps;
  int64_t hidden;
};

// Norm forward for rows [r0, r1): computes the statistics (or reads them when compute_stats is
// false, for recomputation in backward) and writes the output rounded to D into out, and its
// widened fp32 copy (the f16 GEMM operand) into out_f32 when that is not NULL; or, when out is
// NULL, the unrounded fp32 output into out_f32 (FP8 recipes quantize that). mu may be NULL for
// rmsnorm.
template <DType D>
void norm_forward_rows(const NormParams& np, int64_t r0, int64_t r1, const storage_t<D>* x, const storage_t<D>* gamma,
                       const storage_t<D>* beta, bool compute_stats, float* mu, float* rs, storage_t<D>* out,
                       float* out_f32) {
  const int64_t H = np.hidden;
  const bool ln = np.norm == Norm::LayerNorm;
  for (int64_t r = r0; r < r1; ++r) {
    const storage_t<D>* xr = x + r * H;
    float m = 0.0f, rstd;
    if (compute_stats) {
      if (ln) {
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < H; ++j) s += load<D>(xr[j]);
        m = norm_row_mean(s, H);
      }
      float v = 0.0f;
#pragma omp simd reduction(+ : v)
      for (int64_t j = 0; j < H; ++j) {
        const float d = load<D>(xr[j]) - m;
        v += d * d;
      }
      rstd = norm_row_rstd(v, H, np.eps);
      if (mu != nullptr) mu[r] = m;
      rs[r] = rstd;
    } else {
      m = ln ? mu[r] : 0.0f;
      rstd = rs[r];
    }
    if (out == nullptr) {  // FP8: the unrounded fp32 output, which the quantizer reads
      float* of = out_f32 + r * H;
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) {
        const float b = ln ? load<D>(beta[j]) : 0.0f;
        of[j] = norm_out(norm_xhat(load<D>(xr[j]), m, rstd), norm_gain(load<D>(gamma[j]), np.zero_centered), b);
      }
      continue;
    }
    storage_t<D>* o = out + r * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const float b = ln ? load<D>(beta[j]) : 0.0f;
      const float n = norm_out(norm_xhat(load<D>(xr[j]), m, rstd), norm_gain(load<D>(gamma[j]), np.zero_centered), b);
      o[j] = store<D>(n);
    }
    if (out_f32 != nullptr) {
      float* of = out_f32 + r * H;
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) of[j] = load<D>(o[j]);
    }
  }
}

// The activation at column j of one row of the GEMM1 output hr (in D; the gate's half at F + j).
template <DType D, bool Gated, typename F0, typename F1>
LNMLP_HD float act_at(const F0& f0, const F1& f1, const storage_t<D>* hr, int64_t F, int64_t j) {
  if constexpr (Gated) return gated_value(f0, f1, load<D>(hr[j]), load<D>(hr[F + j]));
  else return f0.value(load<D>(hr[j]));
}

// A row's activation from hr: rounded to D into ar, and widened into af when af is not NULL (the
// f16 GEMM operand); or, when ar is NULL, unrounded in fp32 into af (FP8 recipes quantize that).
// Three plain loops, so that each vectorizes.
template <DType D, bool Gated, typename F0, typename F1>
inline void act_row(int64_t F, const F0& f0, const F1& f1, const storage_t<D>* hr, storage_t<D>* ar, float* af) {
  if (ar == nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) af[j] = act_at<D, Gated>(f0, f1, hr, F, j);
  } else if (af == nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) ar[j] = store<D>(act_at<D, Gated>(f0, f1, hr, F, j));
  } else {
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      const storage_t<D> a = store<D>(act_at<D, Gated>(f0, f1, hr, F, j));
      ar[j] = a;
      af[j] = load<D>(a);
    }
  }
}

// Activation forward for rows [r0, r1): act = f0(h[:, 0, :]) (* f1(h[:, 1, :])) from h (the GEMM1
// output in D, b1 included), written as act_row says.
template <DType D, bool Gated, typename F0, typename F1>
void act_forward_rows(int64_t F, int64_t r0, int64_t r1, const F0& f0, const F1& f1, const storage_t<D>* h,
                      storage_t<D>* act, float* act_f32) {
  const int64_t AF = Gated ? 2 * F : F;
  for (int64_t r = r0; r < r1; ++r) {
    act_row<D, Gated>(F, f0, f1, h + r * AF, act != nullptr ? act + r * F : nullptr,
                      act_f32 != nullptr ? act_f32 + r * F : nullptr);
  }
}

// h[j] = rnd_D(acc[j] * alpha + b1[j]) (no bias without Bias), as a value of D and as fp32.
template <DType D, bool Bias>
LNMLP_HD float round_ffn1(const float* acc, float alpha, const storage_t<D>* b1, storage_t<D>* h, int64_t j) {
  const storage_t<D> v = store<D>(Bias ? acc[j] * alpha + load<D>(b1[j]) : acc[j] * alpha);
  h[j] = v;
  return load<D>(v);
}

// One row of GEMM1's staged fp32 result: h rounded to D, and the activation of the rounded
// values, in one loop (the element's h is in a register when its activation is computed).
template <DType D, bool Gated, bool Bias, typename F0, typename F1>
inline void ffn1_act_row(int64_t F, const F0& f0, const F1& f1, const float* acc, float alpha, const storage_t<D>* b1,
                         storage_t<D>* hr, storage_t<D>* ar, float* af) {
  auto act_of = [&](int64_t j) {
    const float v0 = round_ffn1<D, Bias>(acc, alpha, b1, hr, j);
    if constexpr (Gated) return gated_value(f0, f1, v0, round_ffn1<D, Bias>(acc, alpha, b1, hr, F + j));
    else return f0.value(v0);
  };
  if (ar == nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) af[j] = act_of(j);
  } else if (af == nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) ar[j] = store<D>(act_of(j));
  } else {
#pragma omp simd
    for (int64_t j = 0; j < F; ++j) {
      const storage_t<D> a = store<D>(act_of(j));
      ar[j] = a;
      af[j] = load<D>(a);
    }
  }
}

// GEMM1's result staged in fp32 (acc, without bias) to h = rnd_D(acc * alpha + b1) for rows
// [r0, r1), and the activation of h written as act_row says, in one pass (the f16 and FP8 paths,
// whose GEMMs cannot round to D themselves). b1 may be NULL.
template <DType D, bool Gated, typename F0, typename F1>
void ffn1_act_rows(int64_t F, int64_t r0, int64_t r1, const F0& f0, const F1& f1, const float* acc, float alpha,
                   const storage_t<D>* b1, storage_t<D>* h, storage_t<D>* act, float* act_f32) {
  const int64_t AF = Gated ? 2 * F : F;
  for (int64_t r = r0; r < r1; ++r) {
    storage_t<D>* ar = act != nullptr ? act + r * F : nullptr;
    float* af = act_f32 != nullptr ? act_f32 + r * F : nullptr;
    if (b1 != nullptr) ffn1_act_row<D, Gated, true>(F, f0, f1, acc + r * AF, alpha, b1, h + r * AF, ar, af);
    else ffn1_act_row<D, Gated, false>(F, f0, f1, acc + r * AF, alpha, b1, h + r * AF, ar, af);
  }
}

// Activation backward for rows [r0, r1): dh = dact * act'(h) (the gated product rule for two
// functions, numerics/activation.h), written as GEMM operand of element type DhT (rounded to D),
// with the fp32 column sums of dh added into db1_partial (when not NULL). h is the GEMM1 output
// in D. With RoundDh false, dh is written unrounded in fp32 (FP8 recipes quantize that).
template <DType D, bool Gated, bool RoundDh = true, typename DhT = storage_t<D>, typename F0, typename F1>
void act_backward_rows(int64_t F, int64_t r0, int64_t r1, const F0& f0, const F1& f1, const float* dact,
                       const storage_t<D>* h, std::conditional_t<RoundDh, DhT, float>* dh, float* db1_partial) {
  auto out = [](float v) -> std::conditional_t<RoundDh, DhT, float> {
    if constexpr (RoundDh) return to_operand<D, DhT>(v);
    else return v;
  };
  const int64_t AF = Gated ? 2 * F : F;
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = dact + r * F;
    const storage_t<D>* hr = h + r * AF;
    auto* dr = dh + r * AF;
    // One pass writes dh and, when asked, adds its unrounded fp32 value into db1's partial sums;
    // chosen outside the loop so that the loop has no branches and vectorizes.
    auto pass = [&](auto with_db1) {
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) {
        const float v0 = load<D>(hr[j]), g = gr[j];
        if constexpr (Gated) {
          const GatedGrad d = gated_grad(f0, f1, g, v0, load<D>(hr[F + j]));
          dr[j] = out(d.d0);
          dr[F + j] = out(d.d1);
          if constexpr (decltype(with_db1)::value) {
            db1_partial[j] += d.d0;
            db1_partial[F + j] += d.d1;
          }
        } else {
          const float d0 = g * f0.grad(v0);
          dr[j] = out(d0);
          if constexpr (decltype(with_db1)::value) db1_partial[j] += d0;
        }
      }
    };
    if (db1_partial != nullptr) pass(std::true_type{});
    else pass(std::false_type{});
  }
}

// Norm backward for rows [r0, r1): dx from dn (fp32), and dgamma/dbeta contributions added into
// the partial sums (dbeta_partial NULL for rmsnorm).
template <DType D>
void norm_backward_rows(const NormParams& np, int64_t r0, int64_t r1, const float* dn, const storage_t<D>* x,
                        const storage_t<D>* gamma, const float* mu, const float* rs, storage_t<D>* dx,
                        float* dgamma_partial, float* dbeta_partial) {
  const int64_t H = np.hidden;
  const bool ln = np.norm == Norm::LayerNorm;
  for (int64_t r = r0; r < r1; ++r) {
    const storage_t<D>* xr = x + r * H;
    const float* dnr = dn + r * H;
    const float m = ln ? mu[r] : 0.0f, rstd = rs[r];
    float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
    for (int64_t j = 0; j < H; ++j) {
      const float xh = norm_xhat(load<D>(xr[j]), m, rstd);
      const float dxh = dnr[j] * norm_gain(load<D>(gamma[j]), np.zero_centered);
      s1 += dxh;
      s2 += dxh * xh;
      dgamma_partial[j] += dnr[j] * xh;
    }
    const NormBackwardMeans means = norm_backward_means(s1, s2, H, ln);
    storage_t<D>* dxr = dx + r * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const float xh = norm_xhat(load<D>(xr[j]), m, rstd);
      const float dxh = dnr[j] * norm_gain(load<D>(gamma[j]), np.zero_centered);
      dxr[j] = store<D>(norm_dx(dxh, xh, rstd, means.m1, means.m2));
    }
    if (dbeta_partial != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) dbeta_partial[j] += dnr[j];
    }
  }
}

// Column sums of rows [r0, r1) of in [rows, n] (D) added into partial (db2 from dy).
template <DType D> void column_sum_rows(int64_t n, int64_t r0, int64_t r1, const storage_t<D>* in, float* partial) {
  for (int64_t r = r0; r < r1; ++r) {
    const storage_t<D>* d = in + r * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) partial[j] += load<D>(d[j]);
  }
}

// Elementwise conversion of [begin, end) from D to fp32 (f16 operands) or from fp32 to D (outputs).
template <DType D> void widen(int64_t begin, int64_t end, const storage_t<D>* in, float* out) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) out[i] = load<D>(in[i]);
}
template <DType D> void narrow(int64_t begin, int64_t end, const float* in, storage_t<D>* out) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) out[i] = store<D>(in[i]);
}

// A GEMM's fp32 result for rows [r0, r1) of width n: out = rnd_D(acc * alpha + bias) (bias may be
// NULL), the epilogue of FP8 GEMMs (alpha = the product of per-tensor scale_invs, or 1).
template <DType D>
void scale_bias_rows(int64_t n, int64_t r0, int64_t r1, const float* acc, float alpha, const storage_t<D>* bias,
                     storage_t<D>* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* a = acc + r * n;
    storage_t<D>* o = out + r * n;
    if (bias != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = store<D>(a[j] * alpha + load<D>(bias[j]));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) o[j] = store<D>(a[j] * alpha);
    }
  }
}

// out rows [r0, r1) of [*, n] += acc * alpha: each element rnd(out + acc * alpha), in fp32 (an
// accumulating parameter gradient).
template <DType D>
void accumulate_rows(int64_t n, int64_t r0, int64_t r1, const float* acc, float alpha, storage_t<D>* out) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* a = acc + r * n;
    storage_t<D>* o = out + r * n;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) o[j] = store<D>(load<D>(o[j]) + a[j] * alpha);
  }
}

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
