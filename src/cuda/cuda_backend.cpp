// Sharded (DESIGN section 4, docs/sharding.md), the CPU backend's steps on the GPU: the same
// passes on the F/P shard, with NCCL collectives on the plan's stream between them (collectives.h).
// GEMM2 writes fp32 partial sums (no bias), all-reduced, or reduce-scattered to the local rows
// under sequence parallelism, before b2 and the rounding; dn is all-reduced (reduce-scattered)
// before norm backward. Under sequence parallelism the norm runs on the local T/P rows and its
// output is all-gathered (in D), dy is all-gathered (in D), and dgamma, dbeta and db2 are summed
// over the group (backward_tail.h).
#include "cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "backward_tail.h"
#include "check.h"
#include "collectives.h"
#include "device_memory.h"
#include "device_pointers.h"
#include "fp8_kernels.h"
#include "gemm_cublaslt.h"
#include "kernels.h"
#include "nccl_comm.h"

namespace lnmlp::cuda {
namespace {

// cuBLASLt workspace offered to the heuristic (32 MiB is what NVIDIA recommends for Hopper).
constexpr int64_t kMaxGemmWorkspace = int64_t{32} << 20;

class CudaBackend final : public DeviceMemoryBackend {
 public:
  CudaBackend(const Config& cfg, const SavedLayout& saved) : DeviceMemoryBackend(cfg.device), c_(cfg), saved_(saved) {
    ScopedDevice dev(device_);
    comm_ = c_.shard.comm;  // the module's NCCL communicator (module.cpp), set for sharded plans only
    sp_ = comm_ != nullptr && c_.shard.sequence_parallel;
    cublas_check(cublasLtCreate(&lt_), "cublasLtCreate");
    try {
      build();
    } catch (...) {
      destroy_gemms();
      throw;
    }
  }
  ~CudaBackend() override { destroy_gemms(); }
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  int64_t workspace_bytes() const override { return ws_bytes_; }
  int64_t alignment() const override { return kCudaAlignment; }

  void forward(const ForwardArgs& a, void* ws) override {
    ScopedDevice dev(device_);
    cudaStream_t st = static_cast<cudaStream_t>(a.stream);
    check_device_pointers({{"x", a.x}, {"gamma", a.gamma}, {"beta", a.beta}, {"w1", a.w1}, {"b1", a.b1},
                           {"w2", a.w2}, {"b2", a.b2}, {"y", a.y}, {"saved", a.saved}, {"workspace", ws}},
                          device_, kGemmPointerAlignment, st);
    const DType d = c_.dtype;
    const int64_t T = c_.tokens, H = c_.hidden;
    float* mu = saved_.mu.present() ? at<float>(saved_.mu, a.saved) : at<float>(fw_.mu, ws);
    float* rs = saved_.rs.present() ? at<float>(saved_.rs, a.saved) : at<float>(fw_.rs, ws);
    void* ln = saved_.ln_out.present() ? at<char>(saved_.ln_out, a.saved) : at<char>(fw_.ln, ws);
    void* h = saved_.h.present() ? at<char>(saved_.h, a.saved) : at<char>(fw_.h, ws);
    void* act = saved_.act.present() ? at<char>(saved_.act, a.saved) : at<char>(fw_.act, ws);
    void* gws = at<char>(fw_.gemm, ws);

    run_norm_forward(a, true, mu, rs, ln, at<char>(fw_.ln_local, ws), st);
    g1_->run(ln, a.w1, a.b1, h, gws, st);
    act_forward(d, act_spec(), h, act, st);
    if (comm_ == nullptr) {
      g2_->run(act, a.w2, a.b2, a.y, gws, st);
    } else {  // a rank's fp32 partial sums, summed over the group, then + b2 and rounded
      float* y32 = at<float>(fw_.y32, ws);
      g2_->run(act, a.w2, nullptr, y32, gws, st);
      y32 = group_sum_rows(comm_, sp_, y32, at<float>(fw_.y_local, ws), T, H, st);
      fp8_bias_round(d, y32, c_.rows(), H, a.b2, a.y, st);
    }
    cuda_check(cudaGetLastError(), "a forward kernel launch");
  }

  void backward(const BackwardArgs& a, void* ws) override {
    ScopedDevice dev(device_);
    cudaStream_t st = static_cast<cudaStream_t>(a.stream);
    check_device_pointers({{"dy", a.dy}, {"x", a.x}, {"gamma", a.gamma}, {"beta", a.beta}, {"w1", a.w1},
                           {"b1", a.b1}, {"w2", a.w2}, {"saved", a.saved}, {"dx", a.dx}, {"dgamma", a.dgamma},
                           {"dbeta", a.dbeta}, {"dw1", a.dw1}, {"db1", a.db1}, {"dw2", a.dw2}, {"db2", a.db2},
                           {"workspace", ws}},
                          device_, kGemmPointerAlignment, st);
    const DType d = c_.dtype;
    const int64_t T = c_.tokens, H = c_.hidden;
    // saved is read-only here; the const_cast only lets recompute buffers share pointer types.
    void* saved = const_cast<void*>(a.saved);
    const float* mu = at<float>(saved_.mu, saved);
    const float* rs = at<float>(saved_.rs, saved);
    void* gws = at<char>(bw_.gemm, ws);

    // 1. What forward did not save, recompute (same kernels and algorithms, same bits).
    void* ln = saved_.ln_out.present() ? at<char>(saved_.ln_out, saved) : at<char>(bw_.ln, ws);
    if (!saved_.ln_out.present())
      run_norm_forward(a, false, const_cast<float*>(mu), const_cast<float*>(rs), ln, at<char>(bw_.ln_local, ws), st);
    void* h = saved_.h.present() ? at<char>(saved_.h, saved) : at<char>(bw_.h, ws);
    if (!saved_.h.present()) g1_->run(ln, a.w1, a.b1, h, gws, st);
    void* act = saved_.act.present() ? at<char>(saved_.act, saved) : at<char>(bw_.act, ws);
    if (!saved_.act.present()) act_forward(d, act_spec(), h, act, st);

    // 2. db2's partial column sums of dy (the local rows); under sequence parallelism the GEMMs
    //    read dy all-gathered.
    float* part_db2 = at<float>(bw_.part_db2, ws);
    if (c_.has_bias2) column_sums(d, chunk_h_, c_.rows(), H, a.dy, part_db2, st);
    const void* dy = a.dy;
    if (sp_) {
      comm_->all_gather(a.dy, at<char>(bw_.dy_full, ws), c_.rows() * H, comm_type(d), st);
      dy = at<char>(bw_.dy_full, ws);
    }

    // 3. GEMM2's gradients.
    float* dact = at<float>(bw_.dact, ws);
    g_dact_->run(dy, a.w2, nullptr, dact, gws, st);
    g_dw2_->run(act, dy, nullptr, a.dw2, gws, st);

    // 4. Activation backward with db1's partial sums.
    void* dh = at<char>(bw_.dh, ws);
    float* part_db1 = c_.has_bias1 ? at<float>(bw_.part_db1, ws) : nullptr;
    act_backward(d, act_spec(), chunk_f_, dact, h, dh, part_db1, st);

    // 5. GEMM1's gradients; dn is a rank's partial sum when sharded.
    float* dn = at<float>(bw_.dn, ws);
    g_dn_->run(dh, a.w1, nullptr, dn, gws, st);
    g_dw1_->run(ln, dh, nullptr, a.dw1, gws, st);
    dn = group_sum_rows(comm_, sp_, dn, at<float>(bw_.dn_local, ws), T, H, st);

    // 6. Norm backward, and the final pass of every column reduction, chunks in order.
    finish_backward(c_, norm_spec(), chunk_h_, chunk_f_, dn, mu, rs,
                    {at<float>(bw_.part_dg, ws), c_.has_beta() ? at<float>(bw_.part_dbeta, ws) : nullptr, part_db1, part_db2},
                    a, {sp_ ? comm_ : nullptr, sp_ ? at<float>(bw_.group_sum, ws) : nullptr}, st);
    cuda_check(cudaGetLastError(), "a backward kernel launch");
  }

 private:
  void build() {
    const int64_t T = c_.tokens, H = c_.hidden, F = c_.ffn, AF = c_.act_width();
    const int64_t Tn = c_.rows();
    BlockGemmShapes s = block_gemm_shapes(T, H, F, c_.num_acts, c_.dtype, c_.has_bias1, c_.has_bias2);
    if (comm_ != nullptr) {  // GEMM2's partial sums in fp32, b2 added after the group's sum
      s.gemm2.output_f32 = true;
      s.gemm2.bias = false;
    }
    g1_ = std::make_unique<LtGemm>(lt_, s.gemm1, kMaxGemmWorkspace, "GEMM1 (ln @ W1)");
    g2_ = std::make_unique<LtGemm>(lt_, s.gemm2, kMaxGemmWorkspace, "GEMM2 (act @ W2)");
    int64_t gemm_ws = std::max(g1_->workspace_bytes(), g2_->workspace_bytes());
    const bool trains = c_.remat != Remat::ForwardOnly;
    if (trains) {
      g_dact_ = std::make_unique<LtGemm>(lt_, s.dact, kMaxGemmWorkspace, "dact (dy @ W2^T)");
      g_dw2_ = std::make_unique<LtGemm>(lt_, s.dw2, kMaxGemmWorkspace, "dW2 (act^T @ dy)");
      g_dn_ = std::make_unique<LtGemm>(lt_, s.dn, kMaxGemmWorkspace, "dln (dh @ W1^T)");
      g_dw1_ = std::make_unique<LtGemm>(lt_, s.dw1, kMaxGemmWorkspace, "dW1 (ln^T @ dh)");
      for (const LtGemm* g : {g_dact_.get(), g_dw2_.get(), g_dn_.get(), g_dw1_.get()})
        gemm_ws = std::max(gemm_ws, g->workspace_bytes());
    }
    chunk_h_ = column_chunking(Tn, H);  // dgamma, dbeta, db2: over the local rows
    chunk_f_ = column_chunking(T, F);

    const int64_t e = dtype_bytes(c_.dtype);
    const int64_t TH = checked_mul(T, H, "T x H"), TF = checked_mul(T, F, "T x F"), TAF = checked_mul(T, AF, "T x A*F");
    {  // forward workspace
      RegionAllocator r;
      fw_.mu = r.take_if(!saved_.rs.present() && c_.has_beta(), Tn, 4, "mean");
      fw_.rs = r.take_if(!saved_.rs.present(), Tn, 4, "rstd");
      fw_.ln = r.take_if(!saved_.ln_out.present(), TH, e, "ln_out");
      fw_.ln_local = r.take_if(sp_, Tn * H, e, "local ln_out rows (all-gathered)");
      fw_.y32 = r.take_if(comm_ != nullptr, TH, 4, "GEMM2 fp32 partial sums");
      fw_.y_local = r.take_if(sp_, Tn * H, 4, "reduce-scattered GEMM2 rows");
      fw_.h = r.take_if(!saved_.h.present(), TAF, e, "ffn1");
      fw_.act = r.take_if(!saved_.act.present(), TF, e, "act_out");
      fw_.gemm = r.take(gemm_ws, 1, "cuBLASLt workspace");
      ws_bytes_ = r.total();
    }
    if (trains) {  // backward workspace, over the same memory
      RegionAllocator r;
      bw_.ln = r.take_if(!saved_.ln_out.present(), TH, e, "ln_out");
      bw_.ln_local = r.take_if(sp_ && !saved_.ln_out.present(), Tn * H, e, "local ln_out rows (all-gathered)");
      bw_.dy_full = r.take_if(sp_, TH, e, "all-gathered dy");
      bw_.dn_local = r.take_if(sp_, Tn * H, 4, "reduce-scattered dln_out rows");
      bw_.group_sum = r.take_if(sp_, H, 4, "group-summed parameter gradient");
      bw_.h = r.take_if(!saved_.h.present(), TAF, e, "ffn1");
      bw_.act = r.take_if(!saved_.act.present(), TF, e, "act_out");
      bw_.dact = r.take(TF, 4, "dact");
      bw_.dh = r.take(TAF, e, "dffn1");
      bw_.dn = r.take(TH, 4, "dln_out");
      bw_.part_db2 = r.take_if(c_.has_bias2, chunk_h_.chunks * H, 4, "db2 partials");
      bw_.part_db1 = r.take_if(c_.has_bias1, chunk_f_.chunks * AF, 4, "db1 partials");
      bw_.part_dg = r.take(chunk_h_.chunks * H, 4, "dgamma partials");
      bw_.part_dbeta = r.take_if(c_.has_beta(), chunk_h_.chunks * H, 4, "dbeta partials");
      bw_.gemm = r.take(gemm_ws, 1, "cuBLASLt workspace");
      ws_bytes_ = std::max(ws_bytes_, r.total());
    }
  }

  void destroy_gemms() noexcept {
    g1_.reset();
    g2_.reset();
    g_dact_.reset();
    g_dw2_.reset();
    g_dn_.reset();
    g_dw1_.reset();
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    lt_ = nullptr;
  }

  // Norm forward (or its recomputation) over the local rows into ln [T, H]; under sequence
  // parallelism into `local` [T/P, H], then all-gathered into ln.
  template <typename Args>
  void run_norm_forward(const Args& a, bool stats, float* mu, float* rs, void* ln, void* local, cudaStream_t st) {
    norm_forward(c_.dtype, norm_spec(), a.x, a.gamma, a.beta, stats, mu, rs, sp_ ? local : ln, st);
    if (sp_) comm_->all_gather(local, ln, c_.rows() * c_.hidden, comm_type(c_.dtype), st);
  }

  // The norm runs on the rows this rank holds (T/P under sequence parallelism).
  NormSpec norm_spec() const { return {c_.norm, c_.zero_centered_gamma, c_.epsilon, c_.rows(), c_.hidden}; }
  ActSpec act_spec() const {
    return {c_.acts[0], c_.acts[1], c_.gated(), c_.act_params, c_.tokens, c_.ffn};
  }

  Config c_;
  SavedLayout saved_;
  Communicator* comm_ = nullptr;  // sharded plans only (the module's NCCL communicator)
  bool sp_ = false;               // sequence parallel
  cublasLtHandle_t lt_ = nullptr;
  std::unique_ptr<LtGemm> g1_, g2_, g_dact_, g_dw2_, g_dn_, g_dw1_;
  Chunking chunk_h_, chunk_f_;
  struct {
    Region mu, rs, ln, h, act, gemm, ln_local, y32, y_local;
  } fw_;
  struct {
    Region ln, h, act, dact, dh, dn, part_db2, part_db1, part_dg, part_dbeta, gemm;
    Region ln_local, dy_full, dn_local, group_sum;
  } bw_;
  int64_t ws_bytes_ = 0;
};

}  // namespace

int device_count() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail(LNMLP_ERROR_NOT_SUPPORTED, "the CUDA backend cannot run on this machine: ", cudaGetErrorName(e), " (",
         cudaGetErrorString(e), "); it needs an NVIDIA GPU and driver, or use LNMLP_BACKEND_CPU");
  }
  if (n < 1)
    fail(LNMLP_ERROR_NOT_SUPPORTED, "the CUDA backend found no CUDA device on this machine; use LNMLP_BACKEND_CPU");
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(const Config& cfg, const SavedLayout& saved) {
  const int n = device_count();
  if (cfg.device >= n)
    fail(LNMLP_ERROR_NOT_SUPPORTED, "CUDA device ", cfg.device, " does not exist: this machine has ", n,
         " CUDA device", n == 1 ? "" : "s", " (ordinals 0 to ", n - 1, "); pass one of them to lnmlp_desc_set_backend");
  if (cfg.shard.comm != nullptr && nccl_device(*cfg.shard.comm) != cfg.device)
    fail(LNMLP_ERROR_INVALID_ARGUMENT, "the NCCL communicator (rank ", cfg.shard.comm->rank(), ") is on CUDA device ",
         nccl_device(*cfg.shard.comm), " but the plan is on device ", cfg.device,
         "; pass the communicator's device to lnmlp_desc_set_backend");
  if (cfg.quantized()) return make_cuda_fp8_backend(cfg, saved);
  return std::make_unique<CudaBackend>(cfg, saved);
}

}  // namespace lnmlp::cuda
