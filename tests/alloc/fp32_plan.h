// An fp32 plan (LayerNorm, relu, both biases, one thread) with every buffer of its calls, filled
// with a fixed pseudo-random pattern: what the memory-pressure tests of this folder run.
#pragma once

#include <cstdint>
#include <cstdio>
#include <vector>

#include "lnmlp.h"

// The descriptor of an Fp32Plan: LayerNorm, relu, both biases, one thread, `recipe`, made for
// `tokens` with the counts `prepared` prepared (lnmlp_desc_set_prepared_tokens).
inline lnmlp_desc* fp32_plan_desc(int64_t tokens, int64_t hidden, int64_t ffn, int32_t recipe,
                                  const std::vector<int64_t>& prepared = {}) {
  lnmlp_desc* d = nullptr;
  lnmlp_desc_create(&d);
  lnmlp_desc_set_shape(d, tokens, hidden, ffn);
  lnmlp_desc_set_prepared_tokens(d, static_cast<int32_t>(prepared.size()), prepared.data());
  lnmlp_desc_set_bias(d, 1, 1);
  lnmlp_desc_set_num_threads(d, 1);
  lnmlp_desc_set_recipe(d, recipe);
  return d;
}

struct Fp32Plan {
  const int64_t T, H, F;  // T: the tokens of every call
  lnmlp_plan* plan = nullptr;
  std::vector<float> x, g, b, w1, b1, w2, b2, dy;        // inputs
  std::vector<float> y, dx, dg, db, dw1, db1, dw2, db2;  // outputs
  std::vector<unsigned char> saved_store;
  void* saved = nullptr;  // 64-byte aligned, inside saved_store

  // A plan made for max_tokens (0: T) tokens, with the token counts `prepared` prepared at plan
  // creation (lnmlp_desc_set_prepared_tokens).
  Fp32Plan(int64_t tokens, int64_t hidden, int64_t ffn, int32_t recipe, int64_t max_tokens = 0,
           const std::vector<int64_t>& prepared = {})
      : T(tokens), H(hidden), F(ffn) {
    lnmlp_desc* d = fp32_plan_desc(max_tokens > 0 ? max_tokens : T, H, F, recipe, prepared);
    if (lnmlp_plan_create(d, &plan) != LNMLP_SUCCESS) std::printf("plan_create: %s\n", lnmlp_last_error());
    lnmlp_desc_destroy(d);
    int64_t saved_bytes = 0;
    lnmlp_plan_get_saved_bytes(plan, &saved_bytes);
    saved_store.resize(static_cast<size_t>(saved_bytes) + 64);
    saved = saved_store.data() + (64 - reinterpret_cast<uintptr_t>(saved_store.data()) % 64) % 64;
    unsigned seed = 7;
    const auto fill = [&](std::vector<float>& v, int64_t n, float scale) {
      v.resize(static_cast<size_t>(n));
      for (float& e : v)
        e = scale * (static_cast<float>((seed = seed * 1103515245u + 12345u) >> 8) / 16777216.0f - 0.5f);
    };
    fill(x, T * H, 2.0f), fill(g, H, 1.0f), fill(b, H, 0.2f), fill(w1, H * F, 0.2f), fill(b1, F, 0.2f);
    fill(w2, F * H, 0.2f), fill(b2, H, 0.2f), fill(dy, T * H, 1.0f);
    for (auto* v : {&y, &dx}) v->assign(static_cast<size_t>(T * H), 0.0f);
    for (auto* v : {&dg, &db, &db2}) v->assign(static_cast<size_t>(H), 0.0f);
    dw1.assign(static_cast<size_t>(H * F), 0.0f), db1.assign(static_cast<size_t>(F), 0.0f);
    dw2.assign(static_cast<size_t>(F * H), 0.0f);
  }
  ~Fp32Plan() { lnmlp_plan_destroy(plan); }
  Fp32Plan(const Fp32Plan&) = delete;
  Fp32Plan& operator=(const Fp32Plan&) = delete;

  int32_t forward(int32_t flags = LNMLP_CALL_DEFAULT) {
    return lnmlp_plan_forward(plan, T, x.data(), g.data(), b.data(), w1.data(), b1.data(), w2.data(), b2.data(),
                              y.data(), saved, nullptr, flags, nullptr);
  }
  int32_t backward() {
    return lnmlp_plan_backward(plan, T, dy.data(), x.data(), g.data(), b.data(), w1.data(), b1.data(), w2.data(), saved,
                               dx.data(), dg.data(), db.data(), dw1.data(), db1.data(), dw2.data(), db2.data(), nullptr,
                               LNMLP_CALL_DEFAULT, nullptr);
  }
  // Every output, in one vector.
  std::vector<float> outputs() const {
    std::vector<float> all;
    for (const auto* v : {&y, &dx, &dg, &db, &dw1, &db1, &dw2, &db2}) all.insert(all.end(), v->begin(), v->end());
    return all;
  }
};
