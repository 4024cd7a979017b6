// An independent float64 reference of the block, written plainly (loops, no shared code with the
// library): the yardstick for the library's numerics in the tests and in lnmlp-bench.
//
// It computes the exact math of docs/design.md, "What is computed" in double precision, without the intermediate
// roundings the library performs in bf16/f16; the per-dtype tolerances (tests/tolerances.h)
// account for those.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace lnmlp_ref {

enum class Norm { LayerNorm, RmsNorm };

// Activation ids use the public LNMLP_ACT_* values (0 linear, 1 relu, 2 gelu, 3 silu,
// 4 quick_gelu, 5 squared_relu, 6 sigmoid, 7 clamped_silu, 8 clamped_linear).
struct Config {
  int64_t tokens = 1, hidden = 1, ffn = 1;
  Norm norm = Norm::LayerNorm;
  bool zero_centered_gamma = false;
  double epsilon = 1e-6;
  std::vector<int> acts{1};                           // 1 or 2 entries
  double limit = 7.0, alpha = 1.702, offset = 1.0;    // clamped SwiGLU
  bool has_bias1 = false, has_bias2 = false;
};

// The configuration most tests start from: T x H x F with both biases, the given activations and
// norm, everything else at its default.
inline Config biased_config(int64_t tokens, int64_t hidden, int64_t ffn, std::vector<int> acts,
                            Norm norm = Norm::LayerNorm) {
  Config c;
  c.tokens = tokens;
  c.hidden = hidden;
  c.ffn = ffn;
  c.norm = norm;
  c.acts = std::move(acts);
  c.has_bias1 = c.has_bias2 = true;
  return c;
}

// Row-major, shapes as in docs/design.md: x [T,H], gamma/beta [H], w1 [H,A,F], b1 [A,F], w2 [F,H], b2 [H].
// beta is ignored for rmsnorm; b1/b2 are ignored when disabled.
struct Params {
  std::vector<double> gamma, beta, w1, b1, w2, b2;
};

struct Grads {
  std::vector<double> dx, dgamma, dbeta, dw1, db1, dw2, db2;  // dbeta/db1/db2 empty when absent
};

// y [T,H]
std::vector<double> forward(const Config& c, const std::vector<double>& x, const Params& p);

// Gradients of L = sum(y * dy).
Grads backward(const Config& c, const std::vector<double>& x, const Params& p, const std::vector<double>& dy);

// f(v) and f'(v) of one activation, exposed for the finite-difference test of the reference.
double act_value(int act, double v, const Config& c);
double act_grad(int act, double v, const Config& c);

// ---- Additions for the tests (not needed to compute the block) ----

// The forward pass's intermediates, in double: what backward uses, and what the tests need to
// reason about where the library's rounded values may fall on the other side of a kink.
struct Forward {
  std::vector<double> mu, rs;  // [T] (mu is 0 for rmsnorm)
  std::vector<double> xhat;    // [T,H] (x - mu) * rs
  std::vector<double> n;       // [T,H] norm output
  std::vector<double> h;       // [T,A,F] GEMM1 output + b1
  std::vector<double> a;       // [T,F] activation output
  std::vector<double> y;       // [T,H]
};
Forward forward_full(const Config& c, const std::vector<double>& x, const Params& p);

// Points where act's derivative jumps (it is continuous everywhere else), with the jump size
// |f'(k+) - f'(k-)|: relu at 0, clamped_silu at limit, clamped_linear at -limit and limit.
struct Kink {
  double at, jump;
};
std::vector<Kink> act_kinks(int act, const Config& c);

}  // namespace lnmlp_ref
