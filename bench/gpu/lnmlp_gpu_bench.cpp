// lnmlp-gpu-bench: the fused block forward + backward on the CUDA backend for transformer shapes,
// timed with CUDA events, next to its peer measured in the same run: the same six GEMMs alone
// through cuBLASLt (the backend's own GEMM layer, same shapes, types and algorithms). Prints a
// table line and a JSON line per case.
//
//   lnmlp-gpu-bench [--tokens T] [--hidden H] [--ffn F] [--act gelu|swiglu|...] [--dtype bf16|f16|f32]
//                   [--remat save_all|save_ffn1|save_stats] [--recipe none|delayed|current|block|mxfp8]
//                   [--iters N] [--warmup N] [--quick] [--device N]
// Without --hidden it runs the standard cases: T = 16384, H = 4096 and 8192, gelu with F = 4H and
// Llama-style swiglu with F = 3.5H, in bf16 (or --dtype), without FP8 and under each FP8 recipe.
// The peer of an FP8 recipe whose GEMMs run on FP8 tensor cores (delayed, current; BLOCK on Hopper
// with cuBLASLt 12.9, with its 1 x 128 and 128 x 128 block scales) is the six FP8 GEMMs alone
// (cuBLASLt, E4M3 x E4M3 forward, E5M2 x E4M3 backward), and its fraction is of the dense FP8
// peak; an emulated blocked recipe (MXFP8, BLOCK elsewhere: bf16 GEMMs on decoded operands) is set
// against bf16.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "block/gemm_roles.h"
#include "common/error.h"
#include "cuda/gemm_cublaslt.h"
#include "cuda/gemm_plan.h"
#include "lnmlp.h"

namespace {

constexpr double kPeakBf16Tflops = 989.0;  // dense bf16, H100 / H200 SXM
constexpr double kPeakFp8Tflops = 1979.0;  // dense FP8, H100 / H200 SXM

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "lnmlp-gpu-bench: %s\n", what.c_str());
  std::exit(1);
}
void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void lnmlp_ok(int32_t st, const char* what) {
  if (st != LNMLP_SUCCESS) die(std::string(what) + ": " + lnmlp_status_string(st) + ": " + lnmlp_last_error());
}

struct Case {
  int64_t T, H, F;
  std::string act, dtype, remat;
  std::string recipe = "none";
};

struct Options {
  std::vector<Case> cases;
  int iters = 5, warmup = 2, device = 0;
};

int32_t dtype_of(const std::string& s) {
  if (s == "bf16") return LNMLP_DTYPE_BF16;
  if (s == "f16") return LNMLP_DTYPE_F16;
  if (s == "f32") return LNMLP_DTYPE_F32;
  die("unknown --dtype " + s + " (bf16, f16, f32)");
}
int32_t recipe_of(const std::string& s) {
  if (s == "none") return LNMLP_RECIPE_NONE;
  if (s == "delayed") return LNMLP_RECIPE_DELAYED;
  if (s == "current") return LNMLP_RECIPE_CURRENT;
  if (s == "block") return LNMLP_RECIPE_BLOCK;
  if (s == "mxfp8") return LNMLP_RECIPE_MXFP8;
  die("unknown --recipe " + s + " (none, delayed, current, block, mxfp8)");
}
int32_t remat_of(const std::string& s) {
  if (s == "save_all") return LNMLP_REMAT_SAVE_ALL;
  if (s == "save_ffn1") return LNMLP_REMAT_SAVE_FFN1;
  if (s == "save_stats") return LNMLP_REMAT_SAVE_STATS;
  die("unknown --remat " + s + " (save_all, save_ffn1, save_stats)");
}
std::vector<int32_t> acts_of(const std::string& s) {
  const char* single[] = {"linear", "relu", "gelu", "silu", "quick_gelu", "squared_relu", "sigmoid"};
  for (int32_t i = 0; i < 7; ++i)
    if (s == single[i]) return {i};
  if (s == "geglu") return {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR};
  if (s == "swiglu") return {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  if (s == "reglu") return {LNMLP_ACT_RELU, LNMLP_ACT_LINEAR};
  if (s == "clamped_swiglu") return {LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR};
  die("unknown --act " + s);
}

Options parse(int argc, char** argv) {
  Options o;
  Case one{16384, 0, 0, "", "bf16", "save_all"};
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
      continue;
    }
    if (a == "--help" || a == "-h" || i + 1 >= argc)
      die("usage: lnmlp-gpu-bench [--tokens T] [--hidden H] [--ffn F] [--act NAME] [--dtype bf16|f16|f32] "
          "[--remat save_all|save_ffn1|save_stats] [--recipe none|delayed|current|block|mxfp8] [--iters N] "
          "[--warmup N] [--quick] [--device N]");
    const char* v = argv[++i];
    if (a == "--tokens") one.T = std::atoll(v);
    else if (a == "--hidden") one.H = std::atoll(v);
    else if (a == "--ffn") one.F = std::atoll(v);
    else if (a == "--act") one.act = v;
    else if (a == "--dtype") one.dtype = v;
    else if (a == "--remat") one.remat = v;
    else if (a == "--recipe") one.recipe = v;
    else if (a == "--iters") o.iters = std::atoi(v);
    else if (a == "--warmup") o.warmup = std::atoi(v);
    else if (a == "--device") o.device = std::atoi(v);
    else die("unknown option " + a);
  }
  if (o.iters < 1 || o.warmup < 0) die("--iters must be >= 1 and --warmup >= 0");
  if (one.H > 0) {
    if (one.act.empty()) one.act = "gelu";
    if (one.F == 0) one.F = one.act == "swiglu" ? one.H * 7 / 2 : 4 * one.H;
    o.cases.push_back(one);
  } else {
    for (const char* recipe : {"none", "delayed", "current", "block", "mxfp8"})
      for (int64_t H : {int64_t{4096}, int64_t{8192}}) {
        if (quick && H == 8192 && std::string(recipe) != "none") continue;  // --quick: FP8 at H = 4096 only
        o.cases.push_back({one.T, H, 4 * H, "gelu", one.dtype, one.remat, recipe});
        o.cases.push_back({one.T, H, H * 7 / 2, "swiglu", one.dtype, one.remat, recipe});
      }
  }
  return o;
}

// Device memory filled with small random values (a host block of random numbers, tiled).
struct DeviceTensor {
  void* p = nullptr;
  size_t bytes = 0;
  DeviceTensor(size_t n, int64_t elem, float scale, uint64_t seed) : bytes(n * static_cast<size_t>(elem)) {
    if (bytes == 0) return;  // an absent tensor (no beta, no bias): NULL
    cuda_ok(cudaMalloc(&p, bytes), "cudaMalloc");
    if (scale == 0.0f) {
      cuda_ok(cudaMemset(p, 0, bytes), "cudaMemset");
      return;
    }
    const size_t block = 1 << 22;  // bytes
    std::vector<unsigned char> host(block);
    std::mt19937 g(static_cast<uint32_t>(seed));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (size_t i = 0; i + static_cast<size_t>(elem) <= block; i += static_cast<size_t>(elem)) {
      const float f = u(g);
      if (elem == 4) {
        std::memcpy(&host[i], &f, 4);
      } else if (elem == 1) {  // FP8 codes: finite in both formats (magnitude bits below 0x70)
        host[i] = static_cast<unsigned char>((g() % 0x70u) | (f < 0.0f ? 0x80u : 0u));
      } else {  // bf16 or f16: both fine as bit patterns of bf16 (|f| < 1 keeps f16 bits finite too)
        uint32_t b;
        std::memcpy(&b, &f, 4);
        const uint16_t h = static_cast<uint16_t>(b >> 16);
        std::memcpy(&host[i], &h, 2);
      }
    }
    for (size_t off = 0; off < bytes; off += block)
      cuda_ok(cudaMemcpy(static_cast<char*>(p) + off, host.data(), std::min(block, bytes - off), cudaMemcpyHostToDevice),
              "cudaMemcpy");
  }
  ~DeviceTensor() {
    if (p != nullptr) cudaFree(p);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
};

struct Events {
  cudaEvent_t a, b, c;
  Events() {
    cuda_ok(cudaEventCreate(&a), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&b), "cudaEventCreate");
    cuda_ok(cudaEventCreate(&c), "cudaEventCreate");
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaEventDestroy(c);
  }
  // Milliseconds a -> b and b -> c, after c completed.
  std::pair<double, double> read() const {
    cuda_ok(cudaEventSynchronize(c), "cudaEventSynchronize");
    float ab = 0, bc = 0;
    cuda_ok(cudaEventElapsedTime(&ab, a, b), "cudaEventElapsedTime");
    cuda_ok(cudaEventElapsedTime(&bc, b, c), "cudaEventElapsedTime");
    return {ab, bc};
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void run_case(const Case& k, const Options& o, const std::string& device_name, cudaStream_t stream) {
  const int32_t dt = dtype_of(k.dtype), remat = remat_of(k.remat), recipe = recipe_of(k.recipe);
  const std::vector<int32_t> acts = acts_of(k.act);
  const int64_t A = static_cast<int64_t>(acts.size()), T = k.T, H = k.H, F = k.F, AF = A * F;
  int32_t block_support = LNMLP_UNSUPPORTED;
  lnmlp_ok(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_RECIPE_BLOCK, &block_support), "query_support");
  // As the backend decides (cuda/cuda_exec.cpp): BLOCK native where cuBLASLt has block scaling and
  // every dimension is a multiple of 16.
  const bool native_block =
      recipe == LNMLP_RECIPE_BLOCK && block_support == LNMLP_SUPPORTED && T % 16 == 0 && H % 16 == 0 && F % 16 == 0;
  const bool fp8_native = recipe == LNMLP_RECIPE_DELAYED || recipe == LNMLP_RECIPE_CURRENT || native_block;
  const int64_t e = dt == LNMLP_DTYPE_F32 ? 4 : 2;

  lnmlp_desc* d = nullptr;
  lnmlp_ok(lnmlp_desc_create(&d), "lnmlp_desc_create");
  lnmlp_ok(lnmlp_desc_set_shape(d, T, H, F), "set_shape");
  lnmlp_ok(lnmlp_desc_set_norm(d, A == 2 ? LNMLP_NORM_RMSNORM : LNMLP_NORM_LAYERNORM), "set_norm");
  lnmlp_ok(lnmlp_desc_set_activations(d, static_cast<int32_t>(A), acts.data()), "set_activations");
  lnmlp_ok(lnmlp_desc_set_bias(d, A == 2 ? 0 : 1, A == 2 ? 0 : 1), "set_bias");  // Llama: no biases
  lnmlp_ok(lnmlp_desc_set_dtype(d, dt), "set_dtype");
  lnmlp_ok(lnmlp_desc_set_remat(d, remat), "set_remat");
  lnmlp_ok(lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, o.device), "set_backend");
  lnmlp_ok(lnmlp_desc_set_recipe(d, recipe), "set_recipe");
  lnmlp_plan* plan = nullptr;
  lnmlp_ok(lnmlp_plan_create(d, &plan), "lnmlp_plan_create");
  lnmlp_desc_destroy(d);
  const bool ln = A == 1, bias = A == 1;
  int64_t saved_bytes = 0, per_token = 0, ws_bytes = 0;
  lnmlp_ok(lnmlp_plan_get_saved_bytes(plan, &saved_bytes), "get_saved_bytes");
  lnmlp_ok(lnmlp_plan_get_saved_bytes_per_token(plan, &per_token), "get_saved_bytes_per_token");
  lnmlp_ok(lnmlp_plan_get_workspace_bytes(plan, &ws_bytes), "get_workspace_bytes");

  const size_t TH = static_cast<size_t>(T * H);
  DeviceTensor x(TH, e, 1.0f, 1), dy(TH, e, 0.5f, 2), gamma(static_cast<size_t>(H), e, 1.0f, 3),
      beta(ln ? static_cast<size_t>(H) : 0, e, 0.1f, 4), w1(static_cast<size_t>(H * AF), e, 0.02f, 5),
      b1(bias ? static_cast<size_t>(AF) : 0, e, 0.1f, 6), w2(static_cast<size_t>(F * H), e, 0.02f, 7),
      b2(bias ? static_cast<size_t>(H) : 0, e, 0.1f, 8), y(TH, e, 0.0f, 0), dx(TH, e, 0.0f, 0),
      dgamma(static_cast<size_t>(H), e, 0.0f, 0), dbeta(ln ? static_cast<size_t>(H) : 0, e, 0.0f, 0),
      dw1(static_cast<size_t>(H * AF), e, 0.0f, 0), db1(bias ? static_cast<size_t>(AF) : 0, e, 0.0f, 0),
      dw2(static_cast<size_t>(F * H), e, 0.0f, 0), db2(bias ? static_cast<size_t>(H) : 0, e, 0.0f, 0),
      saved(static_cast<size_t>(saved_bytes), 1, 0.0f, 0);
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");  // the uploads landed before `stream` reads them
  auto nz = [](const DeviceTensor& t) { return t.bytes ? t.p : nullptr; };

  // The peer: the same GEMMs alone (GEMM1 again in backward under save_stats).
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) die("cublasLtCreate failed");
  // Exactly the GEMMs the CUDA backend creates for this configuration (cuda/gemm_plan.h).
  lnmlp::Config cfg;
  cfg.tokens = T, cfg.hidden = H, cfg.ffn = F, cfg.num_acts = static_cast<int32_t>(A);
  cfg.dtype = static_cast<lnmlp::numerics::DType>(dt);
  cfg.has_bias1 = cfg.has_bias2 = bias;
  // Emulated blocked recipes run bf16 GEMMs on decoded operands: their peer is the bf16 GEMMs.
  cfg.fp8.recipe = fp8_native ? static_cast<lnmlp::Recipe>(recipe) : lnmlp::Recipe::None;
  std::vector<std::unique_ptr<lnmlp::cuda::LtGemm>> g;
  std::vector<bool> peer_bias;
  int64_t peer_ws = 0, scales = 1;
  try {
    for (lnmlp::block::GemmRole role : lnmlp::block::kAllGemmRoles) {
      const lnmlp::block::GemmSpec s = lnmlp::block::gemm_spec(role, cfg);
      lnmlp::cuda::CudaGemm plan = lnmlp::cuda::cuda_gemm(s, cfg, native_block);
      try {
        g.push_back(std::make_unique<lnmlp::cuda::LtGemm>(lt, plan.shape, int64_t{32} << 20, "peer"));
      } catch (const lnmlp::Error& err) {  // as the backend: staged in fp32 where no algorithm fuses the output
        if (err.status() != LNMLP_ERROR_NOT_SUPPORTED) throw;
        plan = lnmlp::cuda::cuda_gemm(s, cfg, native_block, false);
        g.push_back(std::make_unique<lnmlp::cuda::LtGemm>(lt, plan.shape, int64_t{32} << 20, "peer"));
      }
      peer_bias.push_back(plan.shape.bias);
      peer_ws = std::max(peer_ws, g.back()->workspace_bytes());
      if (native_block)
        for (const auto& [outer, tiles] : {std::pair{s.m, plan.shape.scale_a == lnmlp::cuda::LtScale::Blk128},
                                           std::pair{s.n, plan.shape.scale_b == lnmlp::cuda::LtScale::Blk128}})
          scales = std::max(scales, lnmlp::numerics::gemm_block_scale_count(tiles, outer, s.k));
    }
  } catch (const lnmlp::Error& err) {
    die(std::string("peer GEMMs: ") + err.what());
  }
  // FP8 peer operands: codes of every operand (both orientations have the same sizes), scale_invs
  // of 1 (per tensor, or per block), results in fp32 (large enough for every output type).
  const size_t big = static_cast<size_t>(std::max({T * AF, H * AF, T * H, F * H, T * F}));
  DeviceTensor q_a(fp8_native ? big : 0, 1, 1.0f, 12), q_b(fp8_native ? big : 0, 1, 1.0f, 13),
      q_out(fp8_native ? big : 0, 4, 0.0f, 0), q_scale(fp8_native ? static_cast<size_t>(scales) : 0, 4, 0.0f, 0);
  if (fp8_native) {
    const std::vector<float> ones(static_cast<size_t>(scales), 1.0f);
    cuda_ok(cudaMemcpy(q_scale.p, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  DeviceTensor pws(static_cast<size_t>(std::max<int64_t>(peer_ws, 256)), 1, 0.0f, 0);
  DeviceTensor f32_dact(static_cast<size_t>(T * F), 4, 0.0f, 0), f32_dn(TH, 4, 0.0f, 0),
      p_h(static_cast<size_t>(T * AF), e, 0.0f, 0), p_act(static_cast<size_t>(T * F), e, 0.1f, 9),
      p_ln(TH, e, 0.5f, 10), p_dh(static_cast<size_t>(T * AF), e, 0.01f, 11);
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  auto peer_once = [&](const Events& ev) {
    if (fp8_native) {
      auto run8 = [&](int i) {
        const auto* scale = static_cast<const float*>(q_scale.p);
        const void* b = !peer_bias[static_cast<size_t>(i)] ? nullptr : i == 0 ? b1.p : b2.p;  // GEMM1, GEMM2
        g[static_cast<size_t>(i)]->run(q_a.p, q_b.p, b, q_out.p, pws.p, stream, scale, scale);
      };
      cuda_ok(cudaEventRecord(ev.a, stream), "cudaEventRecord");
      run8(0);
      run8(1);
      cuda_ok(cudaEventRecord(ev.b, stream), "cudaEventRecord");
      if (remat == LNMLP_REMAT_SAVE_STATS) run8(0);
      for (int i = 2; i < 6; ++i) run8(i);
      cuda_ok(cudaEventRecord(ev.c, stream), "cudaEventRecord");
      return;
    }
    cuda_ok(cudaEventRecord(ev.a, stream), "cudaEventRecord");
    g[0]->run(p_ln.p, w1.p, nz(b1), p_h.p, pws.p, stream);
    g[1]->run(p_act.p, w2.p, nz(b2), y.p, pws.p, stream);
    cuda_ok(cudaEventRecord(ev.b, stream), "cudaEventRecord");
    if (remat == LNMLP_REMAT_SAVE_STATS) g[0]->run(p_ln.p, w1.p, nz(b1), p_h.p, pws.p, stream);
    g[2]->run(dy.p, w2.p, nullptr, f32_dact.p, pws.p, stream);
    g[3]->run(p_act.p, dy.p, nullptr, dw2.p, pws.p, stream);
    g[4]->run(p_dh.p, w1.p, nullptr, f32_dn.p, pws.p, stream);
    g[5]->run(p_ln.p, p_dh.p, nullptr, dw1.p, pws.p, stream);
    cuda_ok(cudaEventRecord(ev.c, stream), "cudaEventRecord");
  };
  auto block_once = [&](const Events& ev) {
    cuda_ok(cudaEventRecord(ev.a, stream), "cudaEventRecord");
    lnmlp_ok(lnmlp_plan_forward(plan, T, x.p, gamma.p, nz(beta), w1.p, nz(b1), w2.p, nz(b2), y.p, nz(saved), nullptr,
                                LNMLP_CALL_DEFAULT, stream),
             "lnmlp_plan_forward");
    cuda_ok(cudaEventRecord(ev.b, stream), "cudaEventRecord");
    lnmlp_ok(lnmlp_plan_backward(plan, T, dy.p, x.p, gamma.p, nz(beta), w1.p, nz(b1), w2.p, nz(saved), dx.p, dgamma.p,
                                 nz(dbeta), dw1.p, nz(db1), dw2.p, nz(db2), nullptr, LNMLP_CALL_DEFAULT, stream),
             "lnmlp_plan_backward");
    cuda_ok(cudaEventRecord(ev.c, stream), "cudaEventRecord");
  };

  const Events ev;
  std::vector<double> bf, bb, pf, pb;
  try {
    for (int i = 0; i < o.warmup + o.iters; ++i) {  // interleaved: block, then peer, each iteration
      block_once(ev);
      const auto [f, b] = ev.read();
      peer_once(ev);
      const auto [pf1, pb1] = ev.read();
      if (i < o.warmup) continue;
      bf.push_back(f);
      bb.push_back(b);
      pf.push_back(pf1);
      pb.push_back(pb1);
    }
  } catch (const lnmlp::Error& err) {
    die(std::string("peer GEMM: ") + err.what());
  }
  g.clear();
  cublasLtDestroy(lt);
  lnmlp_plan_destroy(plan);

  // Model FLOPs: forward 2 GEMMs, backward 4 (recomputation not counted as useful work).
  const double fwd_flops = 2.0 * T * H * AF + 2.0 * T * F * H, bwd_flops = 2.0 * fwd_flops;
  const double f_ms = median(bf), b_ms = median(bb), p_f = median(pf), p_b = median(pb);
  const double total_ms = f_ms + b_ms, peer_ms = p_f + p_b;
  const double tflops = (fwd_flops + bwd_flops) / (total_ms * 1e-3) / 1e12;
  const double peer_tflops = (fwd_flops + bwd_flops) / (peer_ms * 1e-3) / 1e12;
  const double peak = fp8_native ? kPeakFp8Tflops : kPeakBf16Tflops;
  std::printf("%-7s T=%-6lld H=%-5lld F=%-6lld %-5s %-7s %-10s fwd %8.3f ms  bwd %8.3f ms  total %8.3f ms  %7.1f TFLOP/s "
              "(%5.1f%% of %g)  | GEMMs alone %8.3f ms %7.1f TFLOP/s  block/GEMMs %.3f  saved %lld B/token\n",
              k.act.c_str(), static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(F),
              k.dtype.c_str(), k.recipe.c_str(), k.remat.c_str(), f_ms, b_ms, total_ms, tflops, 100.0 * tflops / peak,
              peak, peer_ms, peer_tflops, total_ms / peer_ms, static_cast<long long>(per_token));
  std::printf("{\"bench\":\"lnmlp-gpu-bench\",\"device\":\"%s\",\"act\":\"%s\",\"dtype\":\"%s\",\"recipe\":\"%s\",\"remat\":\"%s\","
              "\"tokens\":%lld,\"hidden\":%lld,\"ffn\":%lld,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"total_ms\":%.4f,"
              "\"tflops\":%.2f,\"peak_tflops\":%g,\"peak_fraction\":%.4f,\"peer_gemms_ms\":%.4f,\"peer_fwd_ms\":%.4f,"
              "\"peer_bwd_ms\":%.4f,\"peer_tflops\":%.2f,\"saved_bytes_per_token\":%lld,\"workspace_bytes\":%lld,"
              "\"iters\":%d}\n",
              device_name.c_str(), k.act.c_str(), k.dtype.c_str(), k.recipe.c_str(), k.remat.c_str(),
              static_cast<long long>(T), static_cast<long long>(H), static_cast<long long>(F), f_ms, b_ms, total_ms,
              tflops, peak, tflops / peak, peer_ms, p_f, p_b, peer_tflops, static_cast<long long>(per_token),
              static_cast<long long>(ws_bytes), o.iters);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int32_t usable = 0;
  lnmlp_ok(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &usable), "lnmlp_query_support");
  if (usable != 1) die("the CUDA backend is not usable on this machine (no GPU, driver or liblnmlp_cuda.so.1)");
  cuda_ok(cudaSetDevice(o.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties");
  std::printf("device %d: %s (sm_%d%d, %d SMs, %.1f GiB); %s; peak for the fraction: %g TFLOP/s dense bf16 "
              "(H100/H200 SXM)\n",
              o.device, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1 << 30), lnmlp::cuda::cublaslt_description(),
              kPeakBf16Tflops);
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  for (const Case& k : o.cases) run_case(k, o, prop.name, stream);
  cudaStreamDestroy(stream);
  return 0;
}
