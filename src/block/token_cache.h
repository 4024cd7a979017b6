// Per-token-count objects of a plan (its GEMMs, whose kernels a GEMM library chooses per shape):
// a plan takes any token count up to its maximum in each call (lnmlp_plan_forward's tokens), and
// a backend makes what a count needs at plan creation for the plan's maximum count and the counts
// the descriptor asked it to prepare (lnmlp_desc_set_prepared_tokens), which are never evicted,
// and for any other count the first time a call has it, keeping the most recently used ones.
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

  // A value made at plan creation, kept for the plan's life: first the plan's maximum count's,
  // then each count it was asked to prepare (a count already pinned is not pinned again).
  void pin(int64_t tokens, std::unique_ptr<V> value) {
    if (pinned(tokens) == nullptr) pinned_.push_back(Entry{tokens, 0, std::move(value)});
  }
  // The plan's maximum count's value (the first pinned).
  V& pinned() { return *pinned_.front().value; }
  // The value pinned for `tokens`, or NULL.
  V* pinned(int64_t tokens) {
    for (Entry& e : pinned_)
      if (e.tokens == tokens) return e.value.get();
    return nullptr;
  }

  // The value for `tokens`: a pinned one, a kept one, or make(tokens) (which may throw, leaving
  // the cache as it was), replacing the least recently used when the cache is full.
  template <typename Make> V& get(int64_t tokens, Make&& make) {
    if (V* p = pinned(tokens)) return *p;
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

  // Drops every value (the pinned ones too).
  void clear() noexcept {
    entries_.clear();
    pinned_.clear();
  }

 private:
  struct Entry {
    int64_t tokens;
    uint64_t last_use;
    std::unique_ptr<V> value;
  };
  std::vector<Entry> pinned_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;
};

}  // namespace lnmlp::block
