// What the CUDA backend keeps of cuBLASLt's heuristic for one GEMM: its algorithms, and the one in
// use. Host code without CUDA types, so that it is tested without a GPU
// (tests/gpu/test_cuda_host.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace lnmlp::cuda {

// How many algorithms a GEMM asks the heuristic for, and keeps as fallbacks.
constexpr int kGemmAlgorithmCandidates = 4;

// The algorithms the heuristic offered for one GEMM, best first, and the one in use. cuBLASLt may
// refuse at run time an algorithm its heuristic offered (for the run's pointers, or after a
// library update); a run then tries the next ones in order and keeps the first that runs, so a
// refusal costs one failed call once, not the call.
template <typename Algo> class GemmAlgorithms {
 public:
  void add(const Algo& algo, int64_t workspace_bytes) { candidates_.push_back({algo, workspace_bytes}); }
  bool empty() const { return candidates_.empty(); }
  int count() const { return static_cast<int>(candidates_.size()); }
  int in_use() const { return current_; }

  // The workspace every candidate fits in: the run offers all of it to whichever runs.
  int64_t workspace_bytes() const {
    int64_t most = 0;
    for (const auto& c : candidates_) most = c.second > most ? c.second : most;
    return most;
  }

  // Calls try_run(algo) on the algorithm in use, then on the others in order (from the best),
  // until one returns the status type's success (its zero value); that one stays in use. Returns
  // the first refusal's status when every candidate refuses (the one in use unchanged).
  template <typename TryRun> auto run(TryRun&& try_run) -> decltype(try_run(std::declval<const Algo&>())) {
    using Status = decltype(try_run(std::declval<const Algo&>()));
    const Status first = try_run(candidates_[static_cast<size_t>(current_)].first);
    if (first == Status{}) return first;
    for (int i = 0; i < count(); ++i) {
      if (i == current_) continue;
      if (try_run(candidates_[static_cast<size_t>(i)].first) == Status{}) {
        current_ = i;
        return Status{};
      }
    }
    return first;
  }

 private:
  std::vector<std::pair<Algo, int64_t>> candidates_;
  int current_ = 0;
};

}  // namespace lnmlp::cuda
