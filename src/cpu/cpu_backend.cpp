// The CPU backend: orchestrates the block's passes over the plan's workspace. GEMMs go to the GEMM
// library (gemm.h); everything else is one of the fused row kernels of kernels.h, run on all cores.
//
// Data flow per I/O dtype D (G = GEMM operand type: D, or fp32 for f16):
//   forward:  norm -> ln (D)  | GEMM1 (+b1) -> h (D)  | act -> a (D)  | GEMM2 (+b2) -> y (D)
//   backward: dy col-sums -> db2 | dact = dy W2^T | dW2 = a^T dy | dh = dact * act'(h), db1
//             | dn = dh W1^T | dW1 = ln^T dh | norm backward -> dx, dgamma, dbeta
// For f32 and bf16 the GEMM library adds the biases and writes D directly; for f16 the GEMMs run in
// fp32 on widened operands and the bias and rounding happen in the following pass.
//
// Sharded (DESIGN section 4, docs/sharding.md): the same passes on the F/P shard (the plan's Config
// has ffn = F/P), with collectives between them: GEMM2 writes fp32 partial sums that are
// all-reduced (or reduce-scattered to the local rows under sequence parallelism) before b2 and the
// rounding; dn is all-reduced (reduce-scattered) before norm backward. Under sequence parallelism
// the norm runs on the local T/P rows and its output is all-gathered, dy is all-gathered, and
// dgamma, dbeta and db2 are summed over the group.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "block/backend.h"
#include "comm/comm.h"
#include "common/error.h"
#include "block_gemms.h"
#include "collectives.h"
#include "gemm.h"
#include "host_backend.h"
#include "kernels.h"
#include "parallel.h"

namespace lnmlp {
namespace cpu {
namespace {

template <DType D> class CpuBackend final : public HostMemoryBackend {
  using S = storage_t<D>;
  using O = operand_t<D>;
  static constexpr bool kWiden = gemm_widens(D);  // GEMMs on fp32 copies

 public:
  CpuBackend(const Config& cfg, const SavedLayout& saved) : c_(cfg), saved_(saved) {
    threads_ = c_.num_threads > 0 ? c_.num_threads : omp_get_max_threads();
    chunks_ = threads_;
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width(), Tn = c_.rows();
    np_ = NormParams{c_.norm, c_.zero_centered_gamma, c_.epsilon, H};
    comm_ = c_.shard.active() ? c_.shard.comm : nullptr;
    sp_ = comm_ != nullptr && c_.shard.sequence_parallel;
    gemm2_f32_ = kWiden || comm_ != nullptr;

    // GEMMs, created once (shapes and types: block_gemms.h).
    const BlockGemmShapes shapes =
        block_gemm_shapes(T, H, F, c_.num_acts, D, c_.has_bias1, c_.has_bias2, comm_ != nullptr);
    g1_ = make_gemm(shapes.gemm1);
    g2_ = make_gemm(shapes.gemm2);
    int64_t scratch = std::max(g1_->scratch_bytes(), g2_->scratch_bytes());
    const bool trains = c_.remat != Remat::ForwardOnly;
    if (trains) {
      g_dact_ = make_gemm(shapes.dact);
      g_dw2_ = make_gemm(shapes.dw2);
      g_dn_ = make_gemm(shapes.dn);
      g_dw1_ = make_gemm(shapes.dw1);
      for (const auto* g : {g_dact_.get(), g_dw2_.get(), g_dn_.get(), g_dw1_.get()})
        scratch = std::max(scratch, g->scratch_bytes());
    }

    const int64_t e = dtype_bytes(D);
    const int64_t TH = T * H, TF = T * F, TAF = T * AF;
    {  // forward workspace
      RegionAllocator a;
      fw_.mu = a.take_if(!saved_.rs.present() && c_.has_beta(), Tn, 4, "mean");
      fw_.rs = a.take_if(!saved_.rs.present(), Tn, 4, "rstd");
      fw_.ln = a.take_if(!saved_.ln_out.present(), TH, e, "ln_out");
      fw_.ln_local = a.take_if(sp_, Tn * H, e, "local ln_out rows (all-gathered)");
      fw_.ln_f32 = a.take_if(kWiden, TH, 4, "ln_out fp32");
      fw_.w1_f32 = a.take_if(kWiden, H * AF, 4, "W1 fp32");
      fw_.w2_f32 = a.take_if(kWiden, F * H, 4, "W2 fp32");
      fw_.h = a.take_if(!kWiden && !saved_.h.present(), TAF, e, "ffn1");
      fw_.h32 = a.take_if(kWiden, TAF, 4, "ffn1 fp32");
      fw_.act = a.take_if(!saved_.act.present(), TF, e, "act_out");
      fw_.act_f32 = a.take_if(kWiden, TF, 4, "act_out fp32");
      fw_.y32 = a.take_if(gemm2_f32_, TH, 4, "y fp32 (partial sums when sharded)");
      fw_.y_local = a.take_if(sp_, Tn * H, 4, "reduce-scattered y rows");
      fw_.scratch = a.take(scratch, 1, "GEMM scratch");
      ws_bytes_ = a.total();
    }
    if (trains) {  // backward workspace, over the same memory
      RegionAllocator a;
      bw_.ln = a.take_if(!saved_.ln_out.present(), TH, e, "ln_out");
      bw_.ln_local = a.take_if(sp_ && !saved_.ln_out.present(), Tn * H, e, "local ln_out rows (all-gathered)");
      bw_.dy_full = a.take_if(sp_, TH, e, "all-gathered dy");
      bw_.dn_local = a.take_if(sp_, Tn * H, 4, "reduce-scattered dln_out rows");
      bw_.group_sum = a.take_if(sp_, H, 4, "group-summed parameter gradient");
      bw_.ln_f32 = a.take_if(kWiden, TH, 4, "ln_out fp32");
      bw_.h = a.take_if(!kWiden && !saved_.h.present(), TAF, e, "ffn1");
      bw_.h32 = a.take_if(kWiden && !saved_.h.present(), TAF, 4, "ffn1 fp32");
      bw_.act = a.take_if(!saved_.act.present(), TF, e, "act_out");
      bw_.act_f32 = a.take_if(kWiden, TF, 4, "act_out fp32");
      bw_.w1_f32 = a.take_if(kWiden, H * AF, 4, "W1 fp32");
      bw_.w2_f32 = a.take_if(kWiden, F * H, 4, "W2 fp32");
      bw_.dy_f32 = a.take_if(kWiden, TH, 4, "dy fp32");
      bw_.dact = a.take(TF, 4, "dact");
      bw_.dh = a.take(TAF, sizeof(O), "dffn1");
      bw_.dn = a.take(TH, 4, "dln_out");
      bw_.dw1_32 = a.take_if(kWiden, H * AF, 4, "dW1 fp32");
      bw_.dw2_32 = a.take_if(kWiden, F * H, 4, "dW2 fp32");
      bw_.part_db2 = a.take(chunks_ * H, 4, "db2 partials");
      bw_.part_db1 = a.take(chunks_ * AF, 4, "db1 partials");
      bw_.part_dg = a.take(chunks_ * H, 4, "dgamma partials");
      bw_.part_dbeta = a.take(chunks_ * H, 4, "dbeta partials");
      bw_.scratch = a.take(scratch, 1, "GEMM scratch");
      ws_bytes_ = std::max(ws_bytes_, a.total());
    }
  }

  int64_t workspace_bytes() const override { return ws_bytes_; }
  void forward(const ForwardArgs& a, void* ws) override {
    ScopedOmpThreads omp_threads(threads_);
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    const auto* x = static_cast<const S*>(a.x);
    const auto* gamma = static_cast<const S*>(a.gamma);
    const auto* beta = static_cast<const S*>(a.beta);
    const auto* b1 = static_cast<const S*>(a.b1);
    const auto* b2 = static_cast<const S*>(a.b2);
    float* mu = saved_.mu.present() ? at<float>(saved_.mu, a.saved) : at<float>(fw_.mu, ws);
    float* rs = saved_.rs.present() ? at<float>(saved_.rs, a.saved) : at<float>(fw_.rs, ws);
    S* ln = saved_.ln_out.present() ? at<S>(saved_.ln_out, a.saved) : at<S>(fw_.ln, ws);
    S* h = saved_.h.present() ? at<S>(saved_.h, a.saved) : at<S>(fw_.h, ws);
    S* act = saved_.act.present() ? at<S>(saved_.act, a.saved) : at<S>(fw_.act, ws);
    float* ln_f32 = at<float>(fw_.ln_f32, ws);
    float* act_f32 = at<float>(fw_.act_f32, ws);

    run_norm_forward(x, gamma, beta, true, mu, rs, ln, ln_f32, at<S>(fw_.ln_local, ws), a.stream);
    const void* w1 = widened(a.w1, fw_.w1_f32, H * AF, ws);
    const void* w2 = widened(a.w2, fw_.w2_f32, F * H, ws);
    if constexpr (kWiden) {
      g1_->run(ln_f32, w1, nullptr, at<float>(fw_.h32, ws), at<char>(fw_.scratch, ws));
      run_act_forward(at<float>(fw_.h32, ws), nullptr, b1, h, act, act_f32);
    } else {
      g1_->run(ln, w1, b1, h, at<char>(fw_.scratch, ws));
      run_act_forward(nullptr, h, nullptr, nullptr, act, nullptr);
    }
    const void* act_op = kWiden ? static_cast<const void*>(act_f32) : act;
    if (!gemm2_f32_) {
      g2_->run(act_op, w2, b2, a.y, at<char>(fw_.scratch, ws));
      return;
    }
    // GEMM2 in fp32 (f16, or a rank's partial sums), summed over the group, then + b2 and rounded.
    float* y32 = at<float>(fw_.y32, ws);
    g2_->run(act_op, w2, nullptr, y32, at<char>(fw_.scratch, ws));
    y32 = group_sum_rows(comm_, sp_, y32, at<float>(fw_.y_local, ws), T, H, a.stream);
    S* y = static_cast<S*>(a.y);
    parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t j = 0; j < H; ++j) y[r * H + j] = store<D>(y32[r * H + j] + (b2 ? load<D>(b2[j]) : 0.0f));
    });
  }

  void backward(const BackwardArgs& a, void* ws) override {
    ScopedOmpThreads omp_threads(threads_);
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    const auto* x = static_cast<const S*>(a.x);
    const auto* gamma = static_cast<const S*>(a.gamma);
    const auto* beta = static_cast<const S*>(a.beta);
    const auto* b1 = static_cast<const S*>(a.b1);
    const auto* dy = static_cast<const S*>(a.dy);
    // saved is read-only here; the const_casts only let recompute buffers share pointer types.
    void* saved = const_cast<void*>(a.saved);
    float* mu = at<float>(saved_.mu, saved);
    float* rs = at<float>(saved_.rs, saved);
    char* scratch = at<char>(bw_.scratch, ws);

    // 1. What forward did not save, recompute (same kernels, same bits).
    const void* w1 = widened(a.w1, bw_.w1_f32, H * AF, ws);
    const void* w2 = widened(a.w2, bw_.w2_f32, F * H, ws);
    S* ln = saved_.ln_out.present() ? at<S>(saved_.ln_out, saved) : at<S>(bw_.ln, ws);
    float* ln_f32 = at<float>(bw_.ln_f32, ws);
    if (!saved_.ln_out.present()) {
      run_norm_forward(x, gamma, beta, false, mu, rs, ln, ln_f32, at<S>(bw_.ln_local, ws), a.stream);
    } else if (kWiden) {
      widen_parallel(ln, ln_f32, T * H);
    }
    const void* ln_op = kWiden ? static_cast<const void*>(ln_f32) : ln;
    // h: saved (D), or recomputed by GEMM1 (D with bias; fp32 without bias for f16).
    const S* h = saved_.h.present() ? at<S>(saved_.h, saved) : at<S>(bw_.h, ws);
    const float* h32 = nullptr;
    if (!saved_.h.present()) {
      if constexpr (kWiden) {
        g1_->run(ln_op, w1, nullptr, at<float>(bw_.h32, ws), scratch);
        h32 = at<float>(bw_.h32, ws);
        h = nullptr;
      } else {
        g1_->run(ln_op, w1, b1, at<S>(bw_.h, ws), scratch);
      }
    }
    S* act = saved_.act.present() ? at<S>(saved_.act, saved) : at<S>(bw_.act, ws);
    float* act_f32 = at<float>(bw_.act_f32, ws);
    if (!saved_.act.present()) {
      run_act_forward(h32, h, b1, nullptr, act, act_f32);
    } else if (kWiden) {
      widen_parallel(act, act_f32, T * F);
    }
    const void* act_op = kWiden ? static_cast<const void*>(act_f32) : act;

    // 2. dy: db2 column sums over the local rows (and the fp32 copy for f16); under sequence
    //    parallelism the GEMMs read dy all-gathered.
    float* part_db2 = at<float>(bw_.part_db2, ws);
    float* dy_f32 = at<float>(bw_.dy_f32, ws);
    const S* dy_full = dy;
    if (sp_) {
      comm_->all_gather(dy, at<S>(bw_.dy_full, ws), c_.rows() * H, comm_type(D), a.stream);
      dy_full = at<S>(bw_.dy_full, ws);
    }
    if (c_.has_bias2) std::memset(part_db2, 0, sizeof(float) * chunks_ * H);
    if (c_.has_bias2 || (kWiden && !sp_)) {  // one pass when every row is local
      parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int ch) {
        dy_rows<D>(H, r0, r1, dy, c_.has_bias2 ? part_db2 + ch * H : nullptr, sp_ ? nullptr : dy_f32);
      });
    }
    if (kWiden && sp_) widen_parallel(dy_full, dy_f32, T * H);
    const void* dy_op = kWiden ? static_cast<const void*>(dy_f32) : dy_full;

    // 3. GEMM2's gradients.
    float* dact = at<float>(bw_.dact, ws);
    g_dact_->run(dy_op, w2, nullptr, dact, scratch);
    gemm_to_output(*g_dw2_, act_op, dy_op, a.dw2, bw_.dw2_32, F * H, ws);

    // 4. Activation backward, db1.
    O* dh = at<O>(bw_.dh, ws);
    float* part_db1 = at<float>(bw_.part_db1, ws);
    if (c_.has_bias1) std::memset(part_db1, 0, sizeof(float) * chunks_ * AF);
    with_activations(c_, [&](auto gated, const auto& f0, const auto& f1) {
      parallel_chunks(threads_, chunks_, T, [&](int64_t r0, int64_t r1, int ch) {
        act_backward_rows<D, decltype(gated)::value>(F, r0, r1, f0, f1, dact, h, h32, b1, dh,
                                                     c_.has_bias1 ? part_db1 + ch * AF : nullptr);
      });
    });

    // 5. GEMM1's gradients; dn is a rank's partial sum when sharded.
    float* dn = at<float>(bw_.dn, ws);
    g_dn_->run(dh, w1, nullptr, dn, scratch);
    gemm_to_output(*g_dw1_, ln_op, dh, a.dw1, bw_.dw1_32, H * AF, ws);
    dn = group_sum_rows(comm_, sp_, dn, at<float>(bw_.dn_local, ws), T, H, a.stream);

    // 6. Norm backward.
    float* part_dg = at<float>(bw_.part_dg, ws);
    float* part_dbeta = c_.has_beta() ? at<float>(bw_.part_dbeta, ws) : nullptr;
    std::memset(part_dg, 0, sizeof(float) * chunks_ * H);
    if (part_dbeta) std::memset(part_dbeta, 0, sizeof(float) * chunks_ * H);
    parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int ch) {
      norm_backward_rows<D>(np_, r0, r1, dn, x, gamma, mu, rs, static_cast<S*>(a.dx), part_dg + ch * H,
                            part_dbeta ? part_dbeta + ch * H : nullptr);
    });

    // 7. Parameter-gradient reductions, in chunk order (deterministic); under sequence parallelism
    //    the replicated parameters' gradients are then summed over the group.
    float* group = sp_ ? at<float>(bw_.group_sum, ws) : nullptr;
    reduce_partials(part_dg, H, static_cast<S*>(a.dgamma), group, a.stream);
    if (part_dbeta) reduce_partials(part_dbeta, H, static_cast<S*>(a.dbeta), group, a.stream);
    if (c_.has_bias1) reduce_partials(part_db1, AF, static_cast<S*>(a.db1), nullptr, a.stream);
    if (c_.has_bias2) reduce_partials(part_db2, H, static_cast<S*>(a.db2), group, a.stream);
  }

 private:
  // The activation pass over all rows; see act_forward_rows for the two ways h arrives.
  void run_act_forward(const float* h32, const S* h_in, const S* b1, S* h_out, S* act, float* act_f32) {
    with_activations(c_, [&](auto gated, const auto& f0, const auto& f1) {
      parallel_chunks(threads_, chunks_, c_.tokens, [&](int64_t r0, int64_t r1, int) {
        act_forward_rows<D, decltype(gated)::value>(c_.ffn, r0, r1, f0, f1, h_in, h32, b1, h_out, act, act_f32);
      });
    });
  }

  void widen_parallel(const S* in, float* out, int64_t n) {
    parallel_chunks(threads_, chunks_, n, [&](int64_t i0, int64_t i1, int) { widen<D>(i0, i1, in, out); });
  }

  // The GEMM operand for a weight: the caller's tensor, or its fp32 copy for f16.
  const void* widened(const void* w, const Region& r, int64_t n, void* ws) {
    if constexpr (!kWiden) {
      return w;
    } else {
      widen_parallel(static_cast<const S*>(w), at<float>(r, ws), n);
      return at<float>(r, ws);
    }
  }

  // Runs a weight-gradient GEMM straight into the caller's output (f32, bf16) or through fp32 (f16).
  void gemm_to_output(Gemm& g, const void* a, const void* b, void* out, const Region& tmp, int64_t n, void* ws) {
    char* scratch = at<char>(bw_.scratch, ws);
    if constexpr (!kWiden) {
      g.run(a, b, nullptr, out, scratch);
    } else {
      float* t = at<float>(tmp, ws);
      g.run(a, b, nullptr, t, scratch);
      parallel_chunks(threads_, chunks_, n, [&](int64_t i0, int64_t i1, int) { narrow<D>(i0, i1, t, static_cast<S*>(out)); });
    }
  }

  void reduce_partials(const float* partials, int64_t n, S* out, float* group, void* stream) {
    finish_param_grad<D>(partials, chunks_, n, out, comm_, group, stream);
  }

  // Norm forward (or its recomputation) over the local rows into ln [T, H] (and ln_f32 for f16);
  // under sequence parallelism into `local` [T/P, H], then all-gathered into ln.
  void run_norm_forward(const S* x, const S* gamma, const S* beta, bool stats, float* mu, float* rs, S* ln,
                        float* ln_f32, S* local, void* stream) {
    S* out = sp_ ? local : ln;
    parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int) {
      norm_forward_rows<D>(np_, r0, r1, x, gamma, beta, stats, mu, rs, out, sp_ ? nullptr : ln_f32);
    });
    if (!sp_) return;
    comm_->all_gather(local, ln, c_.rows() * c_.hidden, comm_type(D), stream);
    if (kWiden) widen_parallel(ln, ln_f32, c_.tokens * c_.hidden);
  }

  Config c_;
  SavedLayout saved_;
  NormParams np_{};
  int threads_ = 1;
  int chunks_ = 1;
  Communicator* comm_ = nullptr;  // sharded plans only
  bool sp_ = false;               // sequence parallel
  bool gemm2_f32_ = false;        // GEMM2 writes fp32 (f16, or partial sums when sharded)
  std::unique_ptr<Gemm> g1_, g2_, g_dact_, g_dw2_, g_dn_, g_dw1_;
  struct {
    Region mu, rs, ln, ln_local, ln_f32, w1_f32, w2_f32, h, h32, act, act_f32, y32, y_local, scratch;
  } fw_;
  struct {
    Region ln, ln_f32, h, h32, act, act_f32, w1_f32, w2_f32, dy_f32, dact, dh, dn, dw1_32, dw2_32;
    Region part_db2, part_db1, part_dg, part_dbeta, ln_local, dy_full, dn_local, group_sum, scratch;
  } bw_;
  int64_t ws_bytes_ = 0;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const Config& cfg, const SavedLayout& saved) {
  return cpu::make_for_dtype<cpu::CpuBackend>(cfg, saved);
}

}  // namespace lnmlp
