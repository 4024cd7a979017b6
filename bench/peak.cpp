// Peak probes: independent FMA chains that keep every vector unit busy, timed on all threads.
#include "peak.h"

#include <immintrin.h>
#include <omp.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

namespace {

constexpr int kChains = 12;           // enough independent accumulators to hide FMA latency
constexpr long kIters = 20'000'000;  // iterations of kChains FMAs: ~0.1 s per probe

template <typename Body> double time_parallel(int threads, Body&& body) {
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

volatile float g_sink;

// One vector width's fp32 operations, so that one probe serves AVX-512 and AVX2: VEC(op) is the
// intrinsic _mm512_op_ps or _mm256_op_ps.
#if defined(__AVX512F__)
using Vec = __m512;
#define VEC(op) _mm512_##op##_ps
const char* const kFmaWhat = "AVX-512 fp32 FMA";
#else
using Vec = __m256;
#define VEC(op) _mm256_##op##_ps
const char* const kFmaWhat = "AVX2 fp32 FMA";
#endif
constexpr int kLanes = sizeof(Vec) / sizeof(float);

// Keeps every accumulator alive: each chain feeds the sink, or the compiler drops the unused ones
// (a plain store; GCC 12 warns falsely inside _mm512_reduce_add_ps).
void sink(const Vec* acc) {
  Vec s = acc[0];
  for (int c = 1; c < kChains; ++c) s = VEC(add)(s, acc[c]);
  float out[kLanes];
  VEC(storeu)(out, s);
  g_sink = out[0];
}

}  // namespace

Peak measure_fp32_peak(int threads) {
  const double secs = time_parallel(threads, [] {
    Vec acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = VEC(set1)(1.0f + c * 1e-3f);
    const Vec a = VEC(set1)(0.999999f), b = VEC(set1)(1e-7f);
    for (long i = 0; i < kIters; ++i)
#pragma GCC unroll 16
      for (int c = 0; c < kChains; ++c) acc[c] = VEC(fmadd)(acc[c], a, b);
    sink(acc);
  });
  const double flops = 2.0 * kLanes * kChains * kIters * threads;
  return {flops / secs * 1e-9, kFmaWhat};
}

Peak measure_bf16_peak(int threads) {
#if defined(__AVX512BF16__)
  const double secs = time_parallel(threads, [] {
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
    const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
    for (long i = 0; i < kIters; ++i)
#pragma GCC unroll 16
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
    sink(acc);
  });
  // vdpbf16ps: 16 lanes x 2 products x (mul + add)
  const double flops = 2.0 * 32 * kChains * kIters * threads;
  return {flops / secs * 1e-9, "AVX512_BF16 vdpbf16ps"};
#else
  (void)threads;
  return {0.0, "no AVX512_BF16 on this build"};
#endif
}

Peak measure_amx_bf16_peak(int threads) {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
  // Linux hands out the AMX tile state only on request (ARCH_REQ_XCOMP_PERM for XTILEDATA).
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) return {0.0, "AMX not permitted"};
  constexpr long kAmxIters = 2'000'000;
  const double secs = time_parallel(threads, [] {
    // Tile config: palette 1; tiles 0-3 accumulate 16x16 fp32, tiles 4-5 hold 16x32 bf16 operands.
    alignas(64) uint8_t cfg[64] = {};
    cfg[0] = 1;
    for (int t = 0; t < 6; ++t) {
      cfg[16 + 2 * t] = 64;  // bytes per row
      cfg[48 + t] = 16;      // rows
    }
    _tile_loadconfig(cfg);
    alignas(64) uint16_t operand[16 * 32];
    for (auto& v : operand) v = 0x3c00;  // small bf16 value
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, operand, 64);
    _tile_loadd(5, operand, 64);
    for (long i = 0; i < kAmxIters; ++i) {
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 5);
      _tile_dpbf16ps(2, 4, 5);
      _tile_dpbf16ps(3, 4, 5);
    }
    alignas(64) float out[16 * 16];
    _tile_stored(0, out, 64);
    g_sink = out[0];
    _tile_release();
  });
  // Each TDPBF16PS: 16 x 16 outputs x 32 products x (mul + add).
  const double flops = 2.0 * 16 * 16 * 32 * 4 * kAmxIters * threads;
  return {flops / secs * 1e-9, "AMX-BF16 tdpbf16ps"};
#else
  (void)threads;
  return {0.0, "no AMX-BF16 on this build"};
#endif
}
