#include "bandwidth.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>

namespace {

// 3 x 128 MiB: beyond the last-level cache of every CPU this runs on (the largest, 105 MiB on
// Sapphire Rapids, is shared by all of a socket's cores).
constexpr std::ptrdiff_t kElements = std::ptrdiff_t{1} << 25;
constexpr int kPasses = 10;

}  // namespace

Bandwidth measure_triad_bandwidth(int threads) {
  // Uninitialised on purpose: each thread writes first the pages it will stream over, so that
  // they are placed (and mapped) where that thread runs.
  std::unique_ptr<float[]> a(new float[kElements]), b(new float[kElements]), c(new float[kElements]);
  float* const pa = a.get();
  float* const pb = b.get();
  float* const pc = c.get();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::ptrdiff_t i = 0; i < kElements; ++i) {
    pa[i] = 0.0f;
    pb[i] = 1.0f;
    pc[i] = 2.0f;
  }
  double best = 1e30;
  for (int pass = 0; pass < kPasses; ++pass) {
    const float s = 0.5f + static_cast<float>(pass) * 1e-3f;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (std::ptrdiff_t i = 0; i < kElements; ++i) pa[i] = pb[i] + s * pc[i];
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Keep the result observable, or the passes could be dropped.
  volatile float sink = pa[kElements / 2];
  (void)sink;
  const double bytes = 3.0 * sizeof(float) * static_cast<double>(kElements);
  return {bytes / best * 1e-9, static_cast<double>(kElements) * sizeof(float) / 1048576.0};
}
