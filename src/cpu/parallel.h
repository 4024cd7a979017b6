// Row-parallel loops for the CPU backend's own kernels (OpenMP, the runtime oneDNN uses too).
#pragma once

#include "isa.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace lnmlp::cpu {
inline namespace LNMLP_CPU_ISA {

// Splits [0, n) into `chunks` contiguous ranges and runs body(begin, end, chunk) for each, in
// parallel on `threads` threads. The split depends only on n and chunks, so per-chunk partial sums
// reduced in chunk order give the same bits whatever the scheduling.
template <typename Body> void parallel_chunks(int threads, int chunks, int64_t n, Body&& body) {
  const int64_t per = (n + chunks - 1) / chunks;
  if (threads == 1) {  // no parallel region: libgomp allocates a team for each one, even of one thread
    for (int c = 0; c < chunks; ++c) {
      const int64_t begin = std::min<int64_t>(n, c * per);
      const int64_t end = std::min<int64_t>(n, begin + per);
      if (begin < end) body(begin, end, c);
    }
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int c = 0; c < chunks; ++c) {
    const int64_t begin = std::min<int64_t>(n, c * per);
    const int64_t end = std::min<int64_t>(n, begin + per);
    if (begin < end) body(begin, end, c);
  }
}

// Sets this thread's OpenMP thread count for the lifetime of the object (the GEMM library reads
// it), restoring the previous value afterwards.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedOmpThreads() { omp_set_num_threads(previous_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int previous_;
};

}  // namespace LNMLP_CPU_ISA
}  // namespace lnmlp::cpu
