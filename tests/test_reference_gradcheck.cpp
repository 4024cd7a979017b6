// The float64 reference checks itself: its gradients against central finite differences of its
// own forward (L = sum(y * dy)), every activation's derivative against finite differences of its
// value, and a few values against independently known numbers, so the yardstick of
// test_numerics.cpp is known to be right before it judges the library.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lnmlp.h"
#include "reference.h"
#include "test_util.h"
#include "tolerances.h"

namespace lnmlp_test {
namespace {

using lnmlp_ref::Config;
using lnmlp_ref::Norm;
using lnmlp_ref::Params;

double loss(const Config& c, const std::vector<double>& x, const Params& p, const std::vector<double>& dy) {
  const auto y = lnmlp_ref::forward(c, x, p);
  double s = 0.0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
  return s;
}

// Central difference of L with respect to every element of *v (which lives in x or p).
std::vector<double> numeric_grad(const Config& c, std::vector<double>& x, Params& p, const std::vector<double>& dy,
                                 std::vector<double>* v) {
  std::vector<double> g(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    const double orig = (*v)[i];
    const double step = 1e-5 * std::max(1.0, std::fabs(orig));
    (*v)[i] = orig + step;
    const double lp = loss(c, x, p, dy);
    (*v)[i] = orig - step;
    const double lm = loss(c, x, p, dy);
    (*v)[i] = orig;
    g[i] = (lp - lm) / (2.0 * step);
  }
  return g;
}

struct GradCase {
  Norm norm;
  bool zc;
  std::vector<int> acts;
  double h_std;
  std::string name;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class ReferenceGradcheck : public ::testing::TestWithParam<GradCase> {};

TEST_P(ReferenceGradcheck, GradientsMatchFiniteDifferences) {
  const GradCase& k = GetParam();
  Config c;
  c.tokens = 3;
  c.hidden = 5;
  c.ffn = 4;
  c.norm = k.norm;
  c.zero_centered_gamma = k.zc;
  c.acts = k.acts;
  c.has_bias1 = c.has_bias2 = true;
  c.epsilon = 1e-3;  // large enough that the eps terms of the norm's gradient matter
  if (k.acts[0] == LNMLP_ACT_CLAMPED_SILU) {
    c.limit = 1.25;
    c.alpha = 1.3;
    c.offset = 0.4;
  }
  // f32 rounding is irrelevant here; the problem builder is only a convenient input source.
  Problem pr = make_problem(c, LNMLP_DTYPE_F32, hash_name(k.name), InputScales{k.h_std});
  std::vector<double> x = pr.x;
  Params p = pr.p;

  // Finite differences are meaningless across a kink: require every h to be well away from them,
  // and (for the clamped pair) on both sides of the limits.
  const auto f = lnmlp_ref::forward_full(c, x, p);
  const int64_t F = c.ffn, A = static_cast<int64_t>(c.acts.size());
  int beyond = 0;
  for (size_t i = 0; i < f.h.size(); ++i) {
    const int fn = c.acts[static_cast<size_t>((static_cast<int64_t>(i) % (A * F)) / F)];
    for (const auto& kink : lnmlp_ref::act_kinks(fn, c)) {
      ASSERT_GT(std::fabs(f.h[i] - kink.at), 1e-3) << "h[" << i << "] is at a kink; pick another seed";
      if (kink.at > 0 ? f.h[i] > kink.at : f.h[i] < kink.at) ++beyond;
    }
  }
  if (k.acts[0] == LNMLP_ACT_CLAMPED_SILU) {
    ASSERT_GT(beyond, 1) << "no h beyond the limits";
  }

  const auto g = lnmlp_ref::backward(c, x, p, pr.dy);
  struct Item {
    const char* name;
    const std::vector<double>* analytic;
    std::vector<double>* var;
  };
  std::vector<Item> items = {{"dx", &g.dx, &x},         {"dgamma", &g.dgamma, &p.gamma}, {"dW1", &g.dw1, &p.w1},
                             {"db1", &g.db1, &p.b1},    {"dW2", &g.dw2, &p.w2},          {"db2", &g.db2, &p.b2}};
  if (k.norm == Norm::LayerNorm) {
    items.push_back({"dbeta", &g.dbeta, &p.beta});
  } else {
    EXPECT_TRUE(g.dbeta.empty());
  }
  for (const Item& it : items) {
    const auto num = numeric_grad(c, x, p, pr.dy, it.var);
    EXPECT_TRUE(within_tolerance(it.name, *it.analytic, num, nullptr, Tolerance{1e-12, kGradcheckRtol}));
  }
}

std::vector<GradCase> grad_cases() {
  std::vector<GradCase> v;
  for (Norm n : {Norm::LayerNorm, Norm::RmsNorm})
    for (bool zc : {false, true}) {
      const std::string base = std::string(n == Norm::LayerNorm ? "ln" : "rms") + (zc ? "_zc" : "");
      v.push_back({n, zc, {LNMLP_ACT_GELU}, 1.5, base + "_gelu"});
      v.push_back({n, zc, {LNMLP_ACT_RELU}, 1.5, base + "_relu"});
      v.push_back({n, zc, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}, 1.5, base + "_swiglu"});
      v.push_back({n, zc, {LNMLP_ACT_QUICK_GELU, LNMLP_ACT_SIGMOID}, 1.5, base + "_quick_gelu_sigmoid"});
      v.push_back({n, zc, {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR}, 2.0, base + "_clamped"});
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Reference, ReferenceGradcheck, ::testing::ValuesIn(grad_cases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// Every activation's act_grad against a central difference of act_value, away from kinks.
TEST(ReferenceActivations, DerivativesMatchFiniteDifferences) {
  Config def;  // limit 7, alpha 1.702, offset 1
  Config custom;
  custom.limit = 1.5;
  custom.alpha = 0.8;
  custom.offset = -0.3;
  const double points[] = {-9.0, -7.5, -3.1, -1.3, -0.4, -0.05, 0.05, 0.27, 0.9, 1.4, 2.2, 5.5, 6.9, 7.5, 9.0};
  for (const Config* c : {&def, &custom})
    for (int act = LNMLP_ACT_LINEAR; act <= LNMLP_ACT_CLAMPED_LINEAR; ++act)
      for (double v : points) {
        bool near_kink = false;
        for (const auto& k : lnmlp_ref::act_kinks(act, *c)) near_kink |= std::fabs(v - k.at) < 1e-3;
        if (near_kink) continue;
        const double step = 1e-6;
        const double num =
            (lnmlp_ref::act_value(act, v + step, *c) - lnmlp_ref::act_value(act, v - step, *c)) / (2.0 * step);
        const double an = lnmlp_ref::act_grad(act, v, *c);
        EXPECT_NEAR(an, num, 1e-7 * std::max(1.0, std::fabs(an))) << "activation " << act << " at " << v
                                                                   << " (limit " << c->limit << ")";
      }
}

// The kink list is what the derivatives say: the jump at each kink is the one-sided difference.
TEST(ReferenceActivations, KinksAreWhereTheDerivativeJumps) {
  Config c;
  c.limit = 2.0;
  c.alpha = 1.1;
  for (int act = LNMLP_ACT_LINEAR; act <= LNMLP_ACT_CLAMPED_LINEAR; ++act) {
    for (const auto& k : lnmlp_ref::act_kinks(act, c)) {
      const double jump = std::fabs(lnmlp_ref::act_grad(act, k.at + 1e-9, c) - lnmlp_ref::act_grad(act, k.at - 1e-9, c));
      EXPECT_NEAR(jump, k.jump, 1e-6) << "activation " << act << " at " << k.at;
      EXPECT_GT(jump, 0.1);
    }
  }
  EXPECT_EQ(lnmlp_ref::act_kinks(LNMLP_ACT_RELU, c).size(), 1u);
  EXPECT_EQ(lnmlp_ref::act_kinks(LNMLP_ACT_CLAMPED_SILU, c).size(), 1u);
  EXPECT_EQ(lnmlp_ref::act_kinks(LNMLP_ACT_CLAMPED_LINEAR, c).size(), 2u);
}

// Values from outside this code (computed independently in Python's math module from the activation
// table's formulas in docs/design.md), so that a wrong constant in the reference cannot go unnoticed.
TEST(ReferenceActivations, KnownValues) {
  Config c;  // limit 7, alpha 1.702, offset 1
  EXPECT_NEAR(lnmlp_ref::act_value(LNMLP_ACT_GELU, 1.0, c), 0.8411919906082768, 1e-14);     // tanh approximation
  EXPECT_NEAR(lnmlp_ref::act_value(LNMLP_ACT_GELU, -0.5, c), -0.15428599017485606, 1e-14);
  EXPECT_NEAR(lnmlp_ref::act_value(LNMLP_ACT_QUICK_GELU, 1.0, c), 0.8457957659328212, 1e-14);
  EXPECT_NEAR(lnmlp_ref::act_value(LNMLP_ACT_SILU, 1.0, c), 0.7310585786300049, 1e-14);
  EXPECT_NEAR(lnmlp_ref::act_value(LNMLP_ACT_SIGMOID, 0.3, c), 0.574442516811659, 1e-14);
  EXPECT_EQ(lnmlp_ref::act_value(LNMLP_ACT_RELU, -2.0, c), 0.0);
  EXPECT_EQ(lnmlp_ref::act_value(LNMLP_ACT_SQUARED_RELU, 3.0, c), 9.0);
  EXPECT_EQ(lnmlp_ref::act_value(LNMLP_ACT_SQUARED_RELU, -3.0, c), 0.0);
  // Clamped SwiGLU: a' = min(a, 7) -> 7 * sigmoid(1.702 * 7); clip(b) + 1.
  EXPECT_NEAR(lnmlp_ref::act_value(LNMLP_ACT_CLAMPED_SILU, 9.0, c), 7.0 / (1.0 + std::exp(-1.702 * 7.0)), 1e-14);
  EXPECT_EQ(lnmlp_ref::act_value(LNMLP_ACT_CLAMPED_LINEAR, 9.0, c), 8.0);
  EXPECT_EQ(lnmlp_ref::act_value(LNMLP_ACT_CLAMPED_LINEAR, -9.0, c), -6.0);
  EXPECT_EQ(lnmlp_ref::act_value(LNMLP_ACT_CLAMPED_LINEAR, 0.5, c), 1.5);
  EXPECT_EQ(lnmlp_ref::act_grad(LNMLP_ACT_CLAMPED_SILU, 7.5, c), 0.0);
  EXPECT_EQ(lnmlp_ref::act_grad(LNMLP_ACT_CLAMPED_LINEAR, -7.5, c), 0.0);
}

// A block small enough to do by hand: T=1, H=2, F=1, layernorm, eps=0, relu.
//   x = [1, 3]: mu = 2, var = 1, xhat = [-1, 1]; gamma = [1, 2], beta = [0.5, 0] -> n = [-0.5, 2]
//   W1 = [[1], [1]], b1 = [0.25] -> h = 1.75 -> relu 1.75; W2 = [[2, -1]], b2 = [0, 1] -> y = [3.5, -0.75]
TEST(ReferenceForward, HandComputedBlock) {
  Config c;
  c.tokens = 1;
  c.hidden = 2;
  c.ffn = 1;
  c.epsilon = 0.0;
  c.acts = {LNMLP_ACT_RELU};
  c.has_bias1 = c.has_bias2 = true;
  Params p;
  p.gamma = {1.0, 2.0};
  p.beta = {0.5, 0.0};
  p.w1 = {1.0, 1.0};
  p.b1 = {0.25};
  p.w2 = {2.0, -1.0};
  p.b2 = {0.0, 1.0};
  const auto y = lnmlp_ref::forward(c, {1.0, 3.0}, p);
  ASSERT_EQ(y.size(), 2u);
  EXPECT_DOUBLE_EQ(y[0], 3.5);
  EXPECT_DOUBLE_EQ(y[1], -0.75);
  // rmsnorm, zero-centered gamma: x = [3, 4], ms = 12.5, rs = 1/sqrt(12.5); gain = gamma + 1 = [1, 2]
  //   n = [3, 8] / sqrt(12.5); h = 11 / sqrt(12.5) + 0.25; y = h * [2, -1] + [0, 1]
  c.norm = Norm::RmsNorm;
  c.zero_centered_gamma = true;
  p.gamma = {0.0, 1.0};
  const auto y2 = lnmlp_ref::forward(c, {3.0, 4.0}, p);
  const double h = 11.0 / std::sqrt(12.5) + 0.25;
  EXPECT_NEAR(y2[0], 2.0 * h, 1e-14);
  EXPECT_NEAR(y2[1], 1.0 - h, 1e-14);
}

// Our bf16 conversion rounds to nearest even straight from double.
TEST(TestUtil, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_double(1.0), 0x3F80);
  EXPECT_EQ(bf16_from_double(1.0 + 1.0 / 256), 0x3F80);             // tie -> even (down)
  EXPECT_EQ(bf16_from_double(1.0 + 3.0 / 256), 0x3F82);             // tie -> even (up)
  EXPECT_EQ(bf16_from_double(1.0 + 1.0 / 256 + 1e-12), 0x3F81);     // just above the tie (double precision)
  EXPECT_EQ(bf16_from_double(-2.5), 0xC020);
  EXPECT_EQ(bf16_from_double(1e39), 0x7F80);                        // overflow -> inf
  EXPECT_EQ(bf16_from_double(3.3895313892515355e38), 0x7F7F);       // max finite
  EXPECT_EQ(bf16_to_double(bf16_from_double(0x1.0p-133)), 0x1.0p-133);  // smallest subnormal
  EXPECT_EQ(f16_from_double(1.0), 0x3C00);
  EXPECT_EQ(f16_from_double(65504.0), 0x7BFF);
  EXPECT_EQ(f16_to_double(0x3555), 0.333251953125);
}

}  // namespace
}  // namespace lnmlp_test
