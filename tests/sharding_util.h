// Helpers of the sharding tests: a problem's shards for one rank, the ranks' results assembled into
// the group's tensors, and an in-process communicator (P threads of one process exchanging through
// shared pointers and a barrier) for lnmlp_comm_create_callbacks.
#pragma once

#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace lnmlp_test {

// Elements [rows r0.., n_rows) x [cols c0.., n_cols) of a row-major [*, width] buffer.
inline Buffer slice(const Buffer& b, size_t width, size_t r0, size_t n_rows, size_t c0, size_t n_cols) {
  Buffer out(b.dtype, n_rows * n_cols);
  const size_t es = static_cast<size_t>(dtype_size(b.dtype));
  for (size_t r = 0; r < n_rows; ++r)
    std::memcpy(out.bytes.data() + r * n_cols * es, b.bytes.data() + ((r0 + r) * width + c0) * es, n_cols * es);
  return out;
}

// The inverse: writes `part` into the [n_rows, n_cols] window of `b` at (r0, c0).
inline void unslice(Buffer& b, const Buffer& part, size_t width, size_t r0, size_t n_rows, size_t c0, size_t n_cols) {
  const size_t es = static_cast<size_t>(dtype_size(b.dtype));
  for (size_t r = 0; r < n_rows; ++r)
    std::memcpy(b.bytes.data() + ((r0 + r) * width + c0) * es, part.bytes.data() + r * n_cols * es, n_cols * es);
}

struct ShardGeometry {
  size_t T, H, F, A, P, rank;
  bool sp;
  size_t rows() const { return sp ? T / P : T; }
  size_t row0() const { return sp ? rank * rows() : 0; }
  size_t fl() const { return F / P; }
  size_t col0() const { return rank * fl(); }
};

inline ShardGeometry geometry(const Problem& pr, int P, int rank, bool sp) {
  return {static_cast<size_t>(pr.cfg.tokens), static_cast<size_t>(pr.cfg.hidden), static_cast<size_t>(pr.cfg.ffn),
          pr.cfg.acts.size(), static_cast<size_t>(P), static_cast<size_t>(rank), sp};
}

// Rank `rank`'s inputs: W1 [H, A, F/P] and b1 [A, F/P] (its columns of each of the A halves),
// W2 [F/P, H] (its rows), in the problem's weight layout, and under sequence parallelism its T/P
// rows of x and dy. The config (the group's shape) and the doubles stay the group's.
inline Problem shard_problem(const Problem& pr, int P, int rank, bool sp) {
  const ShardGeometry g = geometry(pr, P, rank, sp);
  Problem s = pr;
  s.bx = slice(pr.bx, g.H, g.row0(), g.rows(), 0, g.H);
  s.bdy = slice(pr.bdy, g.H, g.row0(), g.rows(), 0, g.H);
  const Buffer w1 = weight_in_out(pr.bw1, g.H, g.A * g.F, pr.weight_layout);
  const Buffer w2 = weight_in_out(pr.bw2, g.F, g.H, pr.weight_layout);
  s.bw1 = weight_in_layout(slice(w1, g.F, 0, g.H * g.A, g.col0(), g.fl()), g.H, g.A * g.fl(), pr.weight_layout);
  if (!pr.bb1.empty()) s.bb1 = slice(pr.bb1, g.F, 0, g.A, g.col0(), g.fl());
  s.bw2 = weight_in_layout(slice(w2, g.H, g.col0(), g.fl(), 0, g.H), g.fl(), g.H, pr.weight_layout);
  return s;
}

// A group's assembled outputs against the unsharded plan's and the float64 reference's.
struct GroupComparison {
  std::string failures;                            // every output off, with what it was compared with
  double worst_vs_plan = 0.0, worst_vs_ref = 0.0;  // the largest normalised errors
};

// Each output the unsharded plan (`single`) computes, from the group (`got`): within `vs_plan` of
// the plan's, within `vs_ref` of the reference's.
inline GroupComparison compare_group(const Problem& pr, const RunResult& got, const RunResult& single, bool backward,
                                     Tolerance vs_plan, Tolerance vs_ref) {
  GroupComparison out;
  const auto refs = reference_outputs(pr, backward);
  const auto a = named(got), b = named(single);
  for (size_t i = 0; i < a.size(); ++i) {
    if (b[i].buf->empty()) continue;
    const auto v = a[i].buf->to_doubles();
    Comparison c1, c2;
    const auto r1 = within_tolerance(a[i].name, v, b[i].buf->to_doubles(), nullptr, vs_plan, &c1);
    const auto r2 = within_tolerance(a[i].name, v, refs[i], nullptr, vs_ref, &c2);
    if (!r1) out.failures += std::string(r1.message()) + " (against the unsharded plan); ";
    if (!r2) out.failures += std::string(r2.message()) + " (against the reference); ";
    out.worst_vs_plan = std::max(out.worst_vs_plan, c1.normalised());
    out.worst_vs_ref = std::max(out.worst_vs_ref, c2.normalised());
  }
  return out;
}

// The group's tensors from the ranks' results. Replicated outputs (y, dx without sequence
// parallelism; dgamma, dbeta, db2 always) must be bit-identical on every rank: a difference is
// appended to *mismatch.
inline RunResult assemble(const Problem& pr, const std::vector<RunResult>& ranks, bool sp, std::string* mismatch) {
  const int P = static_cast<int>(ranks.size());
  const ShardGeometry g0 = geometry(pr, P, 0, sp);
  RunResult out = ranks[0];
  auto replicated = [&](const char* name, Buffer RunResult::*m) {
    for (int r = 1; r < P; ++r)
      if ((ranks[r].*m).bytes != (ranks[0].*m).bytes) *mismatch += std::string(name) + " differs on rank " + std::to_string(r) + "; ";
  };
  if (sp) {
    out.y = Buffer(pr.dtype, g0.T * g0.H);
    out.dx = Buffer(pr.dtype, g0.T * g0.H);
  } else {
    replicated("y", &RunResult::y);
    replicated("dx", &RunResult::dx);
  }
  replicated("dgamma", &RunResult::dgamma);
  replicated("dbeta", &RunResult::dbeta);
  replicated("db2", &RunResult::db2);
  const bool trained = !ranks[0].dw1.empty();
  if (trained) {
    out.dw1 = Buffer(pr.dtype, g0.H * g0.A * g0.F);
    out.dw2 = Buffer(pr.dtype, g0.F * g0.H);
    if (!ranks[0].db1.empty()) out.db1 = Buffer(pr.dtype, g0.A * g0.F);
  }
  for (int r = 0; r < P; ++r) {
    const ShardGeometry g = geometry(pr, P, r, sp);
    if (sp) {
      unslice(out.y, ranks[r].y, g.H, g.row0(), g.rows(), 0, g.H);
      if (trained) unslice(out.dx, ranks[r].dx, g.H, g.row0(), g.rows(), 0, g.H);
    }
    if (!trained) continue;
    unslice(out.dw1, ranks[r].dw1, g.F, 0, g.H * g.A, g.col0(), g.fl());
    if (!out.db1.empty()) unslice(out.db1, ranks[r].db1, g.F, 0, g.A, g.col0(), g.fl());
    unslice(out.dw2, ranks[r].dw2, g.H, g.col0(), g.fl(), 0, g.H);
  }
  return out;
}

// P ranks as P threads of this process. Each collective publishes the rank's send pointer, waits
// for all ranks, computes its result from every rank's send buffer into a private copy, waits
// again (so nobody overwrites a send buffer still being read, in-place reductions included), then
// writes recv. Sums run in rank order, so every rank gets the same bits.
class InProcessGroup {
 public:
  explicit InProcessGroup(int P) : P_(P), sends_(static_cast<size_t>(P)), ctx_(static_cast<size_t>(P)) {
    for (int r = 0; r < P; ++r) {
      ctx_[static_cast<size_t>(r)] = {this, r};
      lnmlp_comm_callbacks t{
          sizeof(lnmlp_comm_callbacks), P, r, &all_gather, &reduce_scatter, &all_reduce_sum, &all_reduce_max,
          &ctx_[static_cast<size_t>(r)]};
      lnmlp_comm* c = nullptr;
      LNMLP_TEST_CHECK(lnmlp_comm_create_callbacks(&t, &c));
      comms_.push_back(c);
    }
  }
  ~InProcessGroup() {
    for (lnmlp_comm* c : comms_) lnmlp_comm_destroy(c);
  }
  InProcessGroup(const InProcessGroup&) = delete;
  InProcessGroup& operator=(const InProcessGroup&) = delete;
  lnmlp_comm* comm(int rank) const { return comms_[static_cast<size_t>(rank)]; }
  int calls() const { return calls_; }

  // Runs body(rank) on P threads and joins them; an exception in a rank is rethrown.
  template <typename Body> void run(Body&& body) {
    std::vector<std::thread> threads;
    std::vector<std::string> errors(static_cast<size_t>(P_));
    for (int r = 0; r < P_; ++r)
      threads.emplace_back([&, r] {
        try {
          body(r);
        } catch (const std::exception& e) {
          errors[static_cast<size_t>(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < P_; ++r)
      if (!errors[static_cast<size_t>(r)].empty()) throw std::runtime_error("rank " + std::to_string(r) + ": " + errors[static_cast<size_t>(r)]);
  }

 private:
  struct Ctx {
    InProcessGroup* g;
    int rank;
  };

  void barrier() {
    std::unique_lock<std::mutex> lock(m_);
    const int gen = generation_;
    if (++arrived_ == P_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != gen; });
    }
  }

  static size_t elem(int32_t type) { return type == LNMLP_DTYPE_F32 ? 4 : type == LNMLP_DTYPE_U8 ? 1 : 2; }

  // The common shape of the four collectives: publish, barrier, compute(from every rank), barrier, write.
  template <typename Compute>
  static int32_t collective(void* user, const void* send, void* recv, size_t recv_bytes, Compute&& compute) {
    auto* c = static_cast<Ctx*>(user);
    InProcessGroup& g = *c->g;
    g.sends_[static_cast<size_t>(c->rank)] = send;
    if (c->rank == 0) ++g.calls_;
    g.barrier();
    std::vector<unsigned char> tmp(recv_bytes);
    compute(g, c->rank, tmp.data());
    g.barrier();
    if (recv_bytes > 0) std::memcpy(recv, tmp.data(), recv_bytes);
    return 0;
  }

  static int32_t all_gather(const void* send, void* recv, int64_t count, int32_t type, void* user, void*) {
    const size_t n = static_cast<size_t>(count) * elem(type);
    return collective(user, send, recv, n * static_cast<size_t>(static_cast<Ctx*>(user)->g->P_),
                      [&](InProcessGroup& g, int, unsigned char* out) {
                        for (int q = 0; q < g.P_; ++q) std::memcpy(out + static_cast<size_t>(q) * n, g.sends_[static_cast<size_t>(q)], n);
                      });
  }
  template <typename Op>
  static int32_t reduce(const void* send, void* recv, int64_t count, int32_t type, void* user, size_t offset, Op op) {
    if (type != LNMLP_DTYPE_F32) return 7;  // lnmlp reduces fp32 only
    const size_t n = static_cast<size_t>(count);
    return collective(user, send, recv, n * 4, [&](InProcessGroup& g, int rank, unsigned char* out) {
      float* o = reinterpret_cast<float*>(out);
      for (size_t i = 0; i < n; ++i) {
        const size_t at = offset * static_cast<size_t>(rank) + i;
        float v = static_cast<const float*>(g.sends_[0])[at];
        for (int q = 1; q < g.P_; ++q) v = op(v, static_cast<const float*>(g.sends_[static_cast<size_t>(q)])[at]);
        o[i] = v;
      }
    });
  }
  static int32_t reduce_scatter(const void* s, void* r, int64_t count, int32_t type, void* user, void*) {
    return reduce(s, r, count, type, user, static_cast<size_t>(count), [](float a, float b) { return a + b; });
  }
  static int32_t all_reduce_sum(const void* s, void* r, int64_t count, int32_t type, void* user, void*) {
    return reduce(s, r, count, type, user, 0, [](float a, float b) { return a + b; });
  }
  // Amaxes (>= 0 or NaN): the maximum of the bit patterns as uint32, so a NaN wins (lnmlp.h).
  static int32_t all_reduce_max(const void* s, void* r, int64_t count, int32_t type, void* user, void*) {
    return reduce(s, r, count, type, user, 0, [](float a, float b) {
      uint32_t ua = 0, ub = 0;
      std::memcpy(&ua, &a, 4);
      std::memcpy(&ub, &b, 4);
      return ua >= ub ? a : b;
    });
  }

  int P_;
  std::vector<const void*> sends_;
  std::vector<Ctx> ctx_;
  std::vector<lnmlp_comm*> comms_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0, generation_ = 0, calls_ = 0;
};

// One run of the group: P ranks as P threads over an in-process group, each running its shard of
// `pr` with `o` plus its rank, size, sequence parallelism and communicator. The ranks' results, in
// rank order (assemble() puts them together); *calls, when given, the collectives the group ran.
inline std::vector<RunResult> run_group_in_process(const Problem& pr, const RunOptions& o, int P, bool sp,
                                                   int* calls = nullptr) {
  InProcessGroup group(P);
  std::vector<RunResult> ranks(static_cast<size_t>(P));
  group.run([&](int r) {
    RunOptions ro = o;
    ro.group_size = P;
    ro.rank = r;
    ro.sequence_parallel = sp ? 1 : 0;
    ro.comm = group.comm(r);
    ranks[static_cast<size_t>(r)] = run_library(shard_problem(pr, P, r, sp), ro);
  });
  if (calls != nullptr) *calls = group.calls();
  return ranks;
}

// A NaN amax on one rank must reach every rank, as a local amax propagates it: a delayed-scaling
// problem (T 32, H 64, F 256, gelu, bf16) whose W1 holds one NaN, in the last of P ranks' columns
// only, so only that rank measures a NaN W1 amax before the group's max-reduction.
inline Problem nan_in_last_shard_problem() {
  lnmlp_ref::Config cfg;
  cfg.tokens = 32;
  cfg.hidden = 64;
  cfg.ffn = 256;
  cfg.acts = {LNMLP_ACT_GELU};
  Problem pr = make_problem(cfg, LNMLP_DTYPE_BF16, 77);
  pr.p.w1[static_cast<size_t>(cfg.ffn - 1)] = std::numeric_limits<double>::quiet_NaN();  // row 0, last column
  set_weights(pr, pr.dtype);  // the last column is in the last rank's shard
  return pr;
}
inline RunOptions nan_in_last_shard_options() {
  RunOptions o;
  o.recipe = LNMLP_RECIPE_DELAYED;
  o.amax_history_len = 4;
  o.backward = false;
  return o;
}

// The newest recorded amax of quantizer q in an exported delayed-scaling state (lnmlp.h: a 24-byte
// header, then per quantizer its scale and history, newest first); 0 for an empty state.
inline float newest_amax(const std::vector<unsigned char>& state, int32_t q) {
  constexpr size_t kHeader = 24;
  if (state.size() <= kHeader) return 0.0f;
  const size_t stride = (state.size() - kHeader) / sizeof(float) / LNMLP_QUANTIZER_COUNT;  // 1 + history
  float v = 0.0f;
  std::memcpy(&v, state.data() + kHeader + (static_cast<size_t>(q) * stride + 1) * sizeof(float), sizeof v);
  return v;
}

// A descriptor of tokens T, hidden 16, ffn F on `backend` for the plan-creation checks; create()
// answers lnmlp_plan_create's status (destroying the plan).
struct ShardDesc {
  lnmlp_desc* d = nullptr;
  ShardDesc(int64_t T, int64_t F, int32_t backend = LNMLP_BACKEND_CPU) {
    lnmlp_desc_create(&d);
    lnmlp_desc_set_shape(d, T, 16, F);
    lnmlp_desc_set_backend(d, backend, 0);
  }
  ~ShardDesc() { lnmlp_desc_destroy(d); }
  ShardDesc(const ShardDesc&) = delete;
  ShardDesc& operator=(const ShardDesc&) = delete;
  int32_t create() {
    lnmlp_plan* p = nullptr;
    const int32_t st = lnmlp_plan_create(d, &p);
    lnmlp_plan_destroy(p);
    return st;
  }
};

}  // namespace lnmlp_test
