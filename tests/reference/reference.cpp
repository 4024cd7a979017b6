// The float64 reference of the block (see reference.h). Written from docs/design.md, "What is computed" alone, in
// plain loops; it shares no code with src/ on purpose, so that a mistake in the library's
// formulas cannot hide in both.
//
// Matrix products use the i-k-j loop order (the innermost loop runs along contiguous rows of both
// operands), which the compiler vectorizes; the tests call the reference many times.
#include "reference.h"

#include <cmath>
#include <cstddef>
#include <stdexcept>

namespace lnmlp_ref {
namespace {

using Vec = std::vector<double>;

constexpr int kLinear = 0, kRelu = 1, kGelu = 2, kSilu = 3, kQuickGelu = 4, kSquaredRelu = 5, kSigmoid = 6,
              kClampedSilu = 7, kClampedLinear = 8;

const double kSqrt2OverPi = std::sqrt(2.0 / 3.14159265358979323846);
constexpr double kGeluC = 0.044715;
constexpr double kQuickGeluAlpha = 1.702;

double sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

size_t sz(int64_t v) { return static_cast<size_t>(v); }

void check_config(const Config& c) {
  if (c.tokens < 1 || c.hidden < 1 || c.ffn < 1) throw std::invalid_argument("lnmlp_ref: shape must be >= 1");
  if (c.acts.size() != 1 && c.acts.size() != 2) throw std::invalid_argument("lnmlp_ref: 1 or 2 activations");
}

// C[m,n] (+)= A[m,k] @ B[k,n], row-major; i-k-j order.
void matmul_acc(int64_t m, int64_t k, int64_t n, const double* a, const double* b, double* c) {
  for (int64_t i = 0; i < m; ++i) {
    double* ci = c + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const double aip = a[i * k + p];
      const double* bp = b + p * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

// C[k,n] += A[m,k]^T @ B[m,n] (weight gradients); the m loop outermost keeps rows contiguous.
void matmul_tn_acc(int64_t m, int64_t k, int64_t n, const double* a, const double* b, double* c) {
  for (int64_t i = 0; i < m; ++i) {
    const double* bi = b + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const double aip = a[i * k + p];
      double* cp = c + p * n;
      for (int64_t j = 0; j < n; ++j) cp[j] += aip * bi[j];
    }
  }
}

// C[m,k] = A[m,n] @ B[k,n]^T (data gradients); dot products along contiguous rows.
void matmul_nt(int64_t m, int64_t n, int64_t k, const double* a, const double* b, double* c) {
  for (int64_t i = 0; i < m; ++i) {
    const double* ai = a + i * n;
    for (int64_t p = 0; p < k; ++p) {
      const double* bp = b + p * n;
      double s = 0.0;
      for (int64_t j = 0; j < n; ++j) s += ai[j] * bp[j];
      c[i * k + p] = s;
    }
  }
}

double gain(const Config& c, double gamma) { return c.zero_centered_gamma ? gamma + 1.0 : gamma; }

}  // namespace

// The backward of out = in @ W (+ b), in [m, k], W [k, n], with d_out [m, n]: dW = in^T d_out,
// db = sum over rows of d_out (left empty without a bias); returns d_in = d_out W^T.
Vec linear_backward(int64_t m, int64_t k, int64_t n, const Vec& in, const Vec& w, const Vec& d_out, bool bias, Vec* dw,
                    Vec* db) {
  if (bias) {
    db->assign(sz(n), 0.0);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j) (*db)[sz(j)] += d_out[sz(r * n + j)];
  }
  dw->assign(sz(k * n), 0.0);
  matmul_tn_acc(m, k, n, in.data(), d_out.data(), dw->data());
  Vec d_in(sz(m * k));
  matmul_nt(m, n, k, d_out.data(), w.data(), d_in.data());
  return d_in;
}

double act_value(int act, double v, const Config& c) {
  switch (act) {
    case kLinear: return v;
    case kRelu: return v > 0.0 ? v : 0.0;
    case kGelu: return 0.5 * v * (1.0 + std::tanh(kSqrt2OverPi * (v + kGeluC * v * v * v)));
    case kSilu: return v * sigmoid(v);
    case kQuickGelu: return v * sigmoid(kQuickGeluAlpha * v);
    case kSquaredRelu: return v > 0.0 ? v * v : 0.0;
    case kSigmoid: return sigmoid(v);
    case kClampedSilu: {
      const double a = v < c.limit ? v : c.limit;
      return a * sigmoid(c.alpha * a);
    }
    case kClampedLinear: {
      const double b = v < -c.limit ? -c.limit : (v > c.limit ? c.limit : v);
      return b + c.offset;
    }
    default: throw std::invalid_argument("lnmlp_ref: unknown activation");
  }
}

double act_grad(int act, double v, const Config& c) {
  switch (act) {
    case kLinear: return 1.0;
    case kRelu: return v > 0.0 ? 1.0 : 0.0;
    case kGelu: {
      // d/dv of 0.5 v (1 + tanh(u)), u = k (v + c v^3):  0.5 (1 + t) + 0.5 v (1 - t^2) k (1 + 3 c v^2)
      const double t = std::tanh(kSqrt2OverPi * (v + kGeluC * v * v * v));
      return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluC * v * v);
    }
    case kSilu: {
      const double s = sigmoid(v);
      return s + v * s * (1.0 - s);
    }
    case kQuickGelu: {
      const double s = sigmoid(kQuickGeluAlpha * v);
      return s + v * kQuickGeluAlpha * s * (1.0 - s);
    }
    case kSquaredRelu: return v > 0.0 ? 2.0 * v : 0.0;
    case kSigmoid: {
      const double s = sigmoid(v);
      return s * (1.0 - s);
    }
    case kClampedSilu: {
      if (v > c.limit) return 0.0;  // clamped: the derivative is 0 past the limit
      const double s = sigmoid(c.alpha * v);
      return s + v * c.alpha * s * (1.0 - s);
    }
    case kClampedLinear: return (v > c.limit || v < -c.limit) ? 0.0 : 1.0;
    default: throw std::invalid_argument("lnmlp_ref: unknown activation");
  }
}

std::vector<Kink> act_kinks(int act, const Config& c) {
  switch (act) {
    case kRelu: return {{0.0, 1.0}};
    case kClampedSilu: {
      const double s = sigmoid(c.alpha * c.limit);
      return {{c.limit, std::fabs(s + c.limit * c.alpha * s * (1.0 - s))}};
    }
    case kClampedLinear: return {{-c.limit, 1.0}, {c.limit, 1.0}};
    default: return {};
  }
}

Forward forward_full(const Config& c, const Vec& x, const Params& p) {
  check_config(c);
  const int64_t T = c.tokens, H = c.hidden, F = c.ffn;
  const int64_t A = static_cast<int64_t>(c.acts.size()), AF = A * F;
  const bool ln = c.norm == Norm::LayerNorm;
  Forward f;
  f.mu.assign(sz(T), 0.0);
  f.rs.assign(sz(T), 0.0);
  f.xhat.assign(sz(T * H), 0.0);
  f.n.assign(sz(T * H), 0.0);

  // Norm.
  for (int64_t t = 0; t < T; ++t) {
    const double* xr = x.data() + t * H;
    double mu = 0.0;
    if (ln) {
      for (int64_t j = 0; j < H; ++j) mu += xr[j];
      mu /= static_cast<double>(H);
    }
    double var = 0.0;
    for (int64_t j = 0; j < H; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= static_cast<double>(H);
    const double rs = 1.0 / std::sqrt(var + c.epsilon);
    f.mu[sz(t)] = mu;
    f.rs[sz(t)] = rs;
    for (int64_t j = 0; j < H; ++j) {
      const double xh = (xr[j] - mu) * rs;
      f.xhat[sz(t * H + j)] = xh;
      f.n[sz(t * H + j)] = xh * gain(c, p.gamma[sz(j)]) + (ln ? p.beta[sz(j)] : 0.0);
    }
  }

  // GEMM1 (+ b1): W1 [H, A, F] is a row-major [H, A*F] matrix.
  f.h.assign(sz(T * AF), 0.0);
  if (c.has_bias1)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < AF; ++j) f.h[sz(t * AF + j)] = p.b1[sz(j)];
  matmul_acc(T, H, AF, f.n.data(), p.w1.data(), f.h.data());

  // Activation.
  f.a.assign(sz(T * F), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < F; ++j) {
      double v = act_value(c.acts[0], f.h[sz(t * AF + j)], c);
      if (A == 2) v *= act_value(c.acts[1], f.h[sz(t * AF + F + j)], c);
      f.a[sz(t * F + j)] = v;
    }

  // GEMM2 (+ b2).
  f.y.assign(sz(T * H), 0.0);
  if (c.has_bias2)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < H; ++j) f.y[sz(t * H + j)] = p.b2[sz(j)];
  matmul_acc(T, F, H, f.a.data(), p.w2.data(), f.y.data());
  return f;
}

Vec forward(const Config& c, const Vec& x, const Params& p) { return forward_full(c, x, p).y; }

Grads backward(const Config& c, const Vec& x, const Params& p, const Vec& dy) {
  const Forward f = forward_full(c, x, p);
  const int64_t T = c.tokens, H = c.hidden, F = c.ffn;
  const int64_t A = static_cast<int64_t>(c.acts.size()), AF = A * F;
  const bool ln = c.norm == Norm::LayerNorm;
  Grads g;

  // y = a @ W2 + b2.
  const Vec da = linear_backward(T, F, H, f.a, p.w2, dy, c.has_bias2, &g.dw2, &g.db2);

  // a = f0(h0) [* f1(h1)]:  the product rule.
  Vec dh(sz(T * AF), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < F; ++j) {
      const double d = da[sz(t * F + j)];
      const double h0 = f.h[sz(t * AF + j)];
      if (A == 1) {
        dh[sz(t * AF + j)] = d * act_grad(c.acts[0], h0, c);
      } else {
        const double h1 = f.h[sz(t * AF + F + j)];
        dh[sz(t * AF + j)] = d * act_grad(c.acts[0], h0, c) * act_value(c.acts[1], h1, c);
        dh[sz(t * AF + F + j)] = d * act_value(c.acts[0], h0, c) * act_grad(c.acts[1], h1, c);
      }
    }

  // h = n @ W1 + b1.
  const Vec dn = linear_backward(T, H, AF, f.n, p.w1, dh, c.has_bias1, &g.dw1, &g.db1);

  // n = xhat * g + beta:  dgamma = sum_t dn * xhat (d(gamma+1)/dgamma = 1),  dbeta = sum_t dn.
  // Through xhat = (x - mu) * rs, with rs = (var + eps)^-1/2 (var the mean square for rmsnorm),
  // d rs / d x_i = -rs^3 (x_i - mu) / H (the mu terms cancel in the variance), so with dxhat = dn * g:
  //   layernorm: dx = rs * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))
  //   rmsnorm:   dx = rs * (dxhat - xhat * mean(dxhat * xhat))
  // (exact, eps included; test_reference_gradcheck.cpp checks it by finite differences).
  g.dgamma.assign(sz(H), 0.0);
  if (ln) g.dbeta.assign(sz(H), 0.0);
  g.dx.assign(sz(T * H), 0.0);
  Vec dxhat(sz(H));
  for (int64_t t = 0; t < T; ++t) {
    const double rs = f.rs[sz(t)];
    double m1 = 0.0, m2 = 0.0;
    for (int64_t j = 0; j < H; ++j) {
      const double d = dn[sz(t * H + j)];
      const double xh = f.xhat[sz(t * H + j)];
      g.dgamma[sz(j)] += d * xh;
      if (ln) g.dbeta[sz(j)] += d;
      dxhat[sz(j)] = d * gain(c, p.gamma[sz(j)]);
      m1 += dxhat[sz(j)];
      m2 += dxhat[sz(j)] * xh;
    }
    m1 /= static_cast<double>(H);
    m2 /= static_cast<double>(H);
    if (!ln) m1 = 0.0;
    for (int64_t j = 0; j < H; ++j)
      g.dx[sz(t * H + j)] = rs * (dxhat[sz(j)] - m1 - f.xhat[sz(t * H + j)] * m2);
  }
  return g;
}

}  // namespace lnmlp_ref
