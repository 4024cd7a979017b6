// The block's six fp32 GEMMs (forward GEMM1, GEMM2; backward dact, dW2, dn, dW1) at T x H=1024 x
// F=4096, timed one by one (median of 5 after a warm-up) through one library: oneDNN's matmul
// (-DSIX_GEMMS_ONEDNN) or a CBLAS (OpenBLAS, BLIS). Operands are 64-byte aligned, plus
// `offset` bytes for the weights (W1, W2), to show the alignment effect of oneDNN's AVX2 sgemm
// driver on small batches (src/cpu/gemm_onednn.cpp, OffsetWeightsGemm). Run by run.sh.
//   six_gemms T [offset]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#if defined(SIX_GEMMS_ONEDNN)
#include <oneapi/dnnl/dnnl.hpp>
#else
#include <cblas.h>
#endif

namespace {

constexpr long H = 1024, F = 4096;

float* buffer(long n, long offset) {
  char* p = static_cast<char*>(std::aligned_alloc(4096, static_cast<size_t>(n) * 4 + 8192)) + offset;
  auto* f = reinterpret_cast<float*>(p);
  for (long i = 0; i < n; ++i) f[i] = 0.01f * static_cast<float>(i % 97);
  return f;
}

// C[m, n] = op(A) op(B), row-major; ta/tb: A stored [k, m] / B stored [n, k].
using Gemm = std::function<void(long m, long n, long k, bool ta, bool tb, const float* a, const float* b, float* c)>;

#if defined(SIX_GEMMS_ONEDNN)
const char* kLibrary = "oneDNN matmul";
Gemm make_gemm() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static dnnl::stream s(eng);
  return [](long m, long n, long k, bool ta, bool tb, const float* a, const float* b, float* c) {
    using dnnl::memory;
    const memory::desc ad({m, k}, memory::data_type::f32, ta ? memory::dims{1, m} : memory::dims{k, 1});
    const memory::desc bd({k, n}, memory::data_type::f32, tb ? memory::dims{1, k} : memory::dims{n, 1});
    const memory::desc cd({m, n}, memory::data_type::f32, memory::dims{n, 1});
    // Created per call: oneDNN caches primitives, and the timing below excludes the first call.
    dnnl::matmul p(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng));
    p.execute(s, {{DNNL_ARG_SRC, memory(ad, eng, const_cast<float*>(a))},
                  {DNNL_ARG_WEIGHTS, memory(bd, eng, const_cast<float*>(b))},
                  {DNNL_ARG_DST, memory(cd, eng, c)}});
    s.wait();
  };
}
#else
const char* kLibrary = SIX_GEMMS_CBLAS;  // the library's name, from run.sh
Gemm make_gemm() {
  return [](long m, long n, long k, bool ta, bool tb, const float* a, const float* b, float* c) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
                ta ? m : k, b, tb ? k : n, 0.0f, c, n);
  };
}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: six_gemms T [weight offset in bytes]\n");
    return 2;
  }
  const long T = std::atol(argv[1]), off = argc > 2 ? std::atol(argv[2]) : 0;
  float *x = buffer(T * H, 0), *w1 = buffer(H * F, off), *h = buffer(T * F, 0), *w2 = buffer(F * H, off),
        *y = buffer(T * H, 0), *dy = buffer(T * H, 0), *da = buffer(T * F, 0), *dw2 = buffer(F * H, 0),
        *dn = buffer(T * H, 0), *dw1 = buffer(H * F, 0);
  struct Step {
    const char* name;
    long m, n, k;
    bool ta, tb;
    const float *a, *b;
    float* c;
  };
  const Step steps[] = {{"gemm1", T, F, H, false, false, x, w1, h},    {"gemm2", T, H, F, false, false, h, w2, y},
                        {"dact", T, F, H, false, true, dy, w2, da},    {"dw2", F, H, T, true, false, h, dy, dw2},
                        {"dn", T, H, F, false, true, da, w1, dn},      {"dw1", H, F, T, true, false, x, da, dw1}};
  const Gemm gemm = make_gemm();
  double total = 0.0;
  std::printf("%s, T=%ld H=%ld F=%ld, weights at +%ld bytes from 64-byte alignment:", kLibrary, T, H, F, off);
  for (const Step& s : steps) {
    std::vector<double> t;
    for (int i = 0; i < 6; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      gemm(s.m, s.n, s.k, s.ta, s.tb, s.a, s.b, s.c);
      if (i > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    total += t[2];
    std::printf(" %s %.1f ms", s.name, t[2] * 1e3);
  }
  std::printf("; six GEMMs %.1f ms, %.1f GFLOP/s\n", total * 1e3, 6.0 * 2 * T * H * F / total * 1e-9);
  return 0;
}
