// The CPU backend under an FP8 recipe: the data flow of docs/fp8.md, step by step. Quantization
// is numerics/quantize.h's (shared with the CUDA backend), laid over the cores by fp8_operands.h;
// the GEMMs multiply decoded FP8 operands with fp32 accumulation (oneDNN, AMX where present); the
// norm and activation passes are kernels.h's, in their unrounded-fp32 modes.
//
// Forward:  norm -> n (fp32) -> Q ln_out | Q w1 | GEMM1 -> acc1 * alpha (+b1) -> h (D)
//           | act -> a (fp32) -> Q act_out | Q w2 | GEMM2 -> y = rnd_D(acc2 * alpha + b2)
//           | delayed: record the four amaxes, update the forward scales
// Backward: dy (fp32), db2 | Q dy | dact = GEMM(dy, w2^T) | dW2 = GEMM(act^T, dy) | dh (fp32), db1
//           | Q dh | dn = GEMM(dh, w1^T) | dW1 = GEMM(ln^T, dh) | norm backward
//           | delayed: record dy's and dh's amaxes, update their scales
//
// Sharded (docs/sharding.md): the same steps on the F/P shard with cpu_backend.cpp's collectives
// (collectives.h), and every per-tensor amax max-reduced over the group before its scale is
// computed (current) or recorded (delayed), so every rank quantizes with the unsharded plan's
// scales and keeps the same delayed-scaling state. Under sequence parallelism the norm output is
// quantized on the local rows with that group-wide scale and its FP8 codes are all-gathered
// (blocked recipes, whose blocks may span ranks' rows: the fp32 output is gathered and quantized
// whole); backward's recomputation gathers it in fp32, and dy is gathered in the I/O dtype.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "block/backend.h"
#include "comm/comm.h"
#include "common/error.h"
#include "plan/fp8_recipe.h"
#include "collectives.h"
#include "fp8_operands.h"
#include "gemm.h"
#include "host_backend.h"
#include "kernels.h"
#include "parallel.h"

namespace lnmlp {
namespace cpu {
namespace {

// The workspace regions of one quantized operand: codes, block scales, decoded GEMM operand.
struct QRegions {
  Region codes, scales, op;
};

template <DType D> class CpuFp8Backend final : public HostMemoryBackend {
  using S = storage_t<D>;

 public:
  CpuFp8Backend(const Config& cfg, const SavedLayout& saved) : c_(cfg), saved_(saved), r_(resolve_recipe(cfg.fp8)) {
    threads_ = c_.num_threads > 0 ? c_.num_threads : omp_get_max_threads();
    chunks_ = threads_;
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width(), Tn = c_.rows();
    np_ = NormParams{c_.norm, c_.zero_centered_gamma, c_.epsilon, H};
    comm_ = c_.shard.active() ? c_.shard.comm : nullptr;
    sp_ = comm_ != nullptr && c_.shard.sequence_parallel;
    op_ = fp8_operand_type(r_);
    op_bytes_ = op_ == GemmType::BF16 ? 2 : 4;

    // The six GEMMs of docs/fp8.md, decoded operands in, fp32 out.
    g1_ = make_gemm({T, AF, H, false, false, op_, GemmType::F32, false});
    g2_ = make_gemm({T, H, F, false, false, op_, GemmType::F32, false});
    int64_t scratch = std::max(g1_->scratch_bytes(), g2_->scratch_bytes());
    const bool trains = c_.remat != Remat::ForwardOnly;
    if (trains) {
      g_dact_ = make_gemm({T, F, H, false, true, op_, GemmType::F32, false});
      g_dw2_ = make_gemm({F, H, T, true, false, op_, GemmType::F32, false});
      g_dn_ = make_gemm({T, H, AF, false, true, op_, GemmType::F32, false});
      g_dw1_ = make_gemm({H, AF, T, true, false, op_, GemmType::F32, false});
      for (const auto* g : {g_dact_.get(), g_dw2_.get(), g_dn_.get(), g_dw1_.get()})
        scratch = std::max(scratch, g->scratch_bytes());
    }
    const int64_t work = threads_ * std::max({H, F, AF}) * 4;
    const int64_t e = dtype_bytes(D);
    const bool save_all = saved_.ln_q.present();
    {  // forward
      RegionAllocator a;
      fw_.mu = a.take_if(!saved_.rs.present() && c_.has_beta(), Tn, 4, "mean");
      fw_.rs = a.take_if(!saved_.rs.present(), Tn, 4, "rstd");
      fw_.n = a.take(T * H, 4, "ln_out fp32");
      fw_.n_local = a.take_if(sp_, Tn * H, 4, "local ln_out rows fp32");
      fw_.ln_local = a.take_if(sp_ && r_.per_tensor(), Tn * H, 1, "local ln_out codes (all-gathered)");
      fw_.ln = take_q(a, kind(kLnOut, Contract::Cols), T, H, !save_all || !r_.per_tensor());
      fw_.w1_32 = a.take(H * AF, 4, "W1 fp32");
      fw_.w1 = take_q(a, kind(kW1, Contract::Rows), H, AF, true);
      fw_.acc1 = a.take(T * AF, 4, "GEMM1 fp32");
      fw_.h = a.take_if(!saved_.h.present(), T * AF, e, "ffn1");
      fw_.a = a.take(T * F, 4, "act_out fp32");
      fw_.act = take_q(a, kind(kActOut, Contract::Cols), T, F, !save_all || !r_.per_tensor());
      fw_.w2_32 = a.take(F * H, 4, "W2 fp32");
      fw_.w2 = take_q(a, kind(kW2, Contract::Rows), F, H, true);
      fw_.acc2 = a.take(T * H, 4, "GEMM2 fp32");
      fw_.y_local = a.take_if(sp_, Tn * H, 4, "reduce-scattered GEMM2 rows");
      fw_.work = a.take(work, 1, "column bands");
      fw_.scratch = a.take(scratch, 1, "GEMM scratch");
      ws_bytes_ = a.total();
    }
    if (trains) {  // backward, over the same memory
      const bool recompute_h = !saved_.h.present();
      RegionAllocator a;
      bw_.n = a.take_if(!save_all, T * H, 4, "ln_out fp32");
      bw_.n_local = a.take_if(sp_ && !save_all, Tn * H, 4, "local ln_out rows fp32");
      bw_.dy_full = a.take_if(sp_, T * H, e, "all-gathered dy");
      bw_.dn_local = a.take_if(sp_, Tn * H, 4, "reduce-scattered dln_out rows");
      bw_.group_sum = a.take_if(sp_, H, 4, "group-summed parameter gradient");
      bw_.ln_row = take_q(a, kind(kLnOut, Contract::Cols), T, H, recompute_h);
      bw_.ln_col = take_q(a, kind(kLnOut, Contract::Rows), T, H, !save_all);
      bw_.w1_32 = a.take(H * AF, 4, "W1 fp32");
      bw_.w1_col = take_q(a, kind(kW1, Contract::Rows), H, AF, recompute_h);
      bw_.w1_row = take_q(a, kind(kW1, Contract::Cols), H, AF, true);
      bw_.acc1 = a.take_if(recompute_h, T * AF, 4, "GEMM1 fp32");
      bw_.h = a.take_if(recompute_h, T * AF, e, "ffn1");
      bw_.a = a.take_if(!save_all, T * F, 4, "act_out fp32");
      bw_.act_col = take_q(a, kind(kActOut, Contract::Rows), T, F, !save_all);
      bw_.w2_32 = a.take(F * H, 4, "W2 fp32");
      bw_.w2_row = take_q(a, kind(kW2, Contract::Cols), F, H, true);
      bw_.dy = a.take(T * H, 4, "dy fp32");
      bw_.dy_row = take_q(a, kind(kDy, Contract::Cols), T, H, true);
      bw_.dy_col = take_q(a, kind(kDy, Contract::Rows), T, H, !r_.per_tensor());
      bw_.dact = a.take(T * F, 4, "dact");
      bw_.dw2 = a.take(F * H, 4, "dW2 fp32");
      bw_.dh = a.take(T * AF, 4, "dffn1 fp32");
      bw_.dh_row = take_q(a, kind(kDh, Contract::Cols), T, AF, true);
      bw_.dh_col = take_q(a, kind(kDh, Contract::Rows), T, AF, !r_.per_tensor());
      bw_.dn = a.take(T * H, 4, "dln_out");
      bw_.dw1 = a.take(H * AF, 4, "dW1 fp32");
      bw_.part_db2 = a.take(chunks_ * H, 4, "db2 partials");
      bw_.part_db1 = a.take(chunks_ * AF, 4, "db1 partials");
      bw_.part_dg = a.take(chunks_ * H, 4, "dgamma partials");
      bw_.part_dbeta = a.take(chunks_ * H, 4, "dbeta partials");
      bw_.work = a.take(work, 1, "column bands");
      bw_.scratch = a.take(scratch, 1, "GEMM scratch");
      ws_bytes_ = std::max(ws_bytes_, a.total());
    }
  }

  int64_t workspace_bytes() const override { return ws_bytes_; }
  void forward(const ForwardArgs& args, void* ws) override {
    ScopedOmpThreads omp_threads(threads_);
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    const auto* x = static_cast<const S*>(args.x);
    float* mu = saved_.mu.present() ? at<float>(saved_.mu, args.saved) : at<float>(fw_.mu, ws);
    float* rs = saved_.rs.present() ? at<float>(saved_.rs, args.saved) : at<float>(fw_.rs, ws);
    S* h = saved_.h.present() ? at<S>(saved_.h, args.saved) : at<S>(fw_.h, ws);
    auto* work = at<uint32_t>(fw_.work, ws);
    char* scratch = at<char>(fw_.scratch, ws);
    float used[4] = {0, 0, 0, 0}, amax[4] = {0, 0, 0, 0};

    // 1. n = norm(x) in fp32; Q ln_out (rowwise for GEMM1; columnwise into saved for dW1).
    float* n = at<float>(fw_.n, ws);
    float* n_rows = sp_ ? at<float>(fw_.n_local, ws) : n;
    parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int) {
      norm_forward_rows<D>(np_, r0, r1, x, static_cast<const S*>(args.gamma), static_cast<const S*>(args.beta), true,
                           mu, rs, nullptr, n_rows);
    });
    uint8_t* ln_codes = fw_.ln.codes.present() ? at<uint8_t>(fw_.ln.codes, ws) : at<uint8_t>(saved_.ln_q, args.saved);
    float alpha_ln;
    if (sp_ && r_.per_tensor()) {  // local rows quantized with the group's scale; codes gathered
      const QuantKind k = kind(kLnOut, Contract::Cols);
      const float scale = tensor_scale(kLnOut, k, n_rows, c_.rows() * H, args.fp8_state, nullptr, &used[0], &amax[0]);
      uint8_t* local = at<uint8_t>(fw_.ln_local, ws);
      quantize_operand(threads_, k, n_rows, c_.rows(), H, scale, local, nullptr, work);
      comm_->all_gather(local, ln_codes, c_.rows() * H, CommType::U8, args.stream);
      decode_operand(threads_, k, ln_codes, nullptr, T, H, op_, at<void>(fw_.ln.op, ws));
      alpha_ln = 1.0f / scale;
    } else {
      if (sp_) comm_->all_gather(n_rows, n, c_.rows() * H, CommType::F32, args.stream);  // blocked: gather, then quantize
      alpha_ln = quantize(kLnOut, Contract::Cols, n, T, H, args.fp8_state, nullptr, ln_codes,
                          at<void>(fw_.ln.scales, ws), at<void>(fw_.ln.op, ws), work, &used[0], &amax[0]);
    }
    if (saved_.ln_q.present() && r_.blocked())
      quantize_operand(threads_, kind(kLnOut, Contract::Rows), n, T, H, 0.0f, at<uint8_t>(saved_.ln_q, args.saved),
                       at<void>(saved_.ln_q_scale, args.saved), work);

    // 2. Q w1 (contracted along its rows, H); GEMM1; h = rnd_D(acc * alpha + b1); a = act(h).
    float* w1_32 = widen_weight(args.w1, fw_.w1_32, H * AF, ws);
    const float alpha_w1 = quantize(kW1, Contract::Rows, w1_32, H, AF, args.fp8_state, nullptr,
                                    at<uint8_t>(fw_.w1.codes, ws), at<void>(fw_.w1.scales, ws), at<void>(fw_.w1.op, ws),
                                    work, &used[1], &amax[1]);
    float* acc1 = at<float>(fw_.acc1, ws);
    g1_->run(at<void>(fw_.ln.op, ws), at<void>(fw_.w1.op, ws), nullptr, acc1, scratch);
    float* a = at<float>(fw_.a, ws);
    gemm1_epilogue_and_act(acc1, alpha_ln * alpha_w1, static_cast<const S*>(args.b1), h, a);

    // 3. Q act_out; Q w2; GEMM2; y.
    uint8_t* act_codes = fw_.act.codes.present() ? at<uint8_t>(fw_.act.codes, ws) : at<uint8_t>(saved_.act_q, args.saved);
    const float alpha_act = quantize(kActOut, Contract::Cols, a, T, F, args.fp8_state, nullptr, act_codes,
                                     at<void>(fw_.act.scales, ws), at<void>(fw_.act.op, ws), work, &used[2], &amax[2]);
    if (saved_.act_q.present() && r_.blocked())
      quantize_operand(threads_, kind(kActOut, Contract::Rows), a, T, F, 0.0f, at<uint8_t>(saved_.act_q, args.saved),
                       at<void>(saved_.act_q_scale, args.saved), work);
    float* w2_32 = widen_weight(args.w2, fw_.w2_32, F * H, ws);
    const float alpha_w2 = quantize(kW2, Contract::Rows, w2_32, F, H, args.fp8_state, nullptr,
                                    at<uint8_t>(fw_.w2.codes, ws), at<void>(fw_.w2.scales, ws), at<void>(fw_.w2.op, ws),
                                    work, &used[3], &amax[3]);
    float* acc2 = at<float>(fw_.acc2, ws);
    g2_->run(at<void>(fw_.act.op, ws), at<void>(fw_.w2.op, ws), nullptr, acc2, scratch);
    acc2 = group_sum_rows(comm_, sp_, acc2, at<float>(fw_.y_local, ws), T, H, args.stream);
    const float alpha2 = alpha_act * alpha_w2;  // the same on every rank (group-wide scales)
    parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int) {
      scale_bias_rows<D>(H, r0, r1, acc2, alpha2, static_cast<const S*>(args.b2), static_cast<S*>(args.y));
    });

    // 4. What backward needs of this pass's scales; then the delayed-scaling update.
    if (saved_.fwd_scales.present()) std::memcpy(at<float>(saved_.fwd_scales, args.saved), used, sizeof used);
    if (r_.stateful())
      for (int q = kLnOut; q <= kW2; ++q) record(args.fp8_state, q, amax[q]);
  }

  void backward(const BackwardArgs& args, void* ws) override {
    ScopedOmpThreads omp_threads(threads_);
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    const auto* x = static_cast<const S*>(args.x);
    const auto* gamma = static_cast<const S*>(args.gamma);
    const auto* b1 = static_cast<const S*>(args.b1);
    void* saved = const_cast<void*>(args.saved);  // read only; typed pointers below are const in use
    float* mu = at<float>(saved_.mu, saved);
    float* rs = at<float>(saved_.rs, saved);
    const float* fwd_scales = at<float>(saved_.fwd_scales, saved);
    auto* work = at<uint32_t>(bw_.work, ws);
    char* scratch = at<char>(bw_.scratch, ws);
    float amax_dy = 0.0f, amax_dh = 0.0f;
    // Forward's per-tensor scale of quantizer q (per-tensor recipes), so that re-quantization
    // gives forward's codes.
    auto fwd = [&](int q) { return fwd_scales != nullptr ? fwd_scales + q : nullptr; };

    // 1. The columnwise ln_out operand for dW1: from the saved codes, or recomputed from x and
    //    the statistics (and, when GEMM1 is recomputed, the rowwise one too).
    const bool save_all = saved_.ln_q.present();
    float alpha_ln_col;
    float* n = at<float>(bw_.n, ws);
    if (!save_all) {
      float* n_rows = sp_ ? at<float>(bw_.n_local, ws) : n;
      parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int) {
        norm_forward_rows<D>(np_, r0, r1, x, gamma, static_cast<const S*>(args.beta), false, mu, rs, nullptr, n_rows);
      });
      if (sp_) comm_->all_gather(n_rows, n, c_.rows() * H, CommType::F32, args.stream);
      alpha_ln_col = quantize(kLnOut, Contract::Rows, n, T, H, nullptr, fwd(kLnOut), at<uint8_t>(bw_.ln_col.codes, ws),
                              at<void>(bw_.ln_col.scales, ws), at<void>(bw_.ln_col.op, ws), work, nullptr, nullptr);
    } else {
      const QuantKind k = kind(kLnOut, Contract::Rows);
      decode_operand(threads_, k, at<uint8_t>(saved_.ln_q, saved), at<void>(saved_.ln_q_scale, saved), T, H, op_,
                     at<void>(bw_.ln_col.op, ws));
      alpha_ln_col = k.per_tensor() ? 1.0f / fwd_scales[kLnOut] : 1.0f;
    }

    // 2. h: saved, or GEMM1 again with forward's codes.
    float* w1_32 = widen_weight(args.w1, bw_.w1_32, H * AF, ws);
    const S* h = at<S>(saved_.h, saved);
    if (!saved_.h.present()) {
      const float al = quantize(kLnOut, Contract::Cols, n, T, H, nullptr, fwd(kLnOut), at<uint8_t>(bw_.ln_row.codes, ws),
                                at<void>(bw_.ln_row.scales, ws), at<void>(bw_.ln_row.op, ws), work, nullptr, nullptr);
      const float aw = quantize(kW1, Contract::Rows, w1_32, H, AF, nullptr, fwd(kW1), at<uint8_t>(bw_.w1_col.codes, ws),
                                at<void>(bw_.w1_col.scales, ws), at<void>(bw_.w1_col.op, ws), work, nullptr, nullptr);
      float* acc1 = at<float>(bw_.acc1, ws);
      g1_->run(at<void>(bw_.ln_row.op, ws), at<void>(bw_.w1_col.op, ws), nullptr, acc1, scratch);
      scale_in_place(acc1, T * AF, al * aw);
      S* hr = at<S>(bw_.h, ws);
      parallel_chunks(threads_, chunks_, T, [&](int64_t r0, int64_t r1, int) {
        scale_bias_rows<D>(AF, r0, r1, acc1, 1.0f, b1, hr);
      });
      h = hr;
    }

    // 3. The columnwise act_out operand for dW2: saved codes, or act(h) re-quantized.
    float alpha_act_col;
    if (!save_all) {
      float* a = at<float>(bw_.a, ws);
      with_activations(c_, [&](auto gated, const auto& f0, const auto& f1) {
        parallel_chunks(threads_, chunks_, T, [&](int64_t r0, int64_t r1, int) {
          act_forward_rows<D, decltype(gated)::value>(F, r0, r1, f0, f1, h, nullptr, nullptr, nullptr, nullptr, a);
        });
      });
      alpha_act_col = quantize(kActOut, Contract::Rows, a, T, F, nullptr, fwd(kActOut), at<uint8_t>(bw_.act_col.codes, ws),
                               at<void>(bw_.act_col.scales, ws), at<void>(bw_.act_col.op, ws), work, nullptr, nullptr);
    } else {
      const QuantKind k = kind(kActOut, Contract::Rows);
      decode_operand(threads_, k, at<uint8_t>(saved_.act_q, saved), at<void>(saved_.act_q_scale, saved), T, F, op_,
                     at<void>(bw_.act_col.op, ws));
      alpha_act_col = k.per_tensor() ? 1.0f / fwd_scales[kActOut] : 1.0f;
    }

    // 4. dy: fp32 copy, db2, Q dy (rowwise for dact; columnwise for dW2).
    //    Under sequence parallelism db2 sums the local rows and dy is all-gathered (in D) first.
    float* dy = at<float>(bw_.dy, ws);
    float* part_db2 = at<float>(bw_.part_db2, ws);
    const S* dy_in = static_cast<const S*>(args.dy);
    if (c_.has_bias2) std::memset(part_db2, 0, sizeof(float) * chunks_ * H);
    if (sp_) {
      if (c_.has_bias2)
        parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int ch) {
          dy_rows<D>(H, r0, r1, dy_in, part_db2 + ch * H, nullptr);
        });
      comm_->all_gather(dy_in, at<S>(bw_.dy_full, ws), c_.rows() * H, comm_type(D), args.stream);
      dy_in = at<S>(bw_.dy_full, ws);
    }
    parallel_chunks(threads_, chunks_, T, [&](int64_t r0, int64_t r1, int ch) {
      dy_rows<D>(H, r0, r1, dy_in, c_.has_bias2 && !sp_ ? part_db2 + ch * H : nullptr, dy);
    });
    const float alpha_dy = quantize(kDy, Contract::Cols, dy, T, H, args.fp8_state, nullptr, at<uint8_t>(bw_.dy_row.codes, ws),
                                    at<void>(bw_.dy_row.scales, ws), at<void>(bw_.dy_row.op, ws), work, nullptr, &amax_dy);
    const void* dy_col_op = at<void>(bw_.dy_row.op, ws);  // per tensor: the same codes
    if (!r_.per_tensor()) {
      quantize(kDy, Contract::Rows, dy, T, H, nullptr, nullptr, at<uint8_t>(bw_.dy_col.codes, ws),
               at<void>(bw_.dy_col.scales, ws), at<void>(bw_.dy_col.op, ws), work, nullptr, nullptr);
      dy_col_op = at<void>(bw_.dy_col.op, ws);
    }

    // 5. dact = GEMM(dy, w2^T) (w2 contracted along its columns, H); dW2 = GEMM(act^T, dy).
    float* w2_32 = widen_weight(args.w2, bw_.w2_32, F * H, ws);
    const float alpha_w2 = quantize(kW2, Contract::Cols, w2_32, F, H, nullptr, fwd(kW2), at<uint8_t>(bw_.w2_row.codes, ws),
                                    at<void>(bw_.w2_row.scales, ws), at<void>(bw_.w2_row.op, ws), work, nullptr, nullptr);
    float* dact = at<float>(bw_.dact, ws);
    g_dact_->run(at<void>(bw_.dy_row.op, ws), at<void>(bw_.w2_row.op, ws), nullptr, dact, scratch);
    scale_in_place(dact, T * F, alpha_dy * alpha_w2);
    float* dw2 = at<float>(bw_.dw2, ws);
    g_dw2_->run(at<void>(bw_.act_col.op, ws), dy_col_op, nullptr, dw2, scratch);
    to_output(dw2, F, H, alpha_act_col * alpha_dy, static_cast<S*>(args.dw2));

    // 6. dh = dact * act'(h) in fp32, db1; Q dh.
    float* dh = at<float>(bw_.dh, ws);
    float* part_db1 = at<float>(bw_.part_db1, ws);
    if (c_.has_bias1) std::memset(part_db1, 0, sizeof(float) * chunks_ * AF);
    with_activations(c_, [&](auto gated, const auto& f0, const auto& f1) {
      parallel_chunks(threads_, chunks_, T, [&](int64_t r0, int64_t r1, int ch) {
        act_backward_rows<D, decltype(gated)::value, false>(F, r0, r1, f0, f1, dact, h, nullptr, nullptr, dh,
                                                            c_.has_bias1 ? part_db1 + ch * AF : nullptr);
      });
    });
    const float alpha_dh = quantize(kDh, Contract::Cols, dh, T, AF, args.fp8_state, nullptr, at<uint8_t>(bw_.dh_row.codes, ws),
                                    at<void>(bw_.dh_row.scales, ws), at<void>(bw_.dh_row.op, ws), work, nullptr, &amax_dh);
    const void* dh_col_op = at<void>(bw_.dh_row.op, ws);
    if (!r_.per_tensor()) {
      quantize(kDh, Contract::Rows, dh, T, AF, nullptr, nullptr, at<uint8_t>(bw_.dh_col.codes, ws),
               at<void>(bw_.dh_col.scales, ws), at<void>(bw_.dh_col.op, ws), work, nullptr, nullptr);
      dh_col_op = at<void>(bw_.dh_col.op, ws);
    }

    // 7. dn = GEMM(dh, w1^T) (w1 contracted along its columns, A*F); dW1 = GEMM(ln^T, dh).
    const float alpha_w1 = quantize(kW1, Contract::Cols, w1_32, H, AF, nullptr, fwd(kW1), at<uint8_t>(bw_.w1_row.codes, ws),
                                    at<void>(bw_.w1_row.scales, ws), at<void>(bw_.w1_row.op, ws), work, nullptr, nullptr);
    float* dn = at<float>(bw_.dn, ws);
    g_dn_->run(at<void>(bw_.dh_row.op, ws), at<void>(bw_.w1_row.op, ws), nullptr, dn, scratch);
    scale_in_place(dn, T * H, alpha_dh * alpha_w1);
    dn = group_sum_rows(comm_, sp_, dn, at<float>(bw_.dn_local, ws), T, H, args.stream);
    float* dw1 = at<float>(bw_.dw1, ws);
    g_dw1_->run(at<void>(bw_.ln_col.op, ws), dh_col_op, nullptr, dw1, scratch);
    to_output(dw1, H, AF, alpha_ln_col * alpha_dh, static_cast<S*>(args.dw1));

    // 8. Norm backward and the deterministic parameter-gradient reductions.
    float* part_dg = at<float>(bw_.part_dg, ws);
    float* part_dbeta = c_.has_beta() ? at<float>(bw_.part_dbeta, ws) : nullptr;
    std::memset(part_dg, 0, sizeof(float) * chunks_ * H);
    if (part_dbeta) std::memset(part_dbeta, 0, sizeof(float) * chunks_ * H);
    parallel_chunks(threads_, chunks_, c_.rows(), [&](int64_t r0, int64_t r1, int ch) {
      norm_backward_rows<D>(np_, r0, r1, dn, x, gamma, mu, rs, static_cast<S*>(args.dx), part_dg + ch * H,
                            part_dbeta ? part_dbeta + ch * H : nullptr);
    });
    float* group = at<float>(bw_.group_sum, ws);  // sequence parallelism: sums over the group
    finish_param_grad<D>(part_dg, chunks_, H, static_cast<S*>(args.dgamma), comm_, group, args.stream);
    if (part_dbeta) finish_param_grad<D>(part_dbeta, chunks_, H, static_cast<S*>(args.dbeta), comm_, group, args.stream);
    if (c_.has_bias1) finish_param_grad<D>(part_db1, chunks_, AF, static_cast<S*>(args.db1), comm_, nullptr, args.stream);
    if (c_.has_bias2) finish_param_grad<D>(part_db2, chunks_, H, static_cast<S*>(args.db2), comm_, group, args.stream);

    // 9. Delayed scaling: the backward quantizers move on.
    if (r_.stateful()) {
      record(args.fp8_state, kDy, amax_dy);
      record(args.fp8_state, kDh, amax_dh);
    }
  }

 private:
  QuantKind kind(int q, Contract contract) const { return quant_kind(r_, q, contract); }

  QRegions take_q(RegionAllocator& a, const QuantKind& k, int64_t rows, int64_t cols, bool codes) {
    QRegions q;
    q.codes = a.take_if(codes, rows * cols, 1, "FP8 codes");
    q.scales = a.take_if(k.scale_count(rows, cols) > 0, k.scale_count(rows, cols), k.scale_bytes(), "FP8 scales");
    q.op = a.take(rows * cols, op_bytes_, "FP8 GEMM operand");
    return q;
  }

  // Quantizes `in` for quantizer q as a GEMM contracting `contract` reads it, and decodes the GEMM
  // operand. The per-tensor scale: `given` (forward's, for re-quantization in backward), else the
  // delayed state's (state != NULL), else current scaling's from the amax. Writes the scale used
  // to *used and the tensor's amax to *amax when asked. Returns the GEMM's factor for this
  // operand: the per-tensor scale_inv, or 1 for blocked recipes (their scales are in the operand).
  float quantize(int q, Contract contract, const float* in, int64_t rows, int64_t cols, const float* state,
                 const float* given, uint8_t* codes, void* scales, void* op, uint32_t* work, float* used, float* amax) {
    const QuantKind k = kind(q, contract);
    const float scale = k.per_tensor() ? tensor_scale(q, k, in, rows * cols, state, given, used, amax) : 0.0f;
    quantize_operand(threads_, k, in, rows, cols, scale, codes, scales, work);
    decode_operand(threads_, k, codes, scales, rows, cols, op_, op);
    return k.per_tensor() ? 1.0f / scale : 1.0f;
  }

  // A per-tensor quantizer's scale (see quantize), the amax taken over `count` elements of `in` and,
  // when sharded, max-reduced over the group (every rank then has the unsharded tensor's amax).
  float tensor_scale(int q, const QuantKind& k, const float* in, int64_t count, const float* state, const float* given,
                     float* used, float* amax) {
    const bool need_amax = amax != nullptr || (given == nullptr && r_.recipe == Recipe::Current);
    float m = need_amax ? parallel_amax(threads_, in, count) : 0.0f;
    if (need_amax && comm_ != nullptr) comm_->all_reduce_max(&m, &m, 1, CommType::F32, nullptr);
    if (amax != nullptr) *amax = m;
    float scale;
    if (given != nullptr) scale = *given;
    else if (r_.recipe == Recipe::Delayed) scale = state[q * r_.state_stride()];
    else scale = numerics::current_scale(m, numerics::fp8_max(k.format), r_.power_2_scale, r_.amax_epsilon);
    if (used != nullptr) *used = scale;
    return scale;
  }

  // Delayed scaling after a pass: push the amax, reduce the history, update the scale.
  void record(float* state, int q, float amax) {
    float* s = state + q * r_.state_stride();
    s[0] = numerics::delayed_record_and_update(s + 1, r_.history_len, amax, s[0], r_.amax_max,
                                                numerics::fp8_max(r_.formats[q]), r_.margin);
  }

  // h = rnd_D(acc * alpha + b1) and a = act(h) in fp32, in one pass.
  void gemm1_epilogue_and_act(float* acc, float alpha, const S* b1, S* h, float* a) {
    scale_in_place(acc, c_.tokens * c_.act_width(), alpha);
    with_activations(c_, [&](auto gated, const auto& f0, const auto& f1) {
      parallel_chunks(threads_, chunks_, c_.tokens, [&](int64_t r0, int64_t r1, int) {
        act_forward_rows<D, decltype(gated)::value>(c_.ffn, r0, r1, f0, f1, nullptr, acc, b1, h, nullptr, a);
      });
    });
  }

  void scale_in_place(float* v, int64_t n, float alpha) {
    if (alpha == 1.0f) return;
    parallel_chunks(threads_, chunks_, n, [&](int64_t i0, int64_t i1, int) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) v[i] *= alpha;
    });
  }

  // A weight gradient: rnd_D(acc * alpha) into the caller's buffer.
  void to_output(const float* acc, int64_t rows, int64_t cols, float alpha, S* out) {
    parallel_chunks(threads_, chunks_, rows, [&](int64_t r0, int64_t r1, int) {
      scale_bias_rows<D>(cols, r0, r1, acc, alpha, nullptr, out);
    });
  }

  float* widen_weight(const void* w, const Region& r, int64_t n, void* ws) {
    float* out = at<float>(r, ws);
    parallel_chunks(threads_, chunks_, n, [&](int64_t i0, int64_t i1, int) { widen<D>(i0, i1, static_cast<const S*>(w), out); });
    return out;
  }


  Config c_;
  SavedLayout saved_;
  ResolvedRecipe r_;
  NormParams np_{};
  GemmType op_ = GemmType::BF16;
  int64_t op_bytes_ = 2;
  int threads_ = 1;
  int chunks_ = 1;
  Communicator* comm_ = nullptr;  // sharded plans only
  bool sp_ = false;               // sequence parallel
  std::unique_ptr<Gemm> g1_, g2_, g_dact_, g_dw2_, g_dn_, g_dw1_;
  struct {
    Region mu, rs, n, n_local, ln_local, w1_32, acc1, h, a, w2_32, acc2, y_local, work, scratch;
    QRegions ln, w1, act, w2;
  } fw_;
  struct {
    Region n, n_local, w1_32, acc1, h, a, w2_32, dy, dact, dw2, dh, dn, dw1, part_db2, part_db1, part_dg, part_dbeta, work,
        scratch, dy_full, dn_local, group_sum;
    QRegions ln_row, ln_col, w1_col, w1_row, act_col, w2_row, dy_row, dy_col, dh_row, dh_col;
  } bw_;
  int64_t ws_bytes_ = 0;
};

}  // namespace
}  // namespace cpu

std::unique_ptr<Backend> make_cpu_fp8_backend(const Config& cfg, const SavedLayout& saved) {
  return cpu::make_for_dtype<cpu::CpuFp8Backend>(cfg, saved);
}

}  // namespace lnmlp
