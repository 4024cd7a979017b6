// The CPU backend's own kernels: every pass over memory that is not a GEMM. Each is a template on
// the I/O dtype D, works on a range of rows (tokens) and is fused as far as the data flow allows.
// The formulas come from src/numerics/, shared with the CUDA backend.
#pragma once

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

using namespace lnmlp::numerics;

// The element type GEMMs read for an I/O dtype: bf16 GEMMs run natively; f16 values (already
// rounded to f16) are widened to fp32, since the CPU GEMM libraries have no f16 path.
template <DType D> struct OperandOf { using type = storage_t<D>; };
template <> struct OperandOf<DType::F16> { using type = float; };
template <DType D> using operand_t = typename OperandOf<D>::type;

// The value v, rounded to D, as a GEMM operand.
template <DType D> inline operand_t<D> to_operand(float v) {
  if constexpr (D == DType::F16) return round_to<D>(v);
  else return store<D>(v);
}
template <DType D> inline float from_operand(operand_t<D> v) {
  if constexpr (D == DType::F16) return v;
  else return load<D>(v);
}

// An activation fixed at compile time, or chosen at run time (for rare gated pairs whose second
// function is not linear).
template <Act K> struct FixedAct {
  ActParams p;
  float value(float x) const { return act_value<K>(x, p); }
  float grad(float x) const { return act_grad<K>(x, p); }
};
struct RuntimeAct {
  Act a;
  ActParams p;
  float value(float x) const {
    return dispatch_act(a, [&](auto tag) { return act_value<decltype(tag)::value>(x, p); });
  }
  float grad(float x) const {
    return dispatch_act(a, [&](auto tag) { return act_grad<decltype(tag)::value>(x, p); });
  }
};

struct NormParams {
  Norm norm;
  bool zero_centered;
  float eps;
  int64_t hidden;
};

// Norm forward for rows [r0, r1): computes the statistics (or reads them when compute_stats is
// false, for recomputation in backward) and writes the output rounded to D, plus its fp32 operand
// copy when D is f16; or, when out is NULL, the unrounded fp32 output into out_f32 (FP8 recipes
// quantize that). mu may be NULL for rmsnorm.
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
        m = s / static_cast<float>(H);
      }
      float v = 0.0f;
#pragma omp simd reduction(+ : v)
      for (int64_t j = 0; j < H; ++j) {
        const float d = load<D>(xr[j]) - m;
        v += d * d;
      }
      rstd = norm_rstd(v / static_cast<float>(H), np.eps);
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

// Activation forward for rows [r0, r1). The GEMM1 output comes either already in D with its bias
// (h_in, width A*F), or in fp32 without bias (h32 + b1, rounded to D here, and written to h_out
// when that is not NULL). Writes act rounded to D and, for f16, its fp32 operand copy; or, when act
// is NULL, the unrounded fp32 act into act_f32 (FP8 recipes quantize that).
template <DType D, bool Gated, typename F0, typename F1>
void act_forward_rows(int64_t F, int64_t r0, int64_t r1, const F0& f0, const F1& f1, const storage_t<D>* h_in,
                      const float* h32, const storage_t<D>* b1, storage_t<D>* h_out, storage_t<D>* act,
                      float* act_f32) {
  const int64_t AF = Gated ? 2 * F : F;
  const bool unrounded = act == nullptr;
  for (int64_t r = r0; r < r1; ++r) {
    storage_t<D>* ar = unrounded ? nullptr : act + r * F;
    if (unrounded) {  // FP8: from h in D (saved or just rounded), the fp32 act
      float* af = act_f32 + r * F;
      if (h_in != nullptr) {
        const storage_t<D>* hr = h_in + r * AF;
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
          float a = f0.value(load<D>(hr[j]));
          if constexpr (Gated) a *= f1.value(load<D>(hr[F + j]));
          af[j] = a;
        }
      } else {
        const float* hr = h32 + r * AF;
        storage_t<D>* ho = h_out + r * AF;  // required on this path
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
          const storage_t<D> s0 = store<D>(hr[j] + (b1 ? load<D>(b1[j]) : 0.0f));
          ho[j] = s0;
          float a = f0.value(load<D>(s0));
          if constexpr (Gated) {
            const storage_t<D> s1 = store<D>(hr[F + j] + (b1 ? load<D>(b1[F + j]) : 0.0f));
            ho[F + j] = s1;
            a *= f1.value(load<D>(s1));
          }
          af[j] = a;
        }
      }
      continue;
    }
    if (h_in != nullptr) {
      const storage_t<D>* hr = h_in + r * AF;
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) {
        float a = f0.value(load<D>(hr[j]));
        if constexpr (Gated) a *= f1.value(load<D>(hr[F + j]));
        ar[j] = store<D>(a);
      }
    } else {
      const float* hr = h32 + r * AF;
      storage_t<D>* ho = h_out != nullptr ? h_out + r * AF : nullptr;
      // Branches on h_out and b1 are taken outside the loop, so that it vectorizes.
      auto pass = [&](auto write_h, auto bias_at) {
#pragma omp simd
        for (int64_t j = 0; j < F; ++j) {
          const storage_t<D> s0 = store<D>(hr[j] + bias_at(j));
          if constexpr (decltype(write_h)::value) ho[j] = s0;
          float a = f0.value(load<D>(s0));
          if constexpr (Gated) {
            const storage_t<D> s1 = store<D>(hr[F + j] + bias_at(F + j));
            if constexpr (decltype(write_h)::value) ho[F + j] = s1;
            a *= f1.value(load<D>(s1));
          }
          ar[j] = store<D>(a);
        }
      };
      auto with_bias = [&](auto write_h) {
        if (b1 != nullptr) pass(write_h, [b1](int64_t j) { return load<D>(b1[j]); });
        else pass(write_h, [](int64_t) { return 0.0f; });
      };
      if (ho != nullptr) with_bias(std::true_type{});
      else with_bias(std::false_type{});
    }
    if (act_f32 != nullptr) {
      float* af = act_f32 + r * F;
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) af[j] = load<D>(ar[j]);
    }
  }
}

// Activation backward for rows [r0, r1): dh = dact * act'(h) (the gated product rule for two
// functions), written as GEMM operand (rounded to D), with the fp32 column sums of dh added into
// db1_partial (when not NULL). h comes as in act_forward_rows.
// With RoundDh false, dh is written unrounded in fp32 (FP8 recipes quantize that).
template <DType D, bool Gated, bool RoundDh = true, typename F0, typename F1>
void act_backward_rows(int64_t F, int64_t r0, int64_t r1, const F0& f0, const F1& f1, const float* dact,
                       const storage_t<D>* h_in, const float* h32, const storage_t<D>* b1,
                       std::conditional_t<RoundDh, operand_t<D>, float>* dh, float* db1_partial) {
  using DhT = std::conditional_t<RoundDh, operand_t<D>, float>;
  auto out = [](float v) -> DhT {
    if constexpr (RoundDh) return to_operand<D>(v);
    else return v;
  };
  const int64_t AF = Gated ? 2 * F : F;
  for (int64_t r = r0; r < r1; ++r) {
    const float* gr = dact + r * F;
    DhT* dr = dh + r * AF;
    // One pass writes dh and, when asked, adds its unrounded fp32 value into db1's partial sums.
    // h_at(j) is the GEMM1 output of element j of this row as forward rounded it; the source is
    // chosen outside the loop so that the loop has no branches and vectorizes.
    auto pass = [&](auto with_db1, auto h_at) {
#pragma omp simd
      for (int64_t j = 0; j < F; ++j) {
        const float v0 = h_at(j), g = gr[j];
        if constexpr (Gated) {
          const float v1 = h_at(F + j);
          const float d0 = g * f0.grad(v0) * f1.value(v1), d1 = g * f0.value(v0) * f1.grad(v1);
          dr[j] = out(d0);
          dr[F + j] = out(d1);
          if constexpr (decltype(with_db1)::value) {
            db1_partial[j] += d0;
            db1_partial[F + j] += d1;
          }
        } else {
          const float d0 = g * f0.grad(v0);
          dr[j] = out(d0);
          if constexpr (decltype(with_db1)::value) db1_partial[j] += d0;
        }
      }
    };
    auto with_source = [&](auto with_db1) {
      if (h_in != nullptr) {
        const storage_t<D>* hr = h_in + r * AF;
        pass(with_db1, [hr](int64_t j) { return load<D>(hr[j]); });
      } else {
        const float* hr = h32 + r * AF;
        if (b1 != nullptr) pass(with_db1, [hr, b1](int64_t j) { return round_to<D>(hr[j] + load<D>(b1[j])); });
        else pass(with_db1, [hr](int64_t j) { return round_to<D>(hr[j]); });
      }
    };
    if (db1_partial != nullptr) with_source(std::true_type{});
    else with_source(std::false_type{});
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
  const float inv_h = 1.0f / static_cast<float>(H);
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
    const float m1 = ln ? s1 * inv_h : 0.0f, m2 = s2 * inv_h;
    storage_t<D>* dxr = dx + r * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const float xh = norm_xhat(load<D>(xr[j]), m, rstd);
      const float dxh = dnr[j] * norm_gain(load<D>(gamma[j]), np.zero_centered);
      dxr[j] = store<D>(norm_dx(dxh, xh, rstd, m1, m2));
    }
    if (dbeta_partial != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) dbeta_partial[j] += dnr[j];
    }
  }
}

// Column sums of dy for rows [r0, r1) into partial (db2), and for f16 the fp32 operand copy.
template <DType D>
void dy_rows(int64_t H, int64_t r0, int64_t r1, const storage_t<D>* dy, float* partial, float* dy_f32) {
  for (int64_t r = r0; r < r1; ++r) {
    const storage_t<D>* d = dy + r * H;
    if (partial != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) partial[j] += load<D>(d[j]);
    }
    if (dy_f32 != nullptr) {
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) dy_f32[r * H + j] = load<D>(d[j]);
    }
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

}  // namespace lnmlp::cpu
