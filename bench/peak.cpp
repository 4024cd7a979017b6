// Peak probes: independent FMA chains that keep every vector unit busy, timed on all threads.
#include "peak.h"

#include <immintrin.h>
#include <omp.h>

#include <chrono>

namespace {

constexpr int kChains = 12;           // enough independent accumulators to hide FMA latency
constexpr long kIters = 20'000'000;  // ~0.1-0.3 s per probe

template <typename Body> double time_parallel(int threads, Body&& body) {
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

volatile float g_sink;

#if defined(__AVX512F__)
// Keeps the accumulators alive (a plain store; GCC 12 warns falsely inside _mm512_reduce_add_ps).
void sink(const __m512* acc) {
  __m512 s = acc[0];
  for (int c = 1; c < kChains; ++c) s = _mm512_add_ps(s, acc[c]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  g_sink = out[0];
}
#endif

}  // namespace

Peak measure_fp32_peak(int threads) {
#if defined(__AVX512F__)
  constexpr int kLanes = 16;
  const double secs = time_parallel(threads, [] {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + c * 1e-3f);
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (long i = 0; i < kIters / 10; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
    sink(acc);
  });
  const char* what = "AVX-512 fp32 FMA";
#else
  constexpr int kLanes = 8;
  const double secs = time_parallel(threads, [] {
    __m256 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + c * 1e-3f);
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (long i = 0; i < kIters / 10; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    float out[8];
    _mm256_storeu_ps(out, acc[0]);
    g_sink = out[0];
  });
  const char* what = "AVX2 fp32 FMA";
#endif
  const double flops = 2.0 * kLanes * kChains * (kIters / 10) * threads;
  return {flops / secs * 1e-9, what};
}

Peak measure_bf16_peak(int threads) {
#if defined(__AVX512BF16__)
  const double secs = time_parallel(threads, [] {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (long i = 0; i < kIters / 10; ++i)
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    sink(acc);
  });
  // vdpbf16ps: 16 lanes x 2 products x (mul + add)
  const double flops = 2.0 * 32 * kChains * (kIters / 10) * threads;
  return {flops / secs * 1e-9, "AVX512_BF16 vdpbf16ps"};
#else
  (void)threads;
  return {0.0, "no AVX512_BF16 on this build"};
#endif
}
