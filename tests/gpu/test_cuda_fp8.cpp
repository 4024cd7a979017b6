// FP8 recipes on the CUDA backend against the CPU backend on identical inputs (every recipe, NVFP4 too,
// bf16 and f32, plain and gated, a shape with partial blocks for the blocked recipes), the saved
// bytes, recomputation giving SAVE_ALL's bits on the GPU, the delayed-scaling state moving as on
// the CPU, FP8 in a CUDA graph, and the FP8 shape rule. Skips without a usable GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"

namespace lnmlp_gpu_test {
namespace {

struct Fp8Case {
  int32_t recipe;
  int32_t dtype;
  bool gated;
  int64_t T, H, F;
};

const char* recipe_name(int32_t r) {
  static const char* names[] = {"none", "delayed", "current", "block", "mxfp8", "nvfp4"};
  return names[r];
}

std::string fp8_case_name(const ::testing::TestParamInfo<Fp8Case>& info) {
  const Fp8Case& c = info.param;
  return std::string(recipe_name(c.recipe)) + "_" + dtype_label(c.dtype) + (c.gated ? "_swiglu" : "_gelu") + "_T" +
         std::to_string(c.T) + "_H" + std::to_string(c.H) + "_F" + std::to_string(c.F);
}
void PrintTo(const Fp8Case& c, std::ostream* os) { *os << fp8_case_name(::testing::TestParamInfo<Fp8Case>(c, 0)); }

std::vector<Fp8Case> fp8_cases() {
  std::vector<Fp8Case> v;
  for (int32_t r :
       {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8, LNMLP_RECIPE_NVFP4})
    for (int32_t dt : {LNMLP_DTYPE_BF16, LNMLP_DTYPE_F32})
      for (bool gated : {false, true}) v.push_back({r, dt, gated, 256, 128, 192});
  // Partial 128-, 32- and 16-blocks in every dimension (blocked recipes have no shape rule; NVFP4's
  // last Hadamard block of tokens is partial too).
  for (int32_t r : {LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8, LNMLP_RECIPE_NVFP4})
    v.push_back({r, LNMLP_DTYPE_BF16, true, 200, 144, 176});
  v.push_back({LNMLP_RECIPE_NVFP4, LNMLP_DTYPE_F32, false, 70, 40, 56});
  return v;
}

Problem fp8_problem(const Fp8Case& k) {
  const lnmlp_ref::Config cfg = lnmlp_ref::biased_config(k.T, k.H, k.F, swiglu_or_gelu(k.gated));
  return make_problem(cfg, k.dtype, hash_name(fp8_case_name(::testing::TestParamInfo<Fp8Case>(k, 0))));
}

class CudaFp8VsCpu : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(CudaFp8VsCpu, ForwardAndGradientsMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Fp8Case& k = GetParam();
  const Problem pr = fp8_problem(k);
  const PlanRun cpu = run_cpu(pr, LNMLP_REMAT_SAVE_ALL, k.recipe);
  const PlanRun gpu = run_cuda(pr, LNMLP_REMAT_SAVE_ALL, k.recipe);
  EXPECT_EQ(gpu.r.saved_bytes, cpu.r.saved_bytes);
  EXPECT_EQ(gpu.r.saved_bytes_per_token, cpu.r.saved_bytes_per_token);
  const auto got = named(gpu.r), ref = named(cpu.r);
  double worst = 0.0;
  const char* worst_name = "";
  for (size_t i = 0; i < got.size(); ++i) {
    if (ref[i].buf->empty()) continue;
    EXPECT_TRUE(within_tolerance(got[i].name, got[i].buf->to_doubles(), ref[i].buf->to_doubles(), nullptr,
                                 k.recipe == LNMLP_RECIPE_NVFP4 ? kTolFp4Backends : kTolFp8Backends));
    const double e = compare(got[i].buf->to_doubles(), ref[i].buf->to_doubles()).normalised();
    if (e > worst) worst = e, worst_name = got[i].name;
  }
  // The figure tests/tolerances.h's kTolFp8Backends and kTolFp4Backends cite.
  std::printf("[ figure   ] CUDA vs CPU backend: worst normalised error %.3g (%s)\n", worst, worst_name);
  // Quantized on the GPU too: far from the unquantized GPU result.
  const PlanRun plain = run_cuda(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_RECIPE_NONE);
  EXPECT_GT(compare(gpu.r.y.to_doubles(), plain.r.y.to_doubles()).normalised(), 0.02) << "y looks unquantized";
}

TEST_P(CudaFp8VsCpu, RecomputationGivesTheBitsOfSaveAll) {
  SKIP_WITHOUT_GPU();
  const Fp8Case& k = GetParam();
  const Problem pr = fp8_problem(k);
  const PlanRun all = run_cuda(pr, LNMLP_REMAT_SAVE_ALL, k.recipe);
  for (int32_t remat : {LNMLP_REMAT_SAVE_FFN1, LNMLP_REMAT_SAVE_STATS}) {
    const PlanRun r = run_cuda(pr, remat, k.recipe);
    const auto a = named(all.r), b = named(r.r);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(same_bits(a[i].name, *a[i].buf, *b[i].buf)) << "remat " << remat;
  }
}

INSTANTIATE_TEST_SUITE_P(All, CudaFp8VsCpu, ::testing::ValuesIn(fp8_cases()), fp8_case_name);

// fp32 weights with bf16 I/O (lnmlp_desc_set_weight_dtype): the GPU quantizes them from the same
// fp32 values as the CPU backend, for every recipe; weights off the bf16 grid, so a path that
// rounded them to bf16 first would quantize other values.
TEST(CudaFp8Float32Weights, MatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  for (int32_t r :
       {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8, LNMLP_RECIPE_NVFP4}) {
    SCOPED_TRACE(recipe_name(r));
    Problem pr = fp8_problem({r, LNMLP_DTYPE_BF16, true, 256, 128, 192});
    Rng rng(77);
    for (auto* w : {&pr.p.w1, &pr.p.w2})
      for (double& v : *w) v = static_cast<double>(static_cast<float>(v * (1.0 + rng.uniform(-1.0, 1.0) / 512)));
    set_weights(pr, LNMLP_DTYPE_F32);
    const PlanRun cpu = run_cpu(pr, LNMLP_REMAT_SAVE_ALL, r);
    const PlanRun gpu = run_cuda(pr, LNMLP_REMAT_SAVE_ALL, r);
    const auto got = named(gpu.r), ref = named(cpu.r);
    for (size_t i = 0; i < got.size(); ++i) {
      if (ref[i].buf->empty()) continue;
      EXPECT_TRUE(within_tolerance(got[i].name, got[i].buf->to_doubles(), ref[i].buf->to_doubles(), nullptr,
                                   r == LNMLP_RECIPE_NVFP4 ? kTolFp4Backends : kTolFp8Backends));
    }
  }
}

// Forward + backward twice on one plan; then each quantizer's scale and newest two amaxes.
std::vector<float> state_after_two_steps(const Problem& pr, int32_t backend, int32_t recipe) {
  PlanPtr p = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, backend, 0, recipe));
  const int64_t saved_bytes = saved_bytes_of(p.get());
  if (backend == LNMLP_BACKEND_CUDA) {
    const DeviceInputs in(pr);
    const DeviceOutputs out(pr, saved_bytes);
    for (int step = 0; step < 2; ++step) {
      LNMLP_TEST_CHECK(device_forward(p.get(), in, out, nullptr));
      LNMLP_TEST_CHECK(device_backward(p.get(), in, out, nullptr));
    }
    CUDA_TEST_CHECK(cudaDeviceSynchronize());
  } else {
    const auto& c = pr.cfg;
    const size_t T = static_cast<size_t>(c.tokens), H = static_cast<size_t>(c.hidden),
                 F = static_cast<size_t>(c.ffn), AF = c.acts.size() * F;
    AlignedMemory saved(saved_bytes, 256, 0);
    Buffer y(pr.dtype, T * H), dx(pr.dtype, T * H), dg(pr.dtype, H), dbeta(pr.dtype, H), dw1(pr.dtype, H * AF),
        db1(pr.dtype, AF), dw2(pr.dtype, F * H), db2(pr.dtype, H);
    for (int step = 0; step < 2; ++step) {
      LNMLP_TEST_CHECK(lnmlp_plan_forward(p.get(), plan_tokens(p.get()), pr.bx.data(), pr.bgamma.data(),
                                          pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), pr.bb2.data(),
                                          y.data(), saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
      LNMLP_TEST_CHECK(lnmlp_plan_backward(p.get(), plan_tokens(p.get()), pr.bdy.data(), pr.bx.data(), pr.bgamma.data(),
                                           pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), saved.get(),
                                           dx.data(), dg.data(), dbeta.data(), dw1.data(), db1.data(), dw2.data(),
                                           db2.data(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
    }
  }
  int64_t len = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_amax_history_length(p.get(), &len));
  std::vector<float> out;
  for (int32_t q = 0; q < LNMLP_QUANTIZER_COUNT; ++q) {
    std::vector<float> h(static_cast<size_t>(len));
    float scale = 0;
    LNMLP_TEST_CHECK(lnmlp_plan_get_quantizer_state(p.get(), q, &scale, h.data(), len));
    out.insert(out.end(), {scale, h[0], h[1]});
  }
  return out;
}

// The quantizers whose tensors are inputs (w1, w2, dy) must move to the same bits on both
// backends; those of computed tensors (ln_out, act_out, dh) within kFp8ComputedAmaxRtol (the FP8
// GEMMs behind act_out and dh accumulate differently on FP8 tensor cores, tests/tolerances.h).
TEST(CudaFp8State, DelayedScalingMovesAsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  const Fp8Case k{LNMLP_RECIPE_DELAYED, LNMLP_DTYPE_BF16, true, 256, 128, 192};
  const Problem pr = fp8_problem(k);
  const std::vector<float> cpu = state_after_two_steps(pr, LNMLP_BACKEND_CPU, k.recipe);
  const std::vector<float> gpu = state_after_two_steps(pr, LNMLP_BACKEND_CUDA, k.recipe);
  for (int32_t q = 0; q < LNMLP_QUANTIZER_COUNT; ++q) {
    SCOPED_TRACE("quantizer " + std::to_string(q));
    const bool input = q == LNMLP_QUANTIZER_W1 || q == LNMLP_QUANTIZER_W2 || q == LNMLP_QUANTIZER_DY;
    for (int i = 0; i < 3; ++i) {
      const float c = cpu[static_cast<size_t>(q * 3 + i)], g = gpu[static_cast<size_t>(q * 3 + i)];
      if (input) EXPECT_EQ(g, c) << "entry " << i;
      else EXPECT_NEAR(g, c, kFp8ComputedAmaxRtol * std::fabs(c)) << "entry " << i;
    }
    EXPECT_GT(gpu[static_cast<size_t>(q * 3 + 1)], 0.0f);
    EXPECT_GT(gpu[static_cast<size_t>(q * 3 + 2)], 0.0f);
  }
}

// Holds a stream for *ms milliseconds (a host function enqueued on it): what is enqueued behind it
// is still pending when the host goes on, as it is behind a long kernel.
void CUDART_CB hold_stream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<const int*>(ms)));
}

// The state functions are ordered against passes on a non-blocking stream (which a plain
// cudaMemcpy does not wait for): a read after a queued backward sees its update, a write after a
// queued backward is not overwritten by it, and a forward after a write uses what was written.
TEST(CudaFp8State, StateCopiesAreOrderedAgainstANonBlockingStream) {
  SKIP_WITHOUT_GPU();
  const Fp8Case k{LNMLP_RECIPE_DELAYED, LNMLP_DTYPE_BF16, true, 256, 128, 192};
  const Problem pr = fp8_problem(k);
  PlanPtr p = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA, 0, k.recipe));
  const int64_t saved_bytes = saved_bytes_of(p.get());
  int64_t len = 0;
  ASSERT_EQ(lnmlp_plan_get_amax_history_length(p.get(), &len), LNMLP_SUCCESS);
  const DeviceInputs in(pr);
  const DeviceOutputs out(pr, saved_bytes);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  static const int kHoldMs = 300;
  std::vector<float> hist(static_cast<size_t>(len));
  float scale = 0.0f;

  // A read right after a queued forward + backward: dy's newest amax is the backward's (> 0; the
  // history starts all zeros).
  ASSERT_EQ(cudaLaunchHostFunc(stream, hold_stream, const_cast<int*>(&kHoldMs)), cudaSuccess);
  ASSERT_EQ(device_forward(p.get(), in, out, stream), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(device_backward(p.get(), in, out, stream), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(lnmlp_plan_get_quantizer_state(p.get(), LNMLP_QUANTIZER_DY, &scale, hist.data(), len), LNMLP_SUCCESS);
  EXPECT_GT(hist[0], 0.0f) << "the read did not wait for the backward on the non-blocking stream";

  // A write right after a queued backward: the backward's update comes first, the write last.
  ASSERT_EQ(cudaLaunchHostFunc(stream, hold_stream, const_cast<int*>(&kHoldMs)), cudaSuccess);
  ASSERT_EQ(device_backward(p.get(), in, out, stream), LNMLP_SUCCESS) << lnmlp_last_error();
  const std::vector<float> sevens(static_cast<size_t>(len), 7.0f);
  ASSERT_EQ(lnmlp_plan_set_quantizer_state(p.get(), LNMLP_QUANTIZER_DY, 2.0f, sevens.data(), len), LNMLP_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(lnmlp_plan_get_quantizer_state(p.get(), LNMLP_QUANTIZER_DY, &scale, hist.data(), len), LNMLP_SUCCESS);
  EXPECT_EQ(scale, 2.0f) << "a queued backward overwrote the state written after it";
  EXPECT_EQ(hist, sevens);

  // A forward after a write sees it: W1's history moves on from what was written.
  ASSERT_EQ(lnmlp_plan_set_quantizer_state(p.get(), LNMLP_QUANTIZER_W1, 4.0f, sevens.data(), len), LNMLP_SUCCESS);
  ASSERT_EQ(device_forward(p.get(), in, out, stream), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(lnmlp_plan_get_quantizer_state(p.get(), LNMLP_QUANTIZER_W1, &scale, hist.data(), len), LNMLP_SUCCESS);
  EXPECT_GT(hist[0], 0.0f);
  if (len > 1) {
    EXPECT_EQ(hist[1], 7.0f) << "the forward did not start from the state written before it";
  }
  cudaStreamDestroy(stream);
}

// Amaxes in stages (LNMLP_CALL_AMAX_*) on the CUDA backend, current scaling's and NVFP4's (two per
// quantizer; backward given forward's): the amaxes the stages measure, into a device array, given
// back stage by stage, give the whole calls' bits, and W1's, W2's and dy's are their maxima
// exactly.
TEST(CudaFp8State, AmaxesInStagesGiveTheWholeCallsBits) {
  SKIP_WITHOUT_GPU();
  for (const int32_t recipe : {LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_NVFP4}) {
    const bool nvfp4 = recipe == LNMLP_RECIPE_NVFP4;
    const Problem pr = fp8_problem({recipe, LNMLP_DTYPE_BF16, true, 64, 128, 192});
    for (const int32_t remat : {LNMLP_REMAT_SAVE_ALL, LNMLP_REMAT_SAVE_STATS}) {
      SCOPED_TRACE("recipe " + std::to_string(recipe) + " remat " + std::to_string(remat));
      PlanPtr p = plan_ptr(make_plan(pr, remat, LNMLP_BACKEND_CUDA, 0, recipe));
      const int64_t saved_bytes = saved_bytes_of(p.get());
      const DeviceInputs in(pr);
      const DeviceOutputs whole(pr, saved_bytes), staged(pr, saved_bytes);
      LNMLP_TEST_CHECK(device_forward(p.get(), in, whole, nullptr));
      LNMLP_TEST_CHECK(lnmlp_plan_set_rng_state(p.get(), 9, 0));
      LNMLP_TEST_CHECK(device_backward(p.get(), in, whole, nullptr));
      const size_t per_quantizer = nvfp4 ? 2 : 1;
      const std::vector<float> unset(LNMLP_QUANTIZER_COUNT * per_quantizer, -1.0f);
      const DeviceBuffer amax(unset.data(), unset.size() * sizeof(float));
      auto* a = static_cast<float*>(amax.get());
      const auto forward = [&](int32_t flags) {
        return lnmlp_plan_forward(p.get(), plan_tokens(p.get()), in.x.get(), in.gamma.get(), in.beta.get(), in.w1.get(),
                                  in.b1.get(), in.w2.get(), in.b2.get(), staged.y.get(), staged.saved.get(), a, flags,
                                  nullptr);
      };
      const auto backward = [&](int32_t flags) {
        return lnmlp_plan_backward(p.get(), plan_tokens(p.get()), in.dy.get(), in.x.get(), in.gamma.get(),
                                   in.beta.get(), in.w1.get(), in.b1.get(), in.w2.get(), staged.saved.get(),
                                   staged.dx.get(), staged.dgamma.get(), staged.dbeta.get(), staged.dw1.get(),
                                   staged.db1.get(), staged.dw2.get(), staged.db2.get(), a, flags, nullptr);
      };
      const int32_t g = LNMLP_CALL_AMAX_GIVEN_LN_OUT | LNMLP_CALL_AMAX_GIVEN_W1 | LNMLP_CALL_AMAX_GIVEN_W2;
      const int32_t forward_given = g | LNMLP_CALL_AMAX_GIVEN_ACT_OUT;
      const int32_t in_backward = nvfp4 ? forward_given : 0;  // NVFP4 quantizes the weights again
      LNMLP_TEST_CHECK(forward(LNMLP_CALL_AMAX_MEASURE));
      LNMLP_TEST_CHECK(forward(LNMLP_CALL_AMAX_MEASURE | g));
      LNMLP_TEST_CHECK(forward(forward_given));
      LNMLP_TEST_CHECK(lnmlp_plan_set_rng_state(p.get(), 9, 0));
      LNMLP_TEST_CHECK(backward(in_backward | LNMLP_CALL_AMAX_MEASURE));
      LNMLP_TEST_CHECK(backward(in_backward | LNMLP_CALL_AMAX_MEASURE | LNMLP_CALL_AMAX_GIVEN_DY));
      LNMLP_TEST_CHECK(backward(in_backward | LNMLP_CALL_AMAX_GIVEN_DY | LNMLP_CALL_AMAX_GIVEN_DH));
      CUDA_TEST_CHECK(cudaDeviceSynchronize());
      std::vector<float> got(unset.size());
      CUDA_TEST_CHECK(cudaMemcpy(got.data(), a, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
      const auto max_abs = [](const Buffer& b) {
        double m = 0.0;
        for (double v : b.to_doubles()) m = std::max(m, std::fabs(v));
        return m;
      };
      const auto at = [&](int32_t q) { return got[q * per_quantizer]; };  // the rowwise one under NVFP4
      EXPECT_EQ(at(LNMLP_QUANTIZER_W1), max_abs(pr.bw1));
      EXPECT_EQ(at(LNMLP_QUANTIZER_W2), max_abs(pr.bw2));
      EXPECT_EQ(at(LNMLP_QUANTIZER_DY), max_abs(pr.bdy));
      for (float v : got) EXPECT_GT(v, 0.0f);
      const RunResult a_host = to_host(pr, staged, true), b_host = to_host(pr, whole, true);
      EXPECT_TRUE(same_outputs(a_host, b_host));
    }
  }
}

// FP8 forward + backward captured into a graph and replayed: the same bits as eager runs (current
// scaling: stateless, so every replay starts from the same state).
TEST(CudaFp8Graph, CurrentScalingCapturesAndReplays) {
  SKIP_WITHOUT_GPU();
  const Fp8Case k{LNMLP_RECIPE_CURRENT, LNMLP_DTYPE_BF16, true, 256, 128, 192};
  const Problem pr = fp8_problem(k);
  PlanPtr p = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CUDA, 0, k.recipe));
  const int64_t saved_bytes = saved_bytes_of(p.get());
  const DeviceInputs in(pr);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const DeviceOutputs eager(pr, saved_bytes), replayed(pr, saved_bytes);
  ASSERT_EQ(device_forward(p.get(), in, eager, stream), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(device_backward(p.get(), in, eager, stream), LNMLP_SUCCESS) << lnmlp_last_error();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(capture_step(p.get(), in, replayed, stream, &exec), "");
  for (int rep = 0; rep < 2; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const RunResult a = to_host(pr, eager, true), b = to_host(pr, replayed, true);
  EXPECT_TRUE(same_outputs(a, b));
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
}

TEST(CudaFp8Errors, PerTensorFp8NeedsMultiplesOf16) {
  SKIP_WITHOUT_GPU();
  const Fp8Case k{LNMLP_RECIPE_DELAYED, LNMLP_DTYPE_BF16, false, 100, 128, 192};
  const Problem pr = fp8_problem(k);
  const auto& c = pr.cfg;
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  lnmlp_desc_set_shape(d, c.tokens, c.hidden, c.ffn);
  lnmlp_desc_set_dtype(d, pr.dtype);
  lnmlp_desc_set_backend(d, LNMLP_BACKEND_CUDA, 0);
  lnmlp_desc_set_recipe(d, LNMLP_RECIPE_DELAYED);
  lnmlp_plan* p = nullptr;
  EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(lnmlp_last_error()).find("multiples of 16"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(p, nullptr);
  lnmlp_desc_destroy(d);
}

}  // namespace
// The saved buffer across backends (lnmlp.h, "Sections of the saved buffer"): an unquantized CUDA
// forward's buffer serves a CPU backward (the CPU backend's gradients, within the backends'
// tolerance), where under a per-tensor FP8 recipe the codes are in each backend's own operand
// layout (row-major on the CPU, K-major on CUDA), so the CPU backward of a CUDA forward's buffer
// is far off: the header's exception, shown.
TEST(CudaFp8State, AnUnquantizedSavedBufferServesTheOtherBackendAndFp8CodesDoNot) {
  SKIP_WITHOUT_GPU();
  for (int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_CURRENT}) {
    SCOPED_TRACE(recipe == LNMLP_RECIPE_NONE ? "unquantized" : "current scaling");
    const Problem pr = fp8_problem({recipe, LNMLP_DTYPE_BF16, true, 64, 128, 192});
    const PlanRun gpu = run_cuda(pr, LNMLP_REMAT_SAVE_ALL, recipe);
    const PlanRun cpu = run_cpu(pr, LNMLP_REMAT_SAVE_ALL, recipe);
    ASSERT_EQ(gpu.saved.size(), cpu.saved.size());
    PlanPtr p = plan_ptr(make_plan(pr, LNMLP_REMAT_SAVE_ALL, LNMLP_BACKEND_CPU, 0, recipe));
    AlignedMemory saved(static_cast<int64_t>(gpu.saved.size()), 256, 0);
    std::memcpy(saved.get(), gpu.saved.data(), gpu.saved.size());
    RunResult r = cpu.r;
    LNMLP_TEST_CHECK(lnmlp_plan_backward(p.get(), plan_tokens(p.get()), pr.bdy.data(), pr.bx.data(), pr.bgamma.data(),
                                         pr.bbeta.data(), pr.bw1.data(), pr.bb1.data(), pr.bw2.data(), saved.get(),
                                         r.dx.data(), r.dgamma.data(), r.dbeta.data(), r.dw1.data(), r.db1.data(),
                                         r.dw2.data(), r.db2.data(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
    const Tolerance tol = recipe == LNMLP_RECIPE_NONE ? gpu_vs_cpu_tolerance(pr.dtype) : kTolFp8Backends;
    const bool close = within_tolerance("dW1 from the CUDA forward's buffer", r.dw1.to_doubles(),
                                        cpu.r.dw1.to_doubles(), nullptr, tol);
    EXPECT_EQ(close, recipe == LNMLP_RECIPE_NONE);
    EXPECT_TRUE(
        within_tolerance("dx from the CUDA forward's buffer", r.dx.to_doubles(), cpu.r.dx.to_doubles(), nullptr, tol));
  }
}

}  // namespace lnmlp_gpu_test
