// The CUDA backend under an FP8 recipe: docs/fp8.md's data flow on the GPU, the same steps as the
// CPU backend (src/cpu/cpu_fp8_backend.cpp), with everything the scales need kept on the device.
//
// Per-tensor recipes (delayed, current) run on Hopper's FP8 tensor cores: cuBLASLt FP8 GEMMs
// (E4M3 x E4M3 forward, E5M2 x E4M3 backward under HYBRID) whose per-tensor scale_invs are device
// pointers; the quantizers write each tensor's codes in the K-major orientation(s) its GEMMs need
// (a transposed copy in the same pass). amaxes, scales and the delayed-scaling update are
// computed by small kernels, so a pass never waits on the host and is graph-capturable.
//
// Blocked recipes (block, mxfp8) are emulated exactly as the CPU backend does: quantized in the
// same block layouts (the same bits), decoded into bf16 operands (fp32 for block scales that are
// not powers of two) and multiplied by cuBLASLt with fp32 accumulation.
//
// Sharded (docs/sharding.md), the CPU FP8 backend's steps with NCCL collectives on the plan's
// stream (collectives.h): every per-tensor amax is max-reduced over the group on the device before
// its scale is computed (current) or recorded (delayed), so every rank quantizes with the unsharded
// plan's scales and keeps the same delayed-scaling state. Under sequence parallelism the norm
// output's local rows are quantized with that group-wide scale and the FP8 codes all-gathered
// (blocked recipes: the fp32 rows are gathered and quantized whole); backward's recomputation
// gathers fp32 rows, dy is gathered in the I/O dtype. GEMM2's and dn's fp32 results (the GEMMs
// apply the per-tensor factors) are summed over the group, then b2 is added and y rounded.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>

#include "plan/fp8_recipe.h"
#include "backward_tail.h"
#include "check.h"
#include "collectives.h"
#include "cuda_backend.h"
#include "device_memory.h"
#include "device_pointers.h"
#include "fp8_kernels.h"
#include "gemm_cublaslt.h"
#include "gemm_fp8.h"
#include "kernels.h"

namespace lnmlp::cuda {
namespace {

constexpr int64_t kMaxGemmWorkspace = int64_t{32} << 20;

// Device scalars of one quantizer for one pass: its scale and scale_inv, and its amax's bits.
struct QScalars {
  Region scale, amax;
};

// Where one quantized operand lives in the workspace: its codes, the transposed codes (per
// tensor), its block scales and decoded GEMM operand (blocked recipes).
struct QRegions {
  Region codes, codes_t, scales, op;
};

class CudaFp8Backend final : public DeviceMemoryBackend {
 public:
  CudaFp8Backend(const Config& cfg, const SavedLayout& saved)
      : DeviceMemoryBackend(cfg.device), c_(cfg), saved_(saved), r_(resolve_recipe(cfg.fp8)) {
    ScopedDevice dev(device_);
    comm_ = c_.shard.comm;  // the module's NCCL communicator, sharded plans only
    sp_ = comm_ != nullptr && c_.shard.sequence_parallel;
    native_ = r_.per_tensor();
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    if (native_) {
      for (int64_t d : {T, H, F, AF})
        if (d % kFp8GemmDimMultiple != 0)
          fail(LNMLP_ERROR_NOT_SUPPORTED, "FP8 GEMMs on the GPU need tokens, hidden, ffn and A x ffn to be multiples of ",
               kFp8GemmDimMultiple, " (got ", T, ", ", H, ", ", F, ", ", AF,
               "); pad the shape, or use LNMLP_RECIPE_NONE");
    }
    cublas_check(cublasLtCreate(&lt_), "cublasLtCreate");
    try {
      build();
    } catch (...) {
      release_gemms();
      throw;
    }
  }
  ~CudaFp8Backend() override { release_gemms(); }

  int64_t workspace_bytes() const override { return ws_bytes_; }
  int64_t alignment() const override { return kCudaAlignment; }

  void forward(const ForwardArgs& a, void* ws) override {
    ScopedDevice dev(device_);
    st_ = static_cast<cudaStream_t>(a.stream);
    check_device_pointers({{"x", a.x}, {"gamma", a.gamma}, {"beta", a.beta}, {"w1", a.w1}, {"b1", a.b1},
                           {"w2", a.w2}, {"b2", a.b2}, {"y", a.y}, {"saved", a.saved}, {"workspace", ws}},
                          device_, kGemmPointerAlignment, st_);
    ws_ = ws;
    const DType d = c_.dtype;
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    float* mu = saved_.mu.present() ? at<float>(saved_.mu, a.saved) : at<float>(fw_.mu, ws);
    float* rs = saved_.rs.present() ? at<float>(saved_.rs, a.saved) : at<float>(fw_.rs, ws);
    void* h = saved_.h.present() ? at<char>(saved_.h, a.saved) : at<char>(fw_.h, ws);
    float* used = saved_.fwd_scales.present() ? at<float>(saved_.fwd_scales, a.saved) : nullptr;
    const bool save_all = saved_.ln_q.present();

    // 1. n = norm(x) in fp32 (the local rows); Q ln_out (for GEMM1; for dW1 into the saved
    //    buffer). Under sequence parallelism, per tensor: the local rows quantized with the group's
    //    scale and the codes all-gathered; blocked: the fp32 rows gathered, then quantized whole.
    float* n = at<float>(fw_.n, ws);
    const int64_t Tn = c_.rows();
    float* n_rows = sp_ ? at<float>(fw_.n_local, ws) : n;
    norm_forward(d, norm_spec(), a.x, a.gamma, a.beta, true, mu, rs, n_rows, st_, true);
    GemmIn ln;
    if (sp_ && native_) {
      uint8_t* local = at<uint8_t>(fw_.ln_local, ws);
      uint8_t* codes = at<uint8_t>(fw_.ln.codes, ws);
      ln = quantize(kLnOut, Contract::Cols, DType::F32, n_rows, Tn, H, a.fp8_state, nullptr, used, fw_.ln, local,
                    nullptr);
      comm_->all_gather(local, codes, Tn * H, CommType::U8, st_);
      ln.codes = codes;
      if (save_all) fp8_transpose_codes(codes, T, H, at<uint8_t>(saved_.ln_q, a.saved), st_);
    } else {
      if (sp_) comm_->all_gather(n_rows, n, Tn * H, CommType::F32, st_);
      ln = quantize(kLnOut, Contract::Cols, DType::F32, n, T, H, a.fp8_state, nullptr, used, fw_.ln, nullptr,
                    save_all && native_ ? at<uint8_t>(saved_.ln_q, a.saved) : nullptr);
    }
    if (save_all && !native_)
      fp8_quantize_blocked(DType::F32, kind(kLnOut, Contract::Rows), n, T, H, at<uint8_t>(saved_.ln_q, a.saved),
                           at<void>(saved_.ln_q_scale, a.saved), st_);

    // 2. Q w1; GEMM1; h = rnd_D(acc + b1); a = act(h) in fp32.
    const GemmIn w1 = quantize(kW1, Contract::Rows, d, a.w1, H, AF, a.fp8_state, nullptr, used ? used + 1 : nullptr,
                               fw_.w1, nullptr, nullptr);
    float* acc1 = at<float>(fw_.acc1, ws);
    gemm(g1_, g1n_, ln, w1, acc1, at<char>(fw_.gemm, ws));
    fp8_bias_round(d, acc1, T, AF, a.b1, h, st_);
    float* av = at<float>(fw_.a, ws);
    act_forward(d, act_spec(), h, av, st_, true);

    // 3. Q act_out; Q w2; GEMM2; y.
    const GemmIn act = quantize(kActOut, Contract::Cols, DType::F32, av, T, F, a.fp8_state, nullptr,
                                used ? used + 2 : nullptr, fw_.act, nullptr,
                                save_all && native_ ? at<uint8_t>(saved_.act_q, a.saved) : nullptr);
    if (save_all && !native_)
      fp8_quantize_blocked(DType::F32, kind(kActOut, Contract::Rows), av, T, F, at<uint8_t>(saved_.act_q, a.saved),
                           at<void>(saved_.act_q_scale, a.saved), st_);
    const GemmIn w2 = quantize(kW2, Contract::Rows, d, a.w2, F, H, a.fp8_state, nullptr, used ? used + 3 : nullptr,
                               fw_.w2, nullptr, nullptr);
    float* acc2 = at<float>(fw_.acc2, ws);
    gemm(g2_, g2n_, act, w2, acc2, at<char>(fw_.gemm, ws));
    acc2 = group_sum_rows(comm_, sp_, acc2, at<float>(fw_.y_local, ws), T, H, st_);
    fp8_bias_round(d, acc2, Tn, H, a.b2, a.y, st_);

    // 4. Delayed scaling: the forward quantizers move on.
    if (r_.stateful())
      for (int q = kLnOut; q <= kW2; ++q) record(a.fp8_state, q);
    cuda_check(cudaGetLastError(), "an FP8 forward kernel launch");
  }

  void backward(const BackwardArgs& a, void* ws) override {
    ScopedDevice dev(device_);
    st_ = static_cast<cudaStream_t>(a.stream);
    check_device_pointers({{"dy", a.dy}, {"x", a.x}, {"gamma", a.gamma}, {"beta", a.beta}, {"w1", a.w1},
                           {"b1", a.b1}, {"w2", a.w2}, {"saved", a.saved}, {"dx", a.dx}, {"dgamma", a.dgamma},
                           {"dbeta", a.dbeta}, {"dw1", a.dw1}, {"db1", a.db1}, {"dw2", a.dw2}, {"db2", a.db2},
                           {"workspace", ws}},
                          device_, kGemmPointerAlignment, st_);
    ws_ = ws;
    const DType d = c_.dtype;
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    void* saved = const_cast<void*>(a.saved);  // read only
    float* mu = at<float>(saved_.mu, saved);
    float* rs = at<float>(saved_.rs, saved);
    const float* fwd = saved_.fwd_scales.present() ? at<float>(saved_.fwd_scales, saved) : nullptr;
    auto given = [&](int q) { return fwd != nullptr ? fwd + q : nullptr; };
    char* gws = at<char>(bw_.gemm, ws);
    const bool save_all = saved_.ln_q.present();
    const bool recompute_h = !saved_.h.present();

    // 1. ln_out for dW1 (and GEMM1 when it is recomputed): saved codes, or re-quantized with
    //    forward's scales from the recomputed norm output.
    GemmIn ln_col, ln_row;
    if (!save_all) {
      float* n = at<float>(bw_.n, ws);
      float* n_rows = sp_ ? at<float>(bw_.n_local, ws) : n;
      norm_forward(d, norm_spec(), a.x, a.gamma, a.beta, false, mu, rs, n_rows, st_, true);
      if (sp_) comm_->all_gather(n_rows, n, c_.rows() * H, CommType::F32, st_);
      if (native_) {
        const GemmIn both = quantize(kLnOut, Contract::Cols, DType::F32, n, T, H, nullptr, given(kLnOut), nullptr,
                                     bw_.ln_row, nullptr, at<uint8_t>(bw_.ln_col.codes_t, ws));
        ln_row = both;
        ln_col = {at<uint8_t>(bw_.ln_col.codes_t, ws), both.scale_inv, nullptr};
      } else {
        ln_col = quantize(kLnOut, Contract::Rows, DType::F32, n, T, H, nullptr, nullptr, nullptr, bw_.ln_col, nullptr,
                          nullptr);
        if (recompute_h)
          ln_row = quantize(kLnOut, Contract::Cols, DType::F32, n, T, H, nullptr, nullptr, nullptr, bw_.ln_row, nullptr,
                            nullptr);
      }
    } else {
      ln_col = from_saved(kLnOut, saved_.ln_q, saved_.ln_q_scale, saved, given(kLnOut), bw_.ln_col, T, H);
    }

    // 2. h: saved, or GEMM1 again with forward's codes. W1 for dn (and GEMM1).
    const GemmIn w1_row = quantize(kW1, Contract::Cols, d, a.w1, H, AF, nullptr, given(kW1), nullptr, bw_.w1_row,
                                   recompute_h && native_ ? at<uint8_t>(bw_.w1_col.codes_t, ws) : nullptr, nullptr);
    const void* h = at<char>(saved_.h, saved);
    if (recompute_h) {
      GemmIn w1_col;
      if (native_) w1_col = {at<uint8_t>(bw_.w1_col.codes_t, ws), w1_row.scale_inv, nullptr};
      else w1_col = quantize(kW1, Contract::Rows, d, a.w1, H, AF, nullptr, nullptr, nullptr, bw_.w1_col, nullptr, nullptr);
      float* acc1 = at<float>(bw_.acc1, ws);
      gemm(g1_, g1n_, ln_row, w1_col, acc1, gws);
      void* hr = at<char>(bw_.h, ws);
      fp8_bias_round(d, acc1, T, AF, a.b1, hr, st_);
      h = hr;
    }

    // 3. act_out for dW2: saved codes, or act(h) re-quantized.
    GemmIn act_col;
    if (!save_all) {
      float* av = at<float>(bw_.a, ws);
      act_forward(d, act_spec(), h, av, st_, true);
      if (native_) {
        const GemmIn q = quantize(kActOut, Contract::Cols, DType::F32, av, T, F, nullptr, given(kActOut), nullptr,
                                  bw_.act_col, nullptr, at<uint8_t>(bw_.act_col.codes_t, ws));
        act_col = {at<uint8_t>(bw_.act_col.codes_t, ws), q.scale_inv, nullptr};
      } else {
        act_col = quantize(kActOut, Contract::Rows, DType::F32, av, T, F, nullptr, nullptr, nullptr, bw_.act_col,
                           nullptr, nullptr);
      }
    } else {
      act_col = from_saved(kActOut, saved_.act_q, saved_.act_q_scale, saved, given(kActOut), bw_.act_col, T, F);
    }

    // 4. dy: db2 (the local rows), Q dy (rowwise for dact, columnwise / transposed for dW2);
    //    under sequence parallelism dy is all-gathered (in D) first.
    float* part_db2 = at<float>(bw_.part_db2, ws);
    if (c_.has_bias2) column_sums(d, chunk_h_, c_.rows(), H, a.dy, part_db2, st_);
    const void* dy = a.dy;
    if (sp_) {
      comm_->all_gather(a.dy, at<char>(bw_.dy_full, ws), c_.rows() * H, comm_type(d), st_);
      dy = at<char>(bw_.dy_full, ws);
    }
    GemmIn dy_row, dy_col;
    if (native_) {
      dy_row = quantize(kDy, Contract::Cols, d, dy, T, H, a.fp8_state, nullptr, nullptr, bw_.dy_row, nullptr,
                        at<uint8_t>(bw_.dy_col.codes_t, ws));
      dy_col = {at<uint8_t>(bw_.dy_col.codes_t, ws), dy_row.scale_inv, nullptr};
    } else {
      dy_row = quantize(kDy, Contract::Cols, d, dy, T, H, nullptr, nullptr, nullptr, bw_.dy_row, nullptr, nullptr);
      dy_col = quantize(kDy, Contract::Rows, d, dy, T, H, nullptr, nullptr, nullptr, bw_.dy_col, nullptr, nullptr);
    }

    // 5. dact = GEMM(dy, w2^T); dW2 = GEMM(act^T, dy).
    const GemmIn w2_row = quantize(kW2, Contract::Cols, d, a.w2, F, H, nullptr, given(kW2), nullptr, bw_.w2_row,
                                   nullptr, nullptr);
    float* dact = at<float>(bw_.dact, ws);
    gemm(g_dact_, g_dactn_, dy_row, w2_row, dact, gws);
    float* acc_w2 = at<float>(bw_.acc_w2, ws);
    gemm(g_dw2_, g_dw2n_, act_col, dy_col, acc_w2, gws);
    fp8_bias_round(d, acc_w2, F, H, nullptr, a.dw2, st_);

    // 6. dh = dact * act'(h) in fp32, db1; Q dh.
    float* dh = at<float>(bw_.dh, ws);
    float* part_db1 = c_.has_bias1 ? at<float>(bw_.part_db1, ws) : nullptr;
    act_backward(d, act_spec(), chunk_f_, dact, h, dh, part_db1, st_, true);
    GemmIn dh_row, dh_col;
    if (native_) {
      dh_row = quantize(kDh, Contract::Cols, DType::F32, dh, T, AF, a.fp8_state, nullptr, nullptr, bw_.dh_row, nullptr,
                        at<uint8_t>(bw_.dh_col.codes_t, ws));
      dh_col = {at<uint8_t>(bw_.dh_col.codes_t, ws), dh_row.scale_inv, nullptr};
    } else {
      dh_row = quantize(kDh, Contract::Cols, DType::F32, dh, T, AF, nullptr, nullptr, nullptr, bw_.dh_row, nullptr,
                        nullptr);
      dh_col = quantize(kDh, Contract::Rows, DType::F32, dh, T, AF, nullptr, nullptr, nullptr, bw_.dh_col, nullptr,
                        nullptr);
    }

    // 7. dn = GEMM(dh, w1^T); dW1 = GEMM(ln^T, dh).
    float* dn = at<float>(bw_.dn, ws);
    gemm(g_dn_, g_dnn_, dh_row, w1_row, dn, gws);
    float* acc_w1 = at<float>(bw_.acc_w1, ws);
    gemm(g_dw1_, g_dw1n_, ln_col, dh_col, acc_w1, gws);
    fp8_bias_round(d, acc_w1, H, AF, nullptr, a.dw1, st_);
    dn = group_sum_rows(comm_, sp_, dn, at<float>(bw_.dn_local, ws), T, H, st_);

    // 8. Norm backward and the deterministic column reductions.
    finish_backward(c_, norm_spec(), chunk_h_, chunk_f_, dn, mu, rs,
                    {at<float>(bw_.part_dg, ws), c_.has_beta() ? at<float>(bw_.part_dbeta, ws) : nullptr, part_db1, part_db2},
                    a, {sp_ ? comm_ : nullptr, sp_ ? at<float>(bw_.group_sum, ws) : nullptr}, st_);

    // 9. Delayed scaling: the backward quantizers move on.
    if (r_.stateful()) {
      record(a.fp8_state, kDy);
      record(a.fp8_state, kDh);
    }
    cuda_check(cudaGetLastError(), "an FP8 backward kernel launch");
  }

 private:
  // What a GEMM reads of one operand: per tensor, K-major codes and the scale_inv's device
  // address; blocked, the decoded operand.
  struct GemmIn {
    const uint8_t* codes = nullptr;
    const float* scale_inv = nullptr;
    const void* op = nullptr;
  };

  QuantKind kind(int q, Contract c) const { return quant_kind(r_, q, c); }

  // Quantizes x [rows, cols] (dtype `in`) for quantizer q as a GEMM contracting `contract` reads
  // it. Per tensor: amax, the scale (given / the delayed state / current scaling) into this
  // quantizer's device scalars, the codes into `codes_out` (default: the region's) and the
  // transposed codes into `codes_t_out` when not NULL; *used_out = the scale when not NULL.
  // Blocked: codes and scales into the regions, decoded into the operand.
  GemmIn quantize(int q, Contract contract, DType in, const void* x, int64_t rows, int64_t cols, float* state,
                  const float* given, float* used_out, const QRegions& reg, uint8_t* codes_out, uint8_t* codes_t_out) {
    const QuantKind k = kind(q, contract);
    if (native_) {
      uint32_t* amax = at<uint32_t>(sc_[q].amax, ws_);
      float* scale = at<float>(sc_[q].scale, ws_);
      if (given == nullptr) {
        fp8_amax(in, x, rows * cols, amax, st_);
        // Sharded: the group's amax (the bits of a non-negative float order like the float).
        if (comm_ != nullptr) comm_->all_reduce_max(amax, amax, 1, CommType::F32, st_);
      }
      const float* state_scale = state != nullptr && r_.stateful() ? state + q * r_.state_stride() : nullptr;
      fp8_per_tensor_scale(given, state_scale, amax, numerics::fp8_max(k.format), r_.power_2_scale, r_.amax_epsilon,
                           scale, used_out, st_);
      uint8_t* codes = codes_out != nullptr ? codes_out : at<uint8_t>(reg.codes, ws_);
      uint8_t* codes_t = codes_t_out;
      if (codes == nullptr && codes_t == nullptr) codes_t = at<uint8_t>(reg.codes_t, ws_);
      fp8_quantize_per_tensor(in, k.format, x, rows, cols, scale, codes, codes_t, st_);
      // Which orientation the GEMM reads is the caller's business; codes first, else codes_t.
      return {codes != nullptr ? codes : codes_t, scale + 1, nullptr};
    }
    uint8_t* codes = at<uint8_t>(reg.codes, ws_);
    void* scales = at<void>(reg.scales, ws_);
    fp8_quantize_blocked(in, k, x, rows, cols, codes, scales, st_);
    void* op = at<void>(reg.op, ws_);
    fp8_decode_operand(k, codes, scales, rows, cols, op_f32_, op, st_);
    return {nullptr, nullptr, op};
  }

  // The wgrad operand forward saved: per tensor, the transposed codes and forward's scale (its
  // scale_inv computed into the quantizer's scalars); blocked, decoded from codes and scales.
  GemmIn from_saved(int q, const Region& codes, const Region& scales, void* saved, const float* given,
                    const QRegions& reg, int64_t rows, int64_t cols) {
    if (native_) {
      float* scale = at<float>(sc_[q].scale, ws_);
      fp8_per_tensor_scale(given, nullptr, nullptr, 1.0f, false, 0.0f, scale, nullptr, st_);
      return {at<uint8_t>(codes, saved), scale + 1, nullptr};
    }
    void* op = at<void>(reg.op, ws_);
    fp8_decode_operand(kind(q, Contract::Rows), at<uint8_t>(codes, saved), at<void>(scales, saved), rows, cols, op_f32_,
                       op, st_);
    return {nullptr, nullptr, op};
  }

  void gemm(const std::unique_ptr<LtGemm>& emulated, const std::unique_ptr<LtFp8Gemm>& fp8, const GemmIn& x,
            const GemmIn& y, float* c, void* gemm_ws) {
    if (native_) fp8->run(x.codes, x.scale_inv, y.codes, y.scale_inv, c, gemm_ws, st_);
    else emulated->run(x.op, y.op, nullptr, c, gemm_ws, st_);
  }

  void record(float* state, int q) {
    fp8_delayed_update(state + q * r_.state_stride(), r_.history_len, at<uint32_t>(sc_[q].amax, ws_), r_.amax_max,
                       numerics::fp8_max(r_.formats[q]), r_.margin, st_);
  }

  void build() {
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    const bool trains = c_.remat != Remat::ForwardOnly;
    int64_t gemm_ws = 0;
    if (native_) {
      // K-major operands: C[m, n] = X[m, k] @ Y[n, k]^T (gemm_fp8.h).
      auto make = [&](std::unique_ptr<LtFp8Gemm>& g, int64_t m, int64_t n, int64_t k, int qx, int qy, const char* name) {
        g = std::make_unique<LtFp8Gemm>(lt_, m, n, k, r_.formats[qx], r_.formats[qy], kMaxGemmWorkspace, name);
        gemm_ws = std::max(gemm_ws, g->workspace_bytes());
      };
      make(g1n_, T, AF, H, kLnOut, kW1, "GEMM1 (ln @ W1)");
      make(g2n_, T, H, F, kActOut, kW2, "GEMM2 (act @ W2)");
      if (trains) {
        make(g_dactn_, T, F, H, kDy, kW2, "dact (dy @ W2^T)");
        make(g_dw2n_, F, H, T, kActOut, kDy, "dW2 (act^T @ dy)");
        make(g_dnn_, T, H, AF, kDh, kW1, "dln (dh @ W1^T)");
        make(g_dw1n_, H, AF, T, kLnOut, kDh, "dW1 (ln^T @ dh)");
      }
    } else {
      op_f32_ = r_.recipe == Recipe::Block && !r_.power_2_scale;
      const DType op = op_f32_ ? DType::F32 : DType::BF16;
      auto make = [&](std::unique_ptr<LtGemm>& g, GemmShape s, const char* name) {
        s.input = op;
        s.output_f32 = true;
        s.bias = false;
        g = std::make_unique<LtGemm>(lt_, s, kMaxGemmWorkspace, name);
        gemm_ws = std::max(gemm_ws, g->workspace_bytes());
      };
      const BlockGemmShapes s = block_gemm_shapes(T, H, F, c_.num_acts, op, false, false);
      make(g1_, s.gemm1, "GEMM1 (ln @ W1)");
      make(g2_, s.gemm2, "GEMM2 (act @ W2)");
      if (trains) {
        make(g_dact_, s.dact, "dact (dy @ W2^T)");
        make(g_dw2_, s.dw2, "dW2 (act^T @ dy)");
        make(g_dn_, s.dn, "dln (dh @ W1^T)");
        make(g_dw1_, s.dw1, "dW1 (ln^T @ dh)");
      }
    }
    const int64_t Tn = c_.rows();
    chunk_h_ = column_chunking(Tn, H);  // dgamma, dbeta, db2: over the local rows
    chunk_f_ = column_chunking(T, F);
    const int64_t e = dtype_bytes(c_.dtype);
    const int64_t opb = op_f32_ ? 4 : 2;
    const bool save_all = saved_.ln_q.present();

    // The regions of one operand: per tensor, codes and/or transposed codes; blocked, codes,
    // scales and the decoded operand.
    auto take_q = [&](RegionAllocator& al, int q, Contract ct, int64_t rows, int64_t cols, bool codes, bool codes_t) {
      QRegions g;
      if (native_) {
        g.codes = al.take_if(codes, rows * cols, 1, "FP8 codes");
        g.codes_t = al.take_if(codes_t, rows * cols, 1, "FP8 transposed codes");
      } else {
        const QuantKind k = kind(q, ct);
        g.codes = al.take(rows * cols, 1, "FP8 codes");
        g.scales = al.take(std::max<int64_t>(1, k.scale_count(rows, cols)), k.scale_bytes(), "FP8 scales");
        g.op = al.take(rows * cols, opb, "FP8 GEMM operand");
      }
      return g;
    };
    auto take_scalars = [&](RegionAllocator& al) {
      for (int q = 0; q < kQuantizerCount; ++q) {
        sc_[q].scale = al.take(2, 4, "FP8 scale");
        sc_[q].amax = al.take(1, 4, "FP8 amax");
      }
    };
    {  // forward
      RegionAllocator al;
      take_scalars(al);
      fw_.mu = al.take_if(!saved_.rs.present() && c_.has_beta(), Tn, 4, "mean");
      fw_.rs = al.take_if(!saved_.rs.present(), Tn, 4, "rstd");
      fw_.n = al.take(T * H, 4, "ln_out fp32");
      fw_.n_local = al.take_if(sp_, Tn * H, 4, "local ln_out rows fp32");
      fw_.ln_local = al.take_if(sp_ && native_, Tn * H, 1, "local ln_out codes (all-gathered)");
      fw_.y_local = al.take_if(sp_, Tn * H, 4, "reduce-scattered GEMM2 rows");
      fw_.ln = take_q(al, kLnOut, Contract::Cols, T, H, true, false);
      fw_.w1 = take_q(al, kW1, Contract::Rows, H, AF, false, true);
      fw_.acc1 = al.take(T * AF, 4, "GEMM1 fp32");
      fw_.h = al.take_if(!saved_.h.present(), T * AF, e, "ffn1");
      fw_.a = al.take(T * F, 4, "act_out fp32");
      fw_.act = take_q(al, kActOut, Contract::Cols, T, F, true, false);
      fw_.w2 = take_q(al, kW2, Contract::Rows, F, H, false, true);
      fw_.acc2 = al.take(T * H, 4, "GEMM2 fp32");
      fw_.gemm = al.take(gemm_ws, 1, "cuBLASLt workspace");
      ws_bytes_ = al.total();
    }
    if (trains) {  // backward, over the same memory (the scalars first, at the same offsets)
      const bool recompute_h = !saved_.h.present();
      RegionAllocator al;
      take_scalars(al);
      bw_.n = al.take_if(!save_all, T * H, 4, "ln_out fp32");
      bw_.n_local = al.take_if(sp_ && !save_all, Tn * H, 4, "local ln_out rows fp32");
      bw_.dy_full = al.take_if(sp_, T * H, e, "all-gathered dy");
      bw_.dn_local = al.take_if(sp_, Tn * H, 4, "reduce-scattered dln_out rows");
      bw_.group_sum = al.take_if(sp_, H, 4, "group-summed parameter gradient");
      bw_.ln_row = take_q(al, kLnOut, Contract::Cols, T, H, recompute_h, false);
      bw_.ln_col = take_q(al, kLnOut, Contract::Rows, T, H, false, !save_all);
      bw_.w1_row = take_q(al, kW1, Contract::Cols, H, AF, true, false);
      bw_.w1_col = take_q(al, kW1, Contract::Rows, H, AF, false, recompute_h);
      bw_.acc1 = al.take_if(recompute_h, T * AF, 4, "GEMM1 fp32");
      bw_.h = al.take_if(recompute_h, T * AF, e, "ffn1");
      bw_.a = al.take_if(!save_all, T * F, 4, "act_out fp32");
      bw_.act_col = take_q(al, kActOut, Contract::Rows, T, F, false, !save_all);
      bw_.dy_row = take_q(al, kDy, Contract::Cols, T, H, true, false);
      bw_.dy_col = take_q(al, kDy, Contract::Rows, T, H, false, true);
      bw_.w2_row = take_q(al, kW2, Contract::Cols, F, H, true, false);
      bw_.dact = al.take(T * F, 4, "dact");
      bw_.acc_w2 = al.take(F * H, 4, "dW2 fp32");
      bw_.dh = al.take(T * AF, 4, "dffn1 fp32");
      bw_.dh_row = take_q(al, kDh, Contract::Cols, T, AF, true, false);
      bw_.dh_col = take_q(al, kDh, Contract::Rows, T, AF, false, true);
      bw_.dn = al.take(T * H, 4, "dln_out");
      bw_.acc_w1 = al.take(H * AF, 4, "dW1 fp32");
      bw_.part_db2 = al.take_if(c_.has_bias2, chunk_h_.chunks * H, 4, "db2 partials");
      bw_.part_db1 = al.take_if(c_.has_bias1, chunk_f_.chunks * AF, 4, "db1 partials");
      bw_.part_dg = al.take(chunk_h_.chunks * H, 4, "dgamma partials");
      bw_.part_dbeta = al.take_if(c_.has_beta(), chunk_h_.chunks * H, 4, "dbeta partials");
      bw_.gemm = al.take(gemm_ws, 1, "cuBLASLt workspace");
      ws_bytes_ = std::max(ws_bytes_, al.total());
    }
  }

  void release_gemms() noexcept {
    for (auto* g : {&g1_, &g2_, &g_dact_, &g_dw2_, &g_dn_, &g_dw1_}) g->reset();
    for (auto* g : {&g1n_, &g2n_, &g_dactn_, &g_dw2n_, &g_dnn_, &g_dw1n_}) g->reset();
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    lt_ = nullptr;
  }

  // The norm runs on the rows this rank holds (T/P under sequence parallelism).
  NormSpec norm_spec() const { return {c_.norm, c_.zero_centered_gamma, c_.epsilon, c_.rows(), c_.hidden}; }
  ActSpec act_spec() const { return {c_.acts[0], c_.acts[1], c_.gated(), c_.act_params, c_.tokens, c_.ffn}; }

  Config c_;
  SavedLayout saved_;
  ResolvedRecipe r_;
  Communicator* comm_ = nullptr;  // sharded plans only (the module's NCCL communicator)
  bool sp_ = false;               // sequence parallel
  bool native_ = false;   // per-tensor recipes: FP8 tensor cores
  bool op_f32_ = false;   // blocked recipes: fp32 operands (block scales not powers of two)
  cublasLtHandle_t lt_ = nullptr;
  std::unique_ptr<LtGemm> g1_, g2_, g_dact_, g_dw2_, g_dn_, g_dw1_;               // emulated
  std::unique_ptr<LtFp8Gemm> g1n_, g2n_, g_dactn_, g_dw2n_, g_dnn_, g_dw1n_;       // native
  Chunking chunk_h_, chunk_f_;
  QScalars sc_[kQuantizerCount];
  struct {
    Region mu, rs, n, acc1, h, a, acc2, gemm, n_local, ln_local, y_local;
    QRegions ln, w1, act, w2;
  } fw_;
  struct {
    Region n, acc1, h, a, dact, acc_w2, dh, dn, acc_w1, part_db2, part_db1, part_dg, part_dbeta, gemm;
    Region n_local, dy_full, dn_local, group_sum;
    QRegions ln_row, ln_col, w1_row, w1_col, act_col, dy_row, dy_col, w2_row, dh_row, dh_col;
  } bw_;
  int64_t ws_bytes_ = 0;
  // Per call.
  cudaStream_t st_ = nullptr;
  void* ws_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_fp8_backend(const Config& cfg, const SavedLayout& saved) {
  return std::make_unique<CudaFp8Backend>(cfg, saved);
}

}  // namespace lnmlp::cuda
