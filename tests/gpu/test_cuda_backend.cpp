// The CUDA backend against the CPU backend on identical inputs: every dtype, both norms, plain,
// gated and clamped activations, biases on and off, every remat policy; forward and every
// gradient, within gpu_vs_cpu_tolerance (tests/tolerances.h). Also: remat policies and repeated
// runs give the same bits on the GPU, forward + backward captured into a CUDA graph and replayed,
// and the error paths (host pointers, misaligned pointers, a device that does not exist).
// Without a usable GPU every test that needs one skips, saying why.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace lnmlp_gpu_test {
namespace {

struct Case {
  int32_t dtype;
  bool rms;
  std::vector<int32_t> acts;
  const char* act_name;
  bool bias1, bias2;
  int64_t T, H, F;
};

std::vector<Case> all_cases() {
  struct Act {
    std::vector<int32_t> acts;
    const char* name;
  };
  const std::vector<Act> acts = {{{LNMLP_ACT_GELU}, "gelu"},
                                 {{LNMLP_ACT_RELU}, "relu"},
                                 {{LNMLP_ACT_SQUARED_RELU}, "squared_relu"},
                                 {{LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}, "swiglu"},
                                 {{LNMLP_ACT_QUICK_GELU, LNMLP_ACT_LINEAR}, "qgeglu"},
                                 {{LNMLP_ACT_SIGMOID, LNMLP_ACT_LINEAR}, "glu"},
                                 {{LNMLP_ACT_CLAMPED_SILU, LNMLP_ACT_CLAMPED_LINEAR}, "clamped_swiglu"}};
  std::vector<Case> cases;
  for (int32_t dt : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
    for (bool rms : {false, true})
      for (const Act& a : acts)
        for (int bias : {0, 1, 2}) {  // none, both, b1 only
          if (bias == 2 && a.acts.size() == 1) continue;
          cases.push_back({dt, rms, a.acts, a.name, bias >= 1, bias == 1, 37, 72, 40});
        }
  // Larger: several chunks in every column reduction, columns beyond one block.
  for (int32_t dt : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
    cases.push_back({dt, false, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}, "swiglu", true, true, 1100, 320, 272});
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = std::string(dtype_label(c.dtype)) + "_" + (c.rms ? "rmsnorm" : "layernorm") + "_" + c.act_name +
                  (c.bias1 ? "_b1" : "") + (c.bias2 ? "_b2" : "") + "_T" + std::to_string(c.T);
  return s;
}

// What gtest prints for a parameter (the default would dump its bytes).
void PrintTo(const Case& c, std::ostream* os) { *os << case_name(::testing::TestParamInfo<Case>(c, 0)); }

bool is_clamped(const Case& c) { return c.acts.size() == 2 && c.acts[0] == LNMLP_ACT_CLAMPED_SILU; }

Problem problem_for(const Case& c) {
  lnmlp_ref::Config cfg;
  cfg.tokens = c.T;
  cfg.hidden = c.H;
  cfg.ffn = c.F;
  cfg.norm = c.rms ? lnmlp_ref::Norm::RmsNorm : lnmlp_ref::Norm::LayerNorm;
  cfg.zero_centered_gamma = c.rms;  // rmsnorm cases also cover zero-centered gamma
  cfg.acts.assign(c.acts.begin(), c.acts.end());
  cfg.has_bias1 = c.bias1;
  cfg.has_bias2 = c.bias2;
  InputScales s;
  if (is_clamped(c)) s.h_std = 5.0;  // past the clamp limit (7) on both sides for some elements
  return make_problem(cfg, c.dtype, hash_name(case_name(::testing::TestParamInfo<Case>(c, 0))), s);
}

// The GEMM1 output as the saved buffer holds it under SAVE_ALL (the layout is part of the
// contract: mu, rs, ln_out, h, act, each padded to 256 bytes).
std::vector<double> saved_h(const Problem& pr, const std::vector<unsigned char>& saved) {
  const auto& c = pr.cfg;
  auto pad = [](int64_t b) { return (b + 255) / 256 * 256; };
  const int64_t e = dtype_size(pr.dtype), T = c.tokens, AF = static_cast<int64_t>(c.acts.size()) * c.ffn;
  int64_t off = 0;
  if (c.norm == lnmlp_ref::Norm::LayerNorm) off += pad(T * 4);
  off += pad(T * 4) + pad(T * c.hidden * e);
  Buffer b(pr.dtype, static_cast<size_t>(T * AF));
  std::memcpy(b.data(), saved.data() + off, b.bytes.size());
  return b.to_doubles();
}

// Elements of h where the two backends' values lie on two sides of a kink of the activation
// (relu at 0, the clamped pair at its limits): there the derivative legitimately jumps, and the
// gradients that flow through dh (dW1, db1, dx, dgamma, dbeta) may differ by more than rounding.
int kink_straddles(const Problem& pr, const std::vector<double>& a, const std::vector<double>& b) {
  const auto& c = pr.cfg;
  const int64_t F = c.ffn, AF = static_cast<int64_t>(c.acts.size()) * F;
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int fn = c.acts[static_cast<size_t>((static_cast<int64_t>(i) % AF) / F)];
    std::vector<double> kinks;
    if (fn == LNMLP_ACT_RELU) kinks = {0.0};
    if (fn == LNMLP_ACT_CLAMPED_SILU) kinks = {c.limit};
    if (fn == LNMLP_ACT_CLAMPED_LINEAR) kinks = {-c.limit, c.limit};
    for (double k : kinks)
      if (a[i] != b[i] && std::fmin(a[i], b[i]) <= k && std::fmax(a[i], b[i]) >= k) ++n;
  }
  return n;
}

const char* remat_name(int32_t r) {
  switch (r) {
    case LNMLP_REMAT_SAVE_ALL: return "SAVE_ALL";
    case LNMLP_REMAT_SAVE_FFN1: return "SAVE_FFN1";
    case LNMLP_REMAT_SAVE_STATS: return "SAVE_STATS";
    default: return "FORWARD_ONLY";
  }
}

class CudaVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(CudaVsCpu, EveryRematPolicyMatchesTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Case& k = GetParam();
  const Problem pr = problem_for(k);
  const Tolerance tol = gpu_vs_cpu_tolerance(k.dtype);

  const PlanRun cpu_all = run_cpu(pr, LNMLP_REMAT_SAVE_ALL);
  const PlanRun gpu_all = run_cuda(pr, LNMLP_REMAT_SAVE_ALL);
  const int straddles = kink_straddles(pr, saved_h(pr, cpu_all.saved), saved_h(pr, gpu_all.saved));
  if (straddles > 0)
    std::printf("[ note ] %s: %d element(s) of h straddle an activation kink between the backends; the "
                "gradients behind dh are compared only between GPU runs\n",
                case_name(::testing::TestParamInfo<Case>(k, 0)).c_str(), straddles);

  for (int32_t remat : {LNMLP_REMAT_SAVE_ALL, LNMLP_REMAT_SAVE_FFN1, LNMLP_REMAT_SAVE_STATS,
                        LNMLP_REMAT_FORWARD_ONLY}) {
    SCOPED_TRACE(remat_name(remat));
    const PlanRun cpu = remat == LNMLP_REMAT_SAVE_ALL ? cpu_all : run_cpu(pr, remat);
    const PlanRun gpu = remat == LNMLP_REMAT_SAVE_ALL ? gpu_all : run_cuda(pr, remat);
    EXPECT_EQ(gpu.r.saved_bytes, cpu.r.saved_bytes);
    EXPECT_EQ(gpu.r.saved_bytes_per_token, cpu.r.saved_bytes_per_token);
    const auto got = named(gpu.r), ref = named(cpu.r), same_policy_all = named(gpu_all.r);
    for (size_t i = 0; i < got.size(); ++i) {
      if (ref[i].buf->empty()) {
        EXPECT_TRUE(got[i].buf->empty()) << got[i].name;
        continue;
      }
      const std::string n = got[i].name;
      const bool behind_dh = n == "dx" || n == "dgamma" || n == "dbeta" || n == "dW1" || n == "db1";
      if (!(behind_dh && straddles > 0)) {
        EXPECT_TRUE(within_tolerance(got[i].name, got[i].buf->to_doubles(), ref[i].buf->to_doubles(), nullptr, tol));
      }
      // Recomputation on the GPU uses the same kernels and GEMM algorithms: same bits as SAVE_ALL.
      EXPECT_TRUE(same_bits(got[i].name, *got[i].buf, *same_policy_all[i].buf));
    }
  }
}

TEST_P(CudaVsCpu, RepeatedRunsGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  const Problem pr = problem_for(GetParam());
  const PlanRun a = run_cuda(pr, LNMLP_REMAT_SAVE_STATS);
  const PlanRun b = run_cuda(pr, LNMLP_REMAT_SAVE_STATS);
  EXPECT_TRUE(same_outputs(a.r, b.r));
  EXPECT_EQ(a.saved, b.saved);
}

INSTANTIATE_TEST_SUITE_P(All, CudaVsCpu, ::testing::ValuesIn(all_cases()), case_name);

// ---------------------------------------------------------------------------------------------
// CUDA graphs: forward + backward captured on a stream, replayed, same bits as eager runs.
// ---------------------------------------------------------------------------------------------
TEST(CudaGraph, ForwardAndBackwardCaptureAndReplay) {
  SKIP_WITHOUT_GPU();
  const Case k{LNMLP_DTYPE_BF16, true, {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR}, "swiglu", true, true, 256, 128, 96};
  const Problem pr = problem_for(k);
  for (int32_t remat : {LNMLP_REMAT_SAVE_ALL, LNMLP_REMAT_SAVE_STATS}) {
    SCOPED_TRACE(remat_name(remat));
    PlanPtr p = plan_ptr(make_plan(pr, remat, LNMLP_BACKEND_CUDA));
    const int64_t saved_bytes = saved_bytes_of(p.get());
    const DeviceInputs in(pr);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);

    const DeviceOutputs eager(pr, saved_bytes);
    ASSERT_EQ(device_forward(p.get(), in, eager, stream), LNMLP_SUCCESS) << lnmlp_last_error();
    ASSERT_EQ(device_backward(p.get(), in, eager, stream), LNMLP_SUCCESS) << lnmlp_last_error();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

    const DeviceOutputs replayed(pr, saved_bytes);
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(capture_step(p.get(), in, replayed, stream, &exec), "");
    for (int rep = 0; rep < 3; ++rep) {
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the previous replay is done
      for (const DeviceBuffer* b : {&replayed.y, &replayed.dx, &replayed.dw1, &replayed.dw2}) b->poison();
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const RunResult a = to_host(pr, eager, true), b = to_host(pr, replayed, true);
    EXPECT_TRUE(same_outputs(a, b));
    cudaGraphExecDestroy(exec);
    cudaStreamDestroy(stream);
  }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------
bool names(const char* msg, const char* word) { return std::string(msg).find(word) != std::string::npos; }

const Case kErrCase{LNMLP_DTYPE_F32, false, {LNMLP_ACT_GELU}, "gelu", true, true, 16, 64, 32};

TEST(CudaErrors, WithoutAGpuPlanCreationSaysWhy) {
  int32_t yes = -1;
  ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &yes), LNMLP_SUCCESS);
  if (yes == 1) GTEST_SKIP() << "a GPU is usable here; this test covers machines without one";
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_shape(d, 4, 8, 8), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0), LNMLP_SUCCESS);
  lnmlp_plan* p = nullptr;
  const int32_t st = lnmlp_plan_create(d, &p);
  EXPECT_EQ(st, LNMLP_ERROR_NOT_SUPPORTED) << lnmlp_last_error();
  EXPECT_TRUE(names(lnmlp_last_error(), "CUDA")) << lnmlp_last_error();
  EXPECT_EQ(p, nullptr);
  for (int32_t f = LNMLP_FEATURE_BACKEND; f <= LNMLP_FEATURE_EXTERNAL_WORKSPACE; ++f) {
    int32_t v = -1;
    ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, f, &v), LNMLP_SUCCESS);
    EXPECT_EQ(v, 0) << f;
  }
  lnmlp_desc_destroy(d);
}

// Once a CUDA query has loaded the module, the build info names the file and the cuBLASLt it runs on
// (tests/test_api.cpp checks the names against the libraries the process loaded).
TEST(CudaErrors, BuildInfoNamesTheLoadedModule) {
  int32_t v = -1;
  ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &v), LNMLP_SUCCESS);
  const char* info = nullptr;
  ASSERT_EQ(lnmlp_get_build_info(&info), LNMLP_SUCCESS);
  EXPECT_TRUE(names(info, "liblnmlp_cuda.so.1 loaded, on cuBLASLt ")) << info;
  EXPECT_TRUE(names(info, "; NCCL ")) << info;
}

TEST(CudaErrors, DeviceThatDoesNotExist) {
  SKIP_WITHOUT_GPU();
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_shape(d, 4, 8, 8), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 4096), LNMLP_SUCCESS);
  lnmlp_plan* p = nullptr;
  EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_ERROR_NOT_SUPPORTED);
  EXPECT_TRUE(names(lnmlp_last_error(), "device 4096")) << lnmlp_last_error();
  lnmlp_desc_destroy(d);
}

TEST(CudaErrors, CapabilitiesOfAUsableGpu) {
  SKIP_WITHOUT_GPU();
  for (int32_t f : {LNMLP_FEATURE_BACKEND, LNMLP_FEATURE_DTYPE_F32, LNMLP_FEATURE_DTYPE_BF16, LNMLP_FEATURE_DTYPE_F16,
                    LNMLP_FEATURE_EXTERNAL_WORKSPACE}) {
    int32_t v = -1;
    ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, f, &v), LNMLP_SUCCESS);
    EXPECT_EQ(v, 1) << f;
  }
  // FP8: per-tensor recipes on FP8 tensor cores from sm_89; BLOCK's block-scaled GEMMs on Hopper;
  // NVFP4 on FP4 tensor cores from sm_100 (cuBLASLt 12.8, which this build has); MXFP8 emulated.
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  const int cc = 10 * prop.major + prop.minor;
  auto recipe = [](int32_t f) {
    int32_t v = -1;
    EXPECT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, f, &v), LNMLP_SUCCESS);
    return v;
  };
  for (int32_t f : {LNMLP_FEATURE_RECIPE_DELAYED, LNMLP_FEATURE_RECIPE_CURRENT})
    EXPECT_EQ(recipe(f), cc >= 89 ? LNMLP_SUPPORTED : LNMLP_UNSUPPORTED) << f;
  EXPECT_EQ(recipe(LNMLP_FEATURE_RECIPE_MXFP8), LNMLP_SUPPORTED_EMULATED);
  EXPECT_EQ(recipe(LNMLP_FEATURE_RECIPE_NVFP4), cc >= 100 ? LNMLP_SUPPORTED : LNMLP_SUPPORTED_EMULATED);
  if (prop.major != 9) {
    EXPECT_EQ(recipe(LNMLP_FEATURE_RECIPE_BLOCK), LNMLP_SUPPORTED_EMULATED);
  } else {
    EXPECT_NE(recipe(LNMLP_FEATURE_RECIPE_BLOCK), LNMLP_UNSUPPORTED);  // native with cuBLASLt 12.9+
  }
  PlanPtr p = plan_ptr(make_plan(problem_for(kErrCase), LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA));
  int64_t align = 0;
  ASSERT_EQ(lnmlp_plan_get_alignment(p.get(), &align), LNMLP_SUCCESS);
  EXPECT_EQ(align, 128);  // what XLA:GPU guarantees for its buffers
}

TEST(CudaErrors, HostPointersAreRefused) {
  SKIP_WITHOUT_GPU();
  const Problem pr = problem_for(kErrCase);
  PlanPtr p = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA));
  const int64_t saved_bytes = saved_bytes_of(p.get());
  DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved_bytes);
  const std::vector<unsigned char> y_before = out.y.to_host();
  // x on the host (aligned like device memory, so only its kind is wrong).
  AlignedMemory host_x(static_cast<int64_t>(pr.bx.bytes.size()), 256, 0);
  std::memcpy(host_x.get(), pr.bx.data(), pr.bx.bytes.size());
  const int32_t st = lnmlp_plan_forward(p.get(), plan_tokens(p.get()), host_x.get(), in.gamma.get(), in.beta.get(),
                                        in.w1.get(), in.b1.get(), in.w2.get(), in.b2.get(), out.y.get(),
                                        out.saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr);
  EXPECT_EQ(st, LNMLP_ERROR_INVALID_ARGUMENT) << lnmlp_last_error();
  EXPECT_TRUE(names(lnmlp_last_error(), "x (")) << lnmlp_last_error();
  EXPECT_TRUE(names(lnmlp_last_error(), "host memory")) << lnmlp_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(out.y.to_host(), y_before) << "a refused call wrote y";
  // A host output in backward.
  ASSERT_EQ(device_forward(p.get(), in, out, nullptr), LNMLP_SUCCESS) << lnmlp_last_error();
  Buffer host_dw2(pr.dtype, pr.bw2.size());
  const int32_t bst = lnmlp_plan_backward(p.get(), plan_tokens(p.get()), in.dy.get(), in.x.get(), in.gamma.get(),
                                          in.beta.get(), in.w1.get(), in.b1.get(), in.w2.get(), out.saved.get(),
                                          out.dx.get(), out.dgamma.get(), out.dbeta.get(), out.dw1.get(), out.db1.get(),
                                          host_dw2.data(), out.db2.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr);
  EXPECT_EQ(bst, LNMLP_ERROR_INVALID_ARGUMENT) << lnmlp_last_error();
  EXPECT_TRUE(names(lnmlp_last_error(), "dw2")) << lnmlp_last_error();
}

TEST(CudaErrors, MisalignedDevicePointersAreRefused) {
  SKIP_WITHOUT_GPU();
  const Problem pr = problem_for(kErrCase);  // f32: 4-byte elements, so +4 passes the element check
  PlanPtr p = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA));
  const int64_t saved_bytes = saved_bytes_of(p.get());
  const DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved_bytes);
  DeviceBuffer big_w1(pr.bw1.bytes.size() + 64);
  const void* w1_off = static_cast<const char*>(big_w1.get()) + 4;
  EXPECT_EQ(
      lnmlp_plan_forward(p.get(), plan_tokens(p.get()), in.x.get(), in.gamma.get(), in.beta.get(), w1_off, in.b1.get(),
                         in.w2.get(), in.b2.get(), out.y.get(), out.saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr),
      LNMLP_ERROR_MISALIGNED);
  EXPECT_TRUE(names(lnmlp_last_error(), "w1")) << lnmlp_last_error();
  // The saved buffer must have the plan's alignment (128).
  DeviceBuffer big_saved(static_cast<size_t>(saved_bytes) + 512);
  void* saved_off = static_cast<char*>(big_saved.get()) + 64;
  EXPECT_EQ(lnmlp_plan_forward(p.get(), plan_tokens(p.get()), in.x.get(), in.gamma.get(), in.beta.get(), in.w1.get(),
                               in.b1.get(), in.w2.get(), in.b2.get(), out.y.get(), saved_off, nullptr,
                               LNMLP_CALL_DEFAULT, nullptr),
            LNMLP_ERROR_MISALIGNED);
  EXPECT_TRUE(names(lnmlp_last_error(), "saved")) << lnmlp_last_error();
}

TEST(CudaErrors, ExternalDeviceWorkspace) {
  SKIP_WITHOUT_GPU();
  const Problem pr = problem_for(kErrCase);
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_shape(d, pr.cfg.tokens, pr.cfg.hidden, pr.cfg.ffn), LNMLP_SUCCESS);
  const int32_t gelu = LNMLP_ACT_GELU;
  ASSERT_EQ(lnmlp_desc_set_activations(d, 1, &gelu), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_bias(d, 1, 1), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_external_workspace(d, 1), LNMLP_SUCCESS);
  lnmlp_plan* raw = nullptr;
  ASSERT_EQ(lnmlp_plan_create(d, &raw), LNMLP_SUCCESS) << lnmlp_last_error();
  lnmlp_desc_destroy(d);
  PlanPtr p = plan_ptr(raw);
  int64_t ws_bytes = 0, saved_bytes = 0;
  ASSERT_EQ(lnmlp_plan_get_workspace_bytes(p.get(), &ws_bytes), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_plan_get_saved_bytes(p.get(), &saved_bytes), LNMLP_SUCCESS);
  const DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved_bytes);
  EXPECT_EQ(device_forward(p.get(), in, out, nullptr), LNMLP_ERROR_NO_WORKSPACE);
  // Host memory as workspace: refused when the plan runs.
  AlignedMemory host_ws(ws_bytes, 256, 0);
  ASSERT_EQ(lnmlp_plan_attach_workspace(p.get(), host_ws.get(), ws_bytes), LNMLP_SUCCESS);
  EXPECT_EQ(device_forward(p.get(), in, out, nullptr), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_TRUE(names(lnmlp_last_error(), "workspace")) << lnmlp_last_error();
  // Device workspace (poisoned: the plan must not rely on zeroed memory) aligned to 128 bytes but
  // not 256, as XLA may give it (cuBLASLt's slice is realigned inside): matches the CPU backend.
  DeviceBuffer ws(static_cast<size_t>(ws_bytes) + 128);
  ws.poison();
  void* ws_128 = static_cast<char*>(ws.get()) + 128;
  ASSERT_EQ(lnmlp_plan_attach_workspace(p.get(), ws_128, ws_bytes), LNMLP_SUCCESS);
  ASSERT_EQ(device_forward(p.get(), in, out, nullptr), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(device_backward(p.get(), in, out, nullptr), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const RunResult gpu = to_host(pr, out, true);
  const PlanRun cpu = run_cpu(pr, LNMLP_REMAT_SAVE_ALL);
  const auto got = named(gpu), ref = named(cpu.r);
  for (size_t i = 0; i < got.size(); ++i)
    if (!ref[i].buf->empty()) {
      EXPECT_TRUE(within_tolerance(got[i].name, got[i].buf->to_doubles(), ref[i].buf->to_doubles(), nullptr,
                                   gpu_vs_cpu_tolerance(pr.dtype)));
    }
}

}  // namespace
}  // namespace lnmlp_gpu_test
