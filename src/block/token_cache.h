// Per-token-count objects of a plan (its GEMMs, whose kernels a GEMM library chooses per shape):
// a plan takes any token count up to its maximum in each call (lnmlp_plan_forward's tokens), and
// a backend makes what a count needs the first time a call has that count, keeping the most
// recently used ones. The plan's maximum count is made at plan creation and never evicted.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace lnmlp::block {

template <typename V> class TokenCache {
 public:
  // Counts other than the pinned one kept at once (lnmlp.h promises 32).
  static constexpr int kCapacity = 32;

  TokenCache() { entries_.reserve(kCapacity); }

  // The value for the plan's maximum count, made at plan creation.
  void pin(int64_t tokens, std::unique_ptr<V> value) {
    pinned_tokens_ = tokens;
    pinned_ = std::move(value);
  }
  V& pinned() { return *pinned_; }

  // The value for `tokens`: the pinned one, a kept one, or make(tokens) (which may throw, leaving
  // the cache as it was), replacing the least recently used when the cache is full.
  template <typename Make> V& get(int64_t tokens, Make&& make) {
    if (tokens == pinned_tokens_) return *pinned_;
    for (Entry& e : entries_) {
      if (e.tokens == tokens) {
        e.last_use = ++clock_;
        return *e.value;
      }
    }
    std::unique_ptr<V> made = make(tokens);
    Entry fresh{tokens, ++clock_, std::move(made)};
    if (static_cast<int>(entries_.size()) < kCapacity) {
      entries_.push_back(std::move(fresh));
      return *entries_.back().value;
    }
    Entry* oldest = &entries_.front();
    for (Entry& e : entries_)
      if (e.last_use < oldest->last_use) oldest = &e;
    *oldest = std::move(fresh);
    return *oldest->value;
  }

  // Drops every value (the pinned one too).
  void clear() noexcept {
    entries_.clear();
    pinned_.reset();
    pinned_tokens_ = -1;
  }

 private:
  struct Entry {
    int64_t tokens;
    uint64_t last_use;
    std::unique_ptr<V> value;
  };
  int64_t pinned_tokens_ = -1;
  std::unique_ptr<V> pinned_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace lnmlp::block
