// The CUDA backend's own kernels (src/cuda/kernels.h: the norm and its backward, the activation and
// its backward, the column reductions), each on its own against the host's arithmetic: src/numerics
// through the CPU backend's row kernels (src/cpu/kernels.h). So the first GPU run names the kernel
// that fails, before any whole-plan test runs.
//
// Bitwise where the arithmetic is the same: exact activations; every output rounded to the dtype
// against the kernel's own fp32 output rounded on the host; the FP8 codes, transposed codes and
// amax a producer makes in its own pass against the host's quantization of the kernel's fp32
// output; recomputation from saved statistics; column sums (rows in order) and the final in-order
// sum of their chunks; db1's partial sums across output modes. Within tests/tolerances.h's
// kKernel* bounds where the GPU sums in another order (row statistics, db1's partial sums) or
// evaluates a transcendental. Shapes cover both kernel paths (rows whose length is a multiple of
// 4 or not), partial tiles and several chunks. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cuda/kernels.h"
#include "kernel_test_util.h"
#include "numerics/activation.h"
#include "tolerances.h"

namespace {

using namespace lnmlp_kernel_test;
using namespace lnmlp::numerics;
using lnmlp::cuda::Fp8Out;
using lnmlp_test::kKernelSumRtol;
using lnmlp_test::kKernelTranscendentalRtol;

template <typename Fn> void with_dtype(DType d, Fn&& fn) { lnmlp::numerics::dispatch_dtype(d, fn); }

// The FP8 work of a producer with every output: amax, codes and transposed codes with `scale`.
struct Fp8Buffers {
  Device<float> scale;
  Device<uint32_t> amax;
  Device<uint8_t> codes, codes_t;
  Fp8Buffers(float s, size_t n) : scale(std::vector<float>{s}), amax(1), codes(n), codes_t(n) {}
  Fp8Out out(Fp8Format f, bool rowwise, bool transposed) const {
    Fp8Out o;
    o.amax_bits = amax.p;
    o.scale = scale.p;
    o.e5m2 = f == Fp8Format::E5M2;
    o.codes = rowwise ? codes.p : nullptr;
    o.codes_t = transposed ? codes_t.p : nullptr;
    return o;
  }
};

// ---- the norm ------------------------------------------------------------------------------------

struct NormCase {
  DType d;
  Norm norm;
  bool zero_centered;
  int64_t rows, hidden;
};

std::string norm_case_name(const ::testing::TestParamInfo<NormCase>& i) {
  const NormCase& k = i.param;
  return std::string(dtype_name(k.d)) + (k.norm == Norm::LayerNorm ? "_layernorm" : "_rmsnorm") +
         (k.zero_centered ? "_zc" : "") + "_H" + std::to_string(k.hidden);
}

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> v;
  for (DType d : {DType::F32, DType::BF16, DType::F16})
    for (Norm n : {Norm::LayerNorm, Norm::RmsNorm})
      for (int64_t H : {int64_t{64}, int64_t{37}, int64_t{4100}}) v.push_back({d, n, H == 37, 19, H});
  return v;
}

// The norm's inputs as a kernel of dtype D reads them, and the host's forward (statistics and the
// unrounded fp32 output) from the CPU backend's row kernel.
template <DType D> struct NormProblem {
  using S = storage_t<D>;
  const NormCase k;
  const int64_t n;
  std::vector<S> x, gamma, beta;
  std::vector<float> mu, rs, out;
  lnmlp::cpu::NormParams np;
  lnmlp::cuda::NormSpec spec;
  bool ln;

  explicit NormProblem(const NormCase& c)
      : k(c),
        n(c.rows * c.hidden),
        mu(static_cast<size_t>(c.rows)),
        rs(static_cast<size_t>(c.rows)),
        out(static_cast<size_t>(n)) {
    std::vector<float> xf = normal_input(static_cast<size_t>(n), 2.0f, 1);
    for (int64_t r = 0; r < k.rows; ++r)
      for (int64_t j = 0; j < k.hidden; ++j) xf[static_cast<size_t>(r * k.hidden + j)] += 0.5f * static_cast<float>(r);
    std::vector<float> g = normal_input(static_cast<size_t>(k.hidden), 0.5f, 2), b = normal_input(g.size(), 0.3f, 3);
    for (float& v : g) v += k.zero_centered ? 0.0f : 1.0f;
    x = to_storage<D>(xf);
    gamma = to_storage<D>(g);
    beta = to_storage<D>(b);
    ln = k.norm == Norm::LayerNorm;
    np = {k.norm, k.zero_centered, 1e-5f, k.hidden};
    spec = {k.norm, k.zero_centered, 1e-5f, k.rows, k.hidden};
    lnmlp::cpu::norm_forward_rows<D>(np, 0, k.rows, x.data(), gamma.data(), beta.data(), true, mu.data(), rs.data(),
                                     nullptr, out.data());
  }
};

class CudaNormKernels : public ::testing::TestWithParam<NormCase> {};

template <DType D> void check_norm_forward(const NormCase& c) {
  using S = storage_t<D>;
  const NormProblem<D> p(c);
  const size_t n = static_cast<size_t>(p.n);
  Device<S> dx(p.x), dgamma(p.gamma), dbeta(p.beta);
  Device<float> dmu(p.mu.size()), drs(p.rs.size()), dout(n), drecomputed(n);
  const void* beta = p.ln ? dbeta.p : nullptr;
  float* mu = p.ln ? dmu.p : nullptr;
  lnmlp::cuda::norm_forward(D, p.spec, dx.p, dgamma.p, beta, true, mu, drs.p, dout.p, true, Fp8Out{}, nullptr);
  CUDA_OK(cudaGetLastError());
  const std::vector<float> out = dout.host();
  const Worst w = worst_relative(out, p.out);
  EXPECT_LE(w.err, kKernelSumRtol) << "fp32 output, element " << w.at;
  EXPECT_LE(worst_relative(drs.host(), p.rs).err, kKernelSumRtol) << "rstd";
  if (p.ln) {
    EXPECT_LE(worst_relative(dmu.host(), p.mu).err, kKernelSumRtol) << "mean";
  }

  // Rounded to the dtype: the kernel's own fp32 values, rounded.
  Device<S> drounded(n);
  lnmlp::cuda::norm_forward(D, p.spec, dx.p, dgamma.p, beta, true, mu, drs.p, drounded.p, false, Fp8Out{}, nullptr);
  EXPECT_EQ(first_difference(to_storage<D>(out), drounded.host()), -1) << "output rounded to the dtype";

  // Recomputed from the saved statistics: the same values.
  lnmlp::cuda::norm_forward(D, p.spec, dx.p, dgamma.p, beta, false, mu, drs.p, drecomputed.p, true, Fp8Out{}, nullptr);
  EXPECT_EQ(first_difference(out, drecomputed.host()), -1) << "recomputation from the statistics";

  // Its quantizer's work in the same pass, without the fp32 output: the codes and amax of the
  // values above.
  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(lnmlp::numerics::fp8_name(f));
    const float scale = f == Fp8Format::E4M3 ? 37.5f : 0.3f;
    const Fp8Buffers q(scale, n);
    lnmlp::cuda::norm_forward(D, p.spec, dx.p, dgamma.p, beta, true, mu, drs.p, nullptr, true, q.out(f, true, false),
                              nullptr);
    CUDA_OK(cudaGetLastError());
    EXPECT_EQ(first_difference(host_codes(out, scale, f), q.codes.host()), -1) << "codes";
    EXPECT_EQ(q.amax.host()[0], host_amax_bits(out)) << "amax";
  }
}

TEST_P(CudaNormKernels, ForwardIsTheHostsAndQuantizesItsOwnOutput) {
  SKIP_WITHOUT_DEVICE();
  with_dtype(GetParam().d, [&](auto t) { check_norm_forward<decltype(t)::value>(GetParam()); });
}

template <DType D> void check_norm_backward(const NormCase& c) {
  using S = storage_t<D>;
  const NormProblem<D> p(c);
  const size_t n = static_cast<size_t>(p.n), H = static_cast<size_t>(c.hidden);
  const std::vector<float> dn = normal_input(n, 1.0f, 4);
  std::vector<S> dx(n);
  std::vector<float> dg_unused(H, 0.0f), db_unused(H, 0.0f);
  lnmlp::cpu::norm_backward_rows<D>(p.np, 0, c.rows, dn.data(), p.x.data(), p.gamma.data(), p.mu.data(), p.rs.data(),
                                    dx.data(), dg_unused.data(), db_unused.data());
  // The device gets the host's statistics, so both compute the same xhat.
  Device<S> dxs(p.x), dgamma(p.gamma), ddx(n);
  Device<float> ddn(dn), dmu(p.mu), drs(p.rs);
  const float* mu = p.ln ? dmu.p : nullptr;
  lnmlp::cuda::norm_backward_dx(D, p.spec, ddn.p, dxs.p, dgamma.p, mu, drs.p, ddx.p, nullptr);
  // dx: row sums in another order, then one rounding to the dtype (which may then round to the
  // neighbouring value): within the sums' bound plus one unit of the dtype.
  const double ulp = D == DType::F32 ? 0.0 : D == DType::BF16 ? 1.0 / 128 : 1.0 / 1024;
  const std::vector<float> got = to_float<D>(ddx.host()), want = to_float<D>(dx);
  double scale = 0.0;
  for (float v : want) scale = std::max(scale, std::fabs(double{v}));
  for (size_t i = 0; i < n; ++i) {
    const double e = std::fabs(double{got[i]} - want[i]);
    ASSERT_LE(e, kKernelSumRtol * std::max(1.0, scale) + ulp * std::fabs(double{want[i]})) << "dx element " << i;
  }

  // dgamma's and dbeta's partial sums per chunk of rows, rows in order: the host's, bit for bit.
  const lnmlp::cuda::Chunking ch = lnmlp::cuda::column_chunking(c.rows, c.hidden);
  Device<float> dpg(static_cast<size_t>(ch.chunks) * H), dpb(static_cast<size_t>(ch.chunks) * H);
  lnmlp::cuda::norm_param_grads(D, p.spec, ch, ddn.p, dxs.p, mu, drs.p, dpg.p, p.ln ? dpb.p : nullptr, nullptr);
  CUDA_OK(cudaGetLastError());
  std::vector<float> wg(dpg.n), wb(dpb.n);
  for (int64_t k = 0; k < ch.chunks; ++k)
    for (int64_t j = 0; j < c.hidden; ++j) {
      float sg = 0.0f, sb = 0.0f;
      for (int64_t r = k * ch.rows_per_chunk; r < std::min(c.rows, (k + 1) * ch.rows_per_chunk); ++r) {
        const float g = dn[static_cast<size_t>(r * c.hidden + j)];
        const float xh =
            lnmlp::numerics::norm_xhat(lnmlp::numerics::load<D>(p.x[static_cast<size_t>(r * c.hidden + j)]),
                                       p.ln ? p.mu[static_cast<size_t>(r)] : 0.0f, p.rs[static_cast<size_t>(r)]);
        sg += g * xh;
        sb += g;
      }
      wg[static_cast<size_t>(k * c.hidden + j)] = sg;
      wb[static_cast<size_t>(k * c.hidden + j)] = sb;
    }
  EXPECT_EQ(first_difference(wg, dpg.host()), -1) << "dgamma partial sums";
  if (p.ln) {
    EXPECT_EQ(first_difference(wb, dpb.host()), -1) << "dbeta partial sums";
  }
}

TEST_P(CudaNormKernels, BackwardIsTheHosts) {
  SKIP_WITHOUT_DEVICE();
  with_dtype(GetParam().d, [&](auto t) { check_norm_backward<decltype(t)::value>(GetParam()); });
}

INSTANTIATE_TEST_SUITE_P(All, CudaNormKernels, ::testing::ValuesIn(norm_cases()), norm_case_name);

// ---- the activation and its backward ----------------------------------------------------------------

struct ActCase {
  DType d;
  Act f0, f1;
  bool gated;
  int64_t rows, ffn;
};

bool exact(Act a) { return a == Act::Linear || a == Act::Relu || a == Act::SquaredRelu; }

std::string act_case_name(const ::testing::TestParamInfo<ActCase>& i) {
  const ActCase& k = i.param;
  std::string s = std::string(dtype_name(k.d)) + "_" + lnmlp::numerics::act_name(k.f0);
  if (k.gated) s += std::string("_") + lnmlp::numerics::act_name(k.f1);
  return s + "_T" + std::to_string(k.rows) + "_F" + std::to_string(k.ffn);
}

std::vector<ActCase> act_cases() {
  return {
      {DType::BF16, Act::Gelu, Act::Linear, false, 80, 64},  // a partial tile of rows
      {DType::F32, Act::Relu, Act::Linear, false, 80, 37},   // rows not a multiple of 4 long
      {DType::BF16, Act::Silu, Act::Linear, true, 80, 200},  // swiglu, a partial tile of columns
      {DType::F16, Act::ClampedSilu, Act::ClampedLinear, true, 130, 48},
      {DType::F32, Act::SquaredRelu, Act::Linear, false, 64, 64},
      {DType::BF16, Act::QuickGelu, Act::Linear, false, 300, 40},  // several chunks of db1
      {DType::F32, Act::Sigmoid, Act::Relu, true, 70, 36},
  };
}

// The activation's inputs as a kernel of dtype D reads them.
template <DType D> struct ActProblem {
  const ActCase k;
  const int64_t AF;
  std::vector<storage_t<D>> h;
  std::vector<float> dact;
  RuntimeAct f0, f1;
  lnmlp::cuda::ActSpec spec;

  explicit ActProblem(const ActCase& c)
      : k(c), AF(c.gated ? 2 * c.ffn : c.ffn), f0{c.f0, ActParams{}}, f1{c.f1, ActParams{}} {
    h = to_storage<D>(normal_input(static_cast<size_t>(c.rows * AF), 2.0f, 7));
    dact = normal_input(static_cast<size_t>(c.rows * c.ffn), 1.0f, 8);
    spec = {c.f0, c.f1, c.gated, ActParams{}, c.rows, c.ffn};
  }
  bool exact_math() const { return exact(k.f0) && (!k.gated || exact(k.f1)); }
};

class CudaActKernels : public ::testing::TestWithParam<ActCase> {};

template <DType D> void check_act_forward(const ActCase& c) {
  using S = storage_t<D>;
  const ActProblem<D> p(c);
  const size_t n = static_cast<size_t>(c.rows * c.ffn);
  std::vector<float> want(n);
  if (c.gated) lnmlp::cpu::act_forward_rows<D, true>(c.ffn, 0, c.rows, p.f0, p.f1, p.h.data(), nullptr, want.data());
  else lnmlp::cpu::act_forward_rows<D, false>(c.ffn, 0, c.rows, p.f0, p.f1, p.h.data(), nullptr, want.data());
  Device<S> dh(p.h), dround(n);
  Device<float> dout(n);
  lnmlp::cuda::act_forward(D, p.spec, dh.p, dout.p, true, Fp8Out{}, nullptr);
  CUDA_OK(cudaGetLastError());
  const std::vector<float> out = dout.host();
  if (p.exact_math()) {
    EXPECT_EQ(first_difference(want, out), -1) << "fp32 output";
  } else {
    const Worst w = worst_relative(out, want);
    EXPECT_LE(w.err, kKernelTranscendentalRtol) << "fp32 output, element " << w.at;
  }
  lnmlp::cuda::act_forward(D, p.spec, dh.p, dround.p, false, Fp8Out{}, nullptr);
  EXPECT_EQ(first_difference(to_storage<D>(out), dround.host()), -1) << "output rounded to the dtype";

  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2})
    for (int outputs = 0; outputs < 3; ++outputs) {  // codes and transposed codes, each alone
      const bool rowwise = outputs != 2, trans = outputs != 1;
      SCOPED_TRACE(std::string(lnmlp::numerics::fp8_name(f)) + (rowwise ? " codes" : "") +
                   (trans ? " transposed" : ""));
      const float scale = f == Fp8Format::E4M3 ? 64.0f : 0.7f;
      const Fp8Buffers q(scale, n);
      lnmlp::cuda::act_forward(D, p.spec, dh.p, nullptr, true, q.out(f, rowwise, trans), nullptr);
      CUDA_OK(cudaGetLastError());
      const std::vector<uint8_t> codes = host_codes(out, scale, f);
      if (rowwise) {
        EXPECT_EQ(first_difference(codes, q.codes.host()), -1) << "codes";
      }
      if (trans) {
        EXPECT_EQ(first_difference(transposed(codes, c.rows, c.ffn), q.codes_t.host()), -1) << "transposed codes";
      }
      EXPECT_EQ(q.amax.host()[0], host_amax_bits(out)) << "amax";
    }
}

TEST_P(CudaActKernels, ForwardIsTheHostsAndQuantizesItsOwnOutput) {
  SKIP_WITHOUT_DEVICE();
  with_dtype(GetParam().d, [&](auto t) { check_act_forward<decltype(t)::value>(GetParam()); });
}

template <DType D> void check_act_backward(const ActCase& c) {
  using S = storage_t<D>;
  const ActProblem<D> p(c);
  const size_t n = static_cast<size_t>(c.rows * p.AF), AF = static_cast<size_t>(p.AF);
  std::vector<float> want(n);
  if (c.gated)
    lnmlp::cpu::act_backward_rows<D, true, false>(c.ffn, 0, c.rows, p.f0, p.f1, p.dact.data(), p.h.data(), want.data(),
                                                  nullptr);
  else
    lnmlp::cpu::act_backward_rows<D, false, false>(c.ffn, 0, c.rows, p.f0, p.f1, p.dact.data(), p.h.data(), want.data(),
                                                   nullptr);
  const lnmlp::cuda::Chunking ch = lnmlp::cuda::tile_chunking(c.rows, c.ffn);
  const size_t parts = static_cast<size_t>(ch.chunks) * AF;
  Device<S> dh_in(p.h), dround(n);
  Device<float> ddact(p.dact), dout(n), dpart(parts), dpart_round(parts);
  lnmlp::cuda::act_backward(D, p.spec, ch, ddact.p, dh_in.p, dout.p, true, Fp8Out{}, dpart.p, nullptr);
  CUDA_OK(cudaGetLastError());
  const std::vector<float> out = dout.host(), part = dpart.host();
  if (p.exact_math()) {
    EXPECT_EQ(first_difference(want, out), -1) << "fp32 dh";
  } else {
    const Worst w = worst_relative(out, want);
    EXPECT_LE(w.err, kKernelTranscendentalRtol) << "fp32 dh, element " << w.at;
  }
  // db1's partial sums: each chunk's rows of the host's dh, summed in another order.
  for (int64_t k = 0; k < ch.chunks; ++k)
    for (size_t j = 0; j < AF; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t r = k * ch.rows_per_chunk; r < std::min(c.rows, (k + 1) * ch.rows_per_chunk); ++r) {
        sum += want[static_cast<size_t>(r) * AF + j];
        mag += std::fabs(double{want[static_cast<size_t>(r) * AF + j]});
      }
      const double got = part[static_cast<size_t>(k) * AF + j];
      ASSERT_LE(std::fabs(got - sum), kKernelSumRtol * std::max(1.0, mag) + (p.exact_math() ? 0.0 : 1e-5 * mag))
          << "db1 partial sum, chunk " << k << ", column " << j;
    }

  lnmlp::cuda::act_backward(D, p.spec, ch, ddact.p, dh_in.p, dround.p, false, Fp8Out{}, dpart_round.p, nullptr);
  EXPECT_EQ(first_difference(to_storage<D>(out), dround.host()), -1) << "dh rounded to the dtype";
  EXPECT_EQ(first_difference(part, dpart_round.host()), -1) << "db1 partial sums (of the unrounded dh)";

  for (Fp8Format f : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    SCOPED_TRACE(lnmlp::numerics::fp8_name(f));
    const float scale = f == Fp8Format::E4M3 ? 128.0f : 2.5f;
    const Fp8Buffers q(scale, n);
    Device<float> dpart_q(parts);
    lnmlp::cuda::act_backward(D, p.spec, ch, ddact.p, dh_in.p, nullptr, true, q.out(f, true, true), dpart_q.p, nullptr);
    CUDA_OK(cudaGetLastError());
    const std::vector<uint8_t> codes = host_codes(out, scale, f);
    EXPECT_EQ(first_difference(codes, q.codes.host()), -1) << "codes";
    EXPECT_EQ(first_difference(transposed(codes, c.rows, p.AF), q.codes_t.host()), -1) << "transposed codes";
    EXPECT_EQ(q.amax.host()[0], host_amax_bits(out)) << "amax";
    EXPECT_EQ(first_difference(part, dpart_q.host()), -1) << "db1 partial sums beside the codes";
  }
}

TEST_P(CudaActKernels, BackwardIsTheHostsAndQuantizesItsOwnOutput) {
  SKIP_WITHOUT_DEVICE();
  with_dtype(GetParam().d, [&](auto t) { check_act_backward<decltype(t)::value>(GetParam()); });
}

INSTANTIATE_TEST_SUITE_P(All, CudaActKernels, ::testing::ValuesIn(act_cases()), act_case_name);

// ---- column reductions ---------------------------------------------------------------------------

// db2's column sums (rows of a chunk in order) and the final sum of the chunks in order: the host's
// sums in the same orders, bit for bit, then rounded to the dtype.
template <DType D> void check_column_sums(int64_t rows, int64_t cols) {
  using S = storage_t<D>;
  const std::vector<S> in = to_storage<D>(normal_input(static_cast<size_t>(rows * cols), 1.0f, 9));
  const lnmlp::cuda::Chunking ch = lnmlp::cuda::column_chunking(rows, cols);
  const size_t parts = static_cast<size_t>(ch.chunks * cols);
  std::vector<float> want(parts, 0.0f);
  for (int64_t k = 0; k < ch.chunks; ++k)
    lnmlp::cpu::column_sum_rows<D>(cols, k * ch.rows_per_chunk, std::min(rows, (k + 1) * ch.rows_per_chunk), in.data(),
                                   want.data() + k * cols);
  Device<S> din(in), dout(static_cast<size_t>(cols));
  Device<float> dpart(parts);
  lnmlp::cuda::column_sums(D, ch, rows, cols, din.p, dpart.p, nullptr);
  CUDA_OK(cudaGetLastError());
  const std::vector<float> part = dpart.host();
  EXPECT_EQ(first_difference(want, part), -1) << "partial sums";
  lnmlp::cuda::reduce_partials(D, ch.chunks, cols, dpart.p, false, dout.p, nullptr);
  std::vector<S> total(static_cast<size_t>(cols)), accumulated(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    float s = 0.0f;
    for (int64_t k = 0; k < ch.chunks; ++k) s += part[static_cast<size_t>(k * cols + j)];
    total[static_cast<size_t>(j)] = lnmlp::numerics::store<D>(s);
    accumulated[static_cast<size_t>(j)] =
        lnmlp::numerics::store<D>(lnmlp::numerics::load<D>(total[static_cast<size_t>(j)]) + s);
  }
  EXPECT_EQ(first_difference(total, dout.host()), -1) << "the chunks summed in order";
  // An accumulating gradient: rnd(out + sum), out holding the sum already.
  lnmlp::cuda::reduce_partials(D, ch.chunks, cols, dpart.p, true, dout.p, nullptr);
  EXPECT_EQ(first_difference(accumulated, dout.host()), -1) << "the sum added into the output";
}

TEST(CudaColumnKernels, ColumnSumsAndTheirReductionAreTheHostsBitForBit) {
  SKIP_WITHOUT_DEVICE();
  for (DType d : {DType::F32, DType::BF16})
    for (int64_t rows : {int64_t{300}, int64_t{5000}})
      for (int64_t cols : {int64_t{70}, int64_t{1000}}) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " " + std::to_string(rows) + " x " + std::to_string(cols));
        with_dtype(d, [&](auto t) { check_column_sums<decltype(t)::value>(rows, cols); });
      }
}

}  // namespace
