// The library's numerics against the float64 reference, through the public C API only.
//
// Each case builds inputs in double, rounds them to the case's dtype, and gives the SAME rounded
// values to the library and to the reference; then compares y and every gradient with the
// per-dtype tolerance of tests/tolerances.h (normalised max error), and checks the invariances:
// every remat policy gives the bits of SAVE_ALL, FORWARD_ONLY's y is SAVE_ALL's y, the saved bytes
// per token follow the formula documented in lnmlp.h, and an external workspace gives the bits of
// an owned one.
//
// The sweep covers every factor without the full cartesian product (see sweep() below):
//   A. every activation and gated pair x every dtype, on one small odd shape, with norm,
//      zero-centered gamma and biases rotating through their values;
//   B. shapes (T = 1, H and F not multiples of 8 or 16) x dtypes x norms;
//   C. bias combinations x norms x zero-centered gamma, dtypes rotating;
//   D. two threads instead of one, on the larger shapes x dtypes.
// A summary of the largest normalised error per dtype and tensor is printed at the end.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "lnmlp.h"
#include "reference.h"
#include "test_util.h"
#include "tolerances.h"

namespace lnmlp_test {
namespace {

constexpr const char* kActNames[] = {"linear",       "relu",    "gelu",         "silu",          "quick_gelu",
                                     "squared_relu", "sigmoid", "clamped_silu", "clamped_linear"};

struct Case {
  int64_t T = 3, H = 13, F = 11;
  bool rms = false;
  bool zc = false;
  std::vector<int> acts{LNMLP_ACT_RELU};
  bool custom_clamp = false;  // non-default limit / alpha / offset
  bool b1 = false, b2 = false;
  int32_t dtype = LNMLP_DTYPE_F32;
  int32_t threads = 1;
  double h_std = 1.5;
  float eps = 1e-6f;  // the library's default

  static Case of_shape(int64_t tokens, int64_t hidden, int64_t ffn) {
    Case c;
    c.T = tokens;
    c.H = hidden;
    c.F = ffn;
    return c;
  }

  lnmlp_ref::Config config() const {
    lnmlp_ref::Config c;
    c.tokens = T;
    c.hidden = H;
    c.ffn = F;
    c.norm = rms ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm;
    c.zero_centered_gamma = zc;
    c.epsilon = static_cast<double>(eps);  // exactly the float the library gets
    c.acts = acts;
    if (custom_clamp) {
      c.limit = static_cast<double>(1.5f);
      c.alpha = static_cast<double>(1.2f);
      c.offset = static_cast<double>(0.25f);
    } else {
      c.limit = static_cast<double>(7.0f);
      c.alpha = static_cast<double>(1.702f);
      c.offset = static_cast<double>(1.0f);
    }
    c.has_bias1 = b1;
    c.has_bias2 = b2;
    return c;
  }

  std::string name() const {
    std::string s = "T" + std::to_string(T) + "_H" + std::to_string(H) + "_F" + std::to_string(F);
    s += rms ? "_rms" : "_ln";
    if (zc) s += "_zc";
    for (int a : acts) s += std::string("_") + kActNames[a];
    if (custom_clamp) s += "_lim1p5";
    s += b1 ? (b2 ? "_b1b2" : "_b1") : (b2 ? "_b2" : "_nobias");
    s += std::string("_") + dtype_label(dtype);
    if (threads != 1) s += "_thr" + std::to_string(threads);
    if (eps != 1e-6f) s += "_eps" + std::to_string(static_cast<int>(eps * 1000)) + "em3";
    return s;
  }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<Case> sweep() {
  std::vector<Case> v;
  const int32_t dtypes[] = {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16};

  // A. Every activation alone, each with linear as the gate's second function, one gated pair
  //    with a non-linear second, and the clamped SwiGLU (default and non-default parameters),
  //    x every dtype.
  std::vector<Case> acts;
  for (int a = LNMLP_ACT_LINEAR; a <= LNMLP_ACT_SIGMOID; ++a) {
    Case c;
    c.acts = {a};
    acts.push_back(c);
    c.acts = {a, LNMLP_ACT_LINEAR};
    acts.push_back(c);
  }
  {
    Case c;
    c.acts = {LNMLP_ACT_GELU, LNMLP_ACT_SIGMOID};
    acts.push_back(c);
    c.acts = {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR};
    // Limit 7: with h's spread 5, 8% of h0 lie above it and 16% of |h1| beyond it; 8 tokens make
    // that certain. (A wider spread would cross more often but also magnify the effect of bf16's
    // rounding of h on f'(h) beyond what any fixed tolerance should absorb.)
    c.T = 8;
    c.h_std = 5.0;
    acts.push_back(c);
    c.T = 3;
    c.custom_clamp = true;  // limit 1.5
    c.h_std = 2.0;
    acts.push_back(c);
  }
  for (size_t i = 0; i < acts.size(); ++i)
    for (int d = 0; d < 3; ++d) {
      Case c = acts[i];
      const size_t k = i + static_cast<size_t>(d);
      c.rms = k % 2 == 1;
      c.zc = (k / 2) % 2 == 1;
      c.b1 = (i + 2 * static_cast<size_t>(d)) % 4 >= 2;
      c.b2 = (i + 2 * static_cast<size_t>(d)) % 2 == 1;
      c.dtype = dtypes[d];
      v.push_back(c);
    }

  // B. Shapes x dtypes x norms (swiglu, both biases).
  const int64_t shapes[][3] = {{1, 7, 5}, {3, 13, 11}, {17, 33, 29}, {64, 96, 80}};
  for (const auto& s : shapes)
    for (int32_t dt : dtypes)
      for (bool rms : {false, true}) {
        Case c = Case::of_shape(s[0], s[1], s[2]);
        c.rms = rms;
        c.zc = rms;
        c.acts = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
        c.b1 = c.b2 = true;
        c.dtype = dt;
        v.push_back(c);
      }

  // C. Bias combinations x norms x zero-centered gamma (geglu), dtypes rotating.
  for (int bias = 0; bias < 4; ++bias)
    for (bool rms : {false, true})
      for (bool zc : {false, true}) {
        Case c = Case::of_shape(5, 19, 23);
        c.rms = rms;
        c.zc = zc;
        c.acts = {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR};
        c.b1 = (bias & 1) != 0;
        c.b2 = (bias & 2) != 0;
        c.dtype = dtypes[(bias + (rms ? 1 : 0) + (zc ? 1 : 0)) % 3];
        v.push_back(c);
      }

  //    And a large epsilon, which must enter the statistics (and their gradient) exactly as documented.
  for (bool rms : {false, true}) {
    Case c = Case::of_shape(5, 19, 23);
    c.rms = rms;
    c.acts = {LNMLP_ACT_SILU};
    c.b1 = true;
    c.eps = 0.5f;
    c.dtype = rms ? LNMLP_DTYPE_BF16 : LNMLP_DTYPE_F32;
    v.push_back(c);
  }

  // D. Two threads (the row kernels split the tokens; GEMMs run on two threads); T = 1 leaves a
  //    thread without rows.
  const int64_t big[][3] = {{1, 7, 5}, {17, 33, 29}, {64, 96, 80}};
  for (const auto& s : big)
    for (int32_t dt : dtypes) {
      Case c = Case::of_shape(s[0], s[1], s[2]);
      c.rms = dt == LNMLP_DTYPE_BF16;
      c.acts = {LNMLP_ACT_RELU, LNMLP_ACT_LINEAR};
      c.b1 = c.b2 = true;
      c.dtype = dt;
      c.threads = 2;
      v.push_back(c);
    }

  // Parts overlap (e.g. A and B both hold a small swiglu case): keep the first of each name.
  std::vector<Case> unique;
  std::set<std::string> seen;
  for (const Case& c : v)
    if (seen.insert(c.name()).second) unique.push_back(c);
  return unique;
}

bool is_clamped(const Case& c) { return c.acts.size() == 2 && c.acts[0] == LNMLP_ACT_CLAMPED_SILU; }

// Counts of the clamped pair's branches in the reference's h: h0 above / not above the limit,
// |h1| beyond / within it.
struct ClampBranches {
  int above = 0, below = 0, gate_out = 0, gate_in = 0;
  bool all() const { return above > 0 && below > 0 && gate_out > 0 && gate_in > 0; }
};
ClampBranches clamp_branches(const Problem& pr, const std::vector<double>& h) {
  ClampBranches b;
  const int64_t T = pr.cfg.tokens, F = pr.cfg.ffn;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < F; ++j) {
      const double h0 = h[static_cast<size_t>(t * 2 * F + j)], h1 = h[static_cast<size_t>(t * 2 * F + F + j)];
      (h0 > pr.cfg.limit ? b.above : b.below)++;
      (std::fabs(h1) > pr.cfg.limit ? b.gate_out : b.gate_in)++;
    }
  return b;
}

Problem problem_for(const Case& c) {
  InputScales s;
  s.h_std = c.h_std;
  // LNMLP_TEST_SEED_SALT (optional) changes every case's inputs, to explore other draws.
  const char* salt = std::getenv("LNMLP_TEST_SEED_SALT");
  const std::string seed_name = c.name() + (salt ? salt : "");
  Problem pr = make_problem(c.config(), c.dtype, hash_name(seed_name), s);
  // The clamped pair must see every branch: redraw (deterministically) until it does.
  for (int attempt = 1; is_clamped(c) && attempt < 16; ++attempt) {
    if (clamp_branches(pr, lnmlp_ref::forward_full(pr.cfg, pr.x, pr.p).h).all()) break;
    pr = make_problem(c.config(), c.dtype, hash_name(seed_name + "#" + std::to_string(attempt)), s);
  }
  return pr;
}

// ---------------------------------------------------------------------------------------------
// Kink allowance. Where the reference's h lies within the library's possible rounding distance
// of a point where the activation's derivative jumps, the library may legitimately take the other
// side; dh at that element may then differ by |da * jump * (the other gate factor)|. That
// difference e[t, j] is propagated (in absolute values, an upper bound) into db1, dW1, and through
// dn = dh W1^T into dx, dgamma and dbeta. y, dW2 and db2 do not depend on it. Everywhere else the
// allowance is 0.
// ---------------------------------------------------------------------------------------------
struct Allowance {
  std::vector<double> dx, dgamma, dbeta, dw1, db1;
  int ambiguous = 0;  // elements of h inside a kink window
};

Allowance kink_allowance(const Problem& pr, const lnmlp_ref::Forward& f) {
  const auto& c = pr.cfg;
  const auto& p = pr.p;
  const int64_t T = c.tokens, H = c.hidden, F = c.ffn, A = static_cast<int64_t>(c.acts.size()), AF = A * F;
  const bool ln = c.norm == lnmlp_ref::Norm::LayerNorm;
  Allowance al;
  al.dx.assign(static_cast<size_t>(T * H), 0.0);
  al.dgamma.assign(static_cast<size_t>(H), 0.0);
  al.dbeta.assign(ln ? static_cast<size_t>(H) : 0, 0.0);
  al.dw1.assign(static_cast<size_t>(H * AF), 0.0);
  al.db1.assign(c.has_bias1 ? static_cast<size_t>(AF) : 0, 0.0);

  // How far the library's h (before and after its rounding to the dtype) may be from the
  // reference's: ln_out rounded to the dtype, fp32 statistics and accumulation over H terms, and
  // h's own rounding. A factor 4 of margin.
  const double u = unit_roundoff(pr.dtype), u32 = unit_roundoff(LNMLP_DTYPE_F32);
  const double rel = 4.0 * (u + static_cast<double>(H + 8) * u32);

  std::vector<double> e(static_cast<size_t>(T * AF), 0.0);
  bool any = false;
  for (int64_t t = 0; t < T; ++t) {
    // da = dy W2^T for this row.
    std::vector<double> da(static_cast<size_t>(F), 0.0);
    for (int64_t j = 0; j < F; ++j)
      for (int64_t i = 0; i < H; ++i) da[static_cast<size_t>(j)] += pr.dy[static_cast<size_t>(t * H + i)] * p.w2[static_cast<size_t>(j * H + i)];
    for (int64_t col = 0; col < AF; ++col) {
      const int fn = c.acts[static_cast<size_t>(col / F)];
      const auto kinks = lnmlp_ref::act_kinks(fn, c);
      if (kinks.empty()) continue;
      const double hv = f.h[static_cast<size_t>(t * AF + col)];
      double scale = std::fabs(hv) + (c.has_bias1 ? std::fabs(p.b1[static_cast<size_t>(col)]) : 0.0);
      for (int64_t k = 0; k < H; ++k)
        scale += std::fabs(f.n[static_cast<size_t>(t * H + k)] * p.w1[static_cast<size_t>(k * AF + col)]);
      const double window = rel * scale;
      for (const auto& kink : kinks) {
        if (std::fabs(hv - kink.at) > window) continue;
        const int64_t j = col % F;
        double other = 1.0;
        if (A == 2) {
          const int64_t other_col = col < F ? col + F : col - F;
          const int other_fn = c.acts[col < F ? 1 : 0];
          other = std::fabs(lnmlp_ref::act_value(other_fn, f.h[static_cast<size_t>(t * AF + other_col)], c));
        }
        e[static_cast<size_t>(t * AF + col)] += 1.5 * std::fabs(da[static_cast<size_t>(j)]) * kink.jump * other;
        ++al.ambiguous;
        any = true;
      }
    }
  }
  if (!any) return al;

  for (int64_t t = 0; t < T; ++t)
    for (int64_t col = 0; col < AF; ++col) {
      const double ev = e[static_cast<size_t>(t * AF + col)];
      if (ev == 0.0) continue;
      if (c.has_bias1) al.db1[static_cast<size_t>(col)] += ev;
      for (int64_t k = 0; k < H; ++k)
        al.dw1[static_cast<size_t>(k * AF + col)] += std::fabs(f.n[static_cast<size_t>(t * H + k)]) * ev;
    }
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> dn(static_cast<size_t>(H), 0.0);
    for (int64_t k = 0; k < H; ++k)
      for (int64_t col = 0; col < AF; ++col)
        dn[static_cast<size_t>(k)] += e[static_cast<size_t>(t * AF + col)] * std::fabs(p.w1[static_cast<size_t>(k * AF + col)]);
    double m1 = 0.0, m2 = 0.0;
    std::vector<double> gdn(static_cast<size_t>(H));
    for (int64_t k = 0; k < H; ++k) {
      const double g = c.zero_centered_gamma ? p.gamma[static_cast<size_t>(k)] + 1.0 : p.gamma[static_cast<size_t>(k)];
      const double xh = std::fabs(f.xhat[static_cast<size_t>(t * H + k)]);
      gdn[static_cast<size_t>(k)] = std::fabs(g) * dn[static_cast<size_t>(k)];
      m1 += gdn[static_cast<size_t>(k)];
      m2 += gdn[static_cast<size_t>(k)] * xh;
      al.dgamma[static_cast<size_t>(k)] += dn[static_cast<size_t>(k)] * xh;
      if (ln) al.dbeta[static_cast<size_t>(k)] += dn[static_cast<size_t>(k)];
    }
    m1 = ln ? m1 / static_cast<double>(H) : 0.0;
    m2 /= static_cast<double>(H);
    for (int64_t k = 0; k < H; ++k)
      al.dx[static_cast<size_t>(t * H + k)] =
          f.rs[static_cast<size_t>(t)] *
          (gdn[static_cast<size_t>(k)] + m1 + std::fabs(f.xhat[static_cast<size_t>(t * H + k)]) * m2);
  }
  return al;
}

// ---------------------------------------------------------------------------------------------
// The summary: the largest normalised error seen per dtype and tensor, printed at the end.
// ---------------------------------------------------------------------------------------------
struct Worst {
  double normalised = 0.0;
  double of_bound = 0.0;  // as a fraction of the allowed bound
  std::string where;
};
std::mutex g_mu;
std::map<std::string, std::map<std::string, Worst>>& summary() {
  static std::map<std::string, std::map<std::string, Worst>> s;
  return s;
}
int g_ambiguous_cases = 0;

void record(int32_t dtype, const char* tensor, const Comparison& c, Tolerance tol, const std::string& where) {
  std::lock_guard<std::mutex> lock(g_mu);
  Worst& w = summary()[dtype_label(dtype)][tensor];
  const double bound = tol.atol + tol.rtol * c.max_ref;
  const double nrm = std::max(0.0, c.normalised());
  if (nrm >= w.normalised) {
    w.normalised = nrm;
    w.of_bound = std::max(0.0, c.worst_excess) / bound;
    w.where = where;
  }
}

class SummaryPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    if (summary().empty()) return;
    std::printf("\n[numerics summary] largest normalised error max(|got-ref|-allow)/max|ref| per dtype and tensor\n");
    std::printf("  %-5s %-7s %-12s %-10s %s\n", "dtype", "tensor", "normalised", "of bound", "case");
    for (const auto& [dt, tensors] : summary()) {
      const Tolerance tol = tolerance_for(dt == std::string("f32") ? LNMLP_DTYPE_F32
                                          : dt == std::string("bf16") ? LNMLP_DTYPE_BF16
                                                                      : LNMLP_DTYPE_F16);
      for (const char* t : {"y", "dx", "dgamma", "dbeta", "dW1", "db1", "dW2", "db2"}) {
        auto it = tensors.find(t);
        if (it == tensors.end()) continue;
        std::printf("  %-5s %-7s %-12.3e %-10.3f %s\n", dt.c_str(), t, it->second.normalised, it->second.of_bound,
                    it->second.where.c_str());
      }
      std::printf("  %-5s (rtol %.3g, atol %.3g)\n", dt.c_str(), tol.rtol, tol.atol);
    }
    std::printf("  cases with h inside a kink window (allowance used): %d\n", g_ambiguous_cases);
  }
};
[[maybe_unused]] ::testing::Environment* const g_summary_env =
    ::testing::AddGlobalTestEnvironment(new SummaryPrinter);

// ---------------------------------------------------------------------------------------------
// The tests.
// ---------------------------------------------------------------------------------------------
class Numerics : public ::testing::TestWithParam<Case> {};

TEST_P(Numerics, MatchesReference) {
  const Case& k = GetParam();
  const Problem pr = problem_for(k);
  const auto f = lnmlp_ref::forward_full(pr.cfg, pr.x, pr.p);
  const auto g = lnmlp_ref::backward(pr.cfg, pr.x, pr.p, pr.dy);
  const Allowance al = kink_allowance(pr, f);
  if (al.ambiguous > 0) {
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_ambiguous_cases;
  }

  if (is_clamped(k)) {  // the inputs must exercise every branch of the clamped pair
    const ClampBranches b = clamp_branches(pr, f.h);
    ASSERT_GT(b.above, 0) << "no h0 above the limit: the test would not exercise the clamp";
    ASSERT_GT(b.below, 0);
    ASSERT_GT(b.gate_out, 0) << "no |h1| beyond the limit: the test would not exercise the clip";
    ASSERT_GT(b.gate_in, 0);
  }

  RunOptions o;
  o.num_threads = k.threads;
  const RunResult r = run_library(pr, o);
  const Tolerance tol = tolerance_for(k.dtype);
  const std::vector<double> none;
  struct Item {
    const char* name;
    const Buffer* got;
    const std::vector<double>* ref;
    const std::vector<double>* allow;
  };
  const bool ln = !k.rms;
  std::vector<Item> items = {{"y", &r.y, &f.y, nullptr},
                             {"dx", &r.dx, &g.dx, &al.dx},
                             {"dgamma", &r.dgamma, &g.dgamma, &al.dgamma},
                             {"dW1", &r.dw1, &g.dw1, &al.dw1},
                             {"dW2", &r.dw2, &g.dw2, nullptr}};
  if (ln) items.push_back({"dbeta", &r.dbeta, &g.dbeta, &al.dbeta});
  if (k.b1) items.push_back({"db1", &r.db1, &g.db1, &al.db1});
  if (k.b2) items.push_back({"db2", &r.db2, &g.db2, nullptr});
  for (const Item& it : items) {
    Comparison c;
    EXPECT_TRUE(within_tolerance(it.name, it.got->to_doubles(), *it.ref, it.allow, tol, &c))
        << "(" << al.ambiguous << " elements of h near a kink)";
    record(k.dtype, it.name, c, tol, k.name());
  }
}

// Every remat policy computes the same numbers (recomputation repeats forward's arithmetic
// exactly), FORWARD_ONLY's y is SAVE_ALL's, and the saved bytes per token are the documented ones.
TEST_P(Numerics, RematPoliciesAreBitIdenticalAndSavedBytesMatchTheFormula) {
  const Case& k = GetParam();
  const Problem pr = problem_for(k);
  const int64_t e = dtype_size(k.dtype), A = static_cast<int64_t>(k.acts.size());
  const int64_t stats = k.rms ? 4 : 8;
  struct Policy {
    int32_t remat;
    const char* name;
    int64_t per_token;  // lnmlp.h, LNMLP_REMAT_*
  };
  const Policy policies[] = {
      {LNMLP_REMAT_SAVE_ALL, "SAVE_ALL", stats + e * (k.H + A * k.F + k.F)},
      {LNMLP_REMAT_SAVE_FFN1, "SAVE_FFN1", stats + e * A * k.F},
      {LNMLP_REMAT_SAVE_STATS, "SAVE_STATS", stats},
      {LNMLP_REMAT_FORWARD_ONLY, "FORWARD_ONLY", 0},
  };
  RunResult base;
  for (const Policy& p : policies) {
    SCOPED_TRACE(p.name);
    RunOptions o;
    o.remat = p.remat;
    o.num_threads = k.threads;
    o.backward = p.remat != LNMLP_REMAT_FORWARD_ONLY;
    const RunResult r = run_library(pr, o);
    EXPECT_EQ(r.saved_bytes_per_token, p.per_token);
    if (p.remat == LNMLP_REMAT_FORWARD_ONLY) {
      EXPECT_EQ(r.saved_bytes, 0);
    } else {
      EXPECT_GE(r.saved_bytes, k.T * p.per_token);
    }
    if (p.remat == LNMLP_REMAT_SAVE_ALL) {
      base = r;
      continue;
    }
    EXPECT_TRUE(same_bits("y", r.y, base.y));
    if (!o.backward) continue;
    const auto a = named(r), b = named(base);
    for (size_t i = 1; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i].name, *a[i].buf, *b[i].buf));
  }
}

INSTANTIATE_TEST_SUITE_P(Sweep, Numerics, ::testing::ValuesIn(sweep()), NamedParam());

// An external-workspace plan (attached, garbage-filled memory) gives the bits of an owned one,
// for every policy that runs backward and for each dtype.
class ExternalWorkspace : public ::testing::TestWithParam<Case> {};

TEST_P(ExternalWorkspace, SameBitsAsOwnedWorkspace) {
  const Case& k = GetParam();
  const Problem pr = problem_for(k);
  for (int32_t remat : {LNMLP_REMAT_SAVE_ALL, LNMLP_REMAT_SAVE_FFN1, LNMLP_REMAT_SAVE_STATS}) {
    SCOPED_TRACE("remat " + std::to_string(remat));
    RunOptions o;
    o.remat = remat;
    o.num_threads = k.threads;
    const RunResult owned = run_library(pr, o);
    o.external_workspace = true;
    const RunResult ext = run_library(pr, o);
    EXPECT_TRUE(same_outputs(ext, owned));
  }
  // And the external plan is right, not merely consistent.
  RunOptions o;
  o.external_workspace = true;
  o.num_threads = k.threads;
  EXPECT_TRUE(matches_reference(pr, run_library(pr, o), tolerance_for(k.dtype), {"y", "dW2"}));
}

std::vector<Case> external_workspace_cases() {
  std::vector<Case> v;
  for (int32_t dt : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
    for (int32_t thr : {1, 2}) {
      Case c = Case::of_shape(17, 33, 29);
      c.rms = thr == 2;
      c.acts = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
      c.b1 = c.b2 = true;
      c.dtype = dt;
      c.threads = thr;
      v.push_back(c);
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Plans, ExternalWorkspace, ::testing::ValuesIn(external_workspace_cases()), NamedParam());

}  // namespace
}  // namespace lnmlp_test
