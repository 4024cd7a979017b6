// Gradient accumulation (lnmlp_desc_set_weight_gradients): over several micro-batches with the
// same weights, dW1, db1, dW2 and db2 are added into the caller's buffers, optionally in fp32 while
// the I/O dtype is bf16 or f16, and end as the float64 reference's sum of the micro-batches'
// gradients plus what the buffers held before. Also the weights' own dtype option
// (lnmlp_desc_set_weight_dtype), whose numerics the Python FP8 tests check against the simulation.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_util.h"
#include "tolerances.h"

using namespace lnmlp_test;

namespace {

struct Case {
  const char* name;
  int32_t dtype;
  int32_t grad_dtype;  // -1: the I/O dtype
  int32_t recipe;
  int32_t remat;
};

const Case kCases[] = {
    {"f32", LNMLP_DTYPE_F32, -1, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL},
    {"bf16_into_bf16", LNMLP_DTYPE_BF16, -1, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_FFN1},
    {"bf16_into_f32", LNMLP_DTYPE_BF16, LNMLP_DTYPE_F32, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL},
    {"f16_into_f32", LNMLP_DTYPE_F16, LNMLP_DTYPE_F32, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_STATS},
    {"f16_into_f16", LNMLP_DTYPE_F16, -1, LNMLP_RECIPE_NONE, LNMLP_REMAT_SAVE_ALL},
    {"current_bf16_into_f32", LNMLP_DTYPE_BF16, LNMLP_DTYPE_F32, LNMLP_RECIPE_CURRENT, LNMLP_REMAT_SAVE_ALL},
    // (Delayed scaling accumulates through the same per-tensor path as current scaling; from a fresh
    // state its first steps quantize with scale 1, too coarse for a comparison with the reference.)
    {"current_bf16_into_bf16", LNMLP_DTYPE_BF16, -1, LNMLP_RECIPE_CURRENT, LNMLP_REMAT_SAVE_STATS},
    {"mxfp8_bf16_into_f32", LNMLP_DTYPE_BF16, LNMLP_DTYPE_F32, LNMLP_RECIPE_MXFP8, LNMLP_REMAT_SAVE_ALL},
    {"block_f32", LNMLP_DTYPE_F32, -1, LNMLP_RECIPE_BLOCK, LNMLP_REMAT_SAVE_ALL},
};

lnmlp_ref::Config config(int64_t tokens) {
  return lnmlp_ref::biased_config(tokens, 32, 48, {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR});
}

// Micro-batch `i`'s inputs (x, dy) with micro-batch 0's parameters.
Problem micro_batch(const Problem& first, int i, int32_t dtype, int64_t tokens) {
  return with_parameters(make_problem(config(tokens), dtype, 500 + static_cast<uint64_t>(i)), first);
}

// A tensor of `n` values in `dtype` (F32, BF16, F16), from doubles.
Buffer holding(const std::vector<double>& v, int32_t dtype) { return Buffer::from(v, dtype); }

class GradAccumulation : public ::testing::TestWithParam<Case> {};

TEST_P(GradAccumulation, MicroBatchesAddUpToTheReferenceSum) {
  const Case& k = GetParam();
  const int64_t kMost = 24;
  const int64_t tokens[] = {24, 7, 16};  // micro-batches of different sizes, on one plan
  const Problem first = make_problem(config(tokens[0]), k.dtype, 500);
  lnmlp_desc* d = nullptr;
  LNMLP_TEST_CHECK(lnmlp_desc_create(&d));
  std::unique_ptr<lnmlp_desc, int32_t (*)(lnmlp_desc*)> guard(d, lnmlp_desc_destroy);
  LNMLP_TEST_CHECK(lnmlp_desc_set_shape(d, kMost, 32, 48));
  const int32_t acts[2] = {LNMLP_ACT_GELU, LNMLP_ACT_LINEAR};
  LNMLP_TEST_CHECK(lnmlp_desc_set_activations(d, 2, acts));
  LNMLP_TEST_CHECK(lnmlp_desc_set_bias(d, 1, 1));
  LNMLP_TEST_CHECK(lnmlp_desc_set_dtype(d, k.dtype));
  LNMLP_TEST_CHECK(lnmlp_desc_set_weight_layout(d, first.weight_layout));
  LNMLP_TEST_CHECK(lnmlp_desc_set_remat(d, k.remat));
  LNMLP_TEST_CHECK(lnmlp_desc_set_recipe(d, k.recipe));
  LNMLP_TEST_CHECK(lnmlp_desc_set_num_threads(d, 2));
  LNMLP_TEST_CHECK(lnmlp_desc_set_weight_gradients(d, 1, k.grad_dtype));
  lnmlp_plan* raw = nullptr;
  LNMLP_TEST_CHECK(lnmlp_plan_create(d, &raw));
  std::unique_ptr<lnmlp_plan, int32_t (*)(lnmlp_plan*)> p(raw, lnmlp_plan_destroy);

  // The gradients' dtype, as the shape query reports it.
  int64_t rank = 0, dims[LNMLP_MAX_TENSOR_RANK];
  int32_t gdtype = 0, io_dtype = 0;
  LNMLP_TEST_CHECK(lnmlp_plan_get_tensor_shape(p.get(), LNMLP_TENSOR_DW1, 0, &rank, dims, &gdtype));
  ASSERT_EQ(gdtype, k.grad_dtype < 0 ? k.dtype : k.grad_dtype);
  LNMLP_TEST_CHECK(lnmlp_plan_get_tensor_shape(p.get(), LNMLP_TENSOR_DGAMMA, 0, &rank, dims, &io_dtype));
  ASSERT_EQ(io_dtype, k.dtype) << "dgamma stays in the I/O dtype";

  // What the buffers held before (an earlier step's gradients): nonzero, so that overwriting fails.
  const size_t H = 32, AF = 96, F = 48;
  std::vector<double> dw1(H * AF), db1(AF), dw2(F * H), db2(H);
  for (auto* v : {&dw1, &db1, &dw2, &db2})
    for (size_t i = 0; i < v->size(); ++i)
      (*v)[i] = round_to_dtype(0.01 * static_cast<double>((i * 37) % 11) - 0.05, gdtype);
  // dW1 and dW2 in the weights' layout (the sums below stay in x out).
  const int32_t layout = first.weight_layout;
  Buffer bdw1 = weight_in_layout(holding(dw1, gdtype), H, AF, layout), bdb1 = holding(db1, gdtype),
         bdw2 = weight_in_layout(holding(dw2, gdtype), F, H, layout), bdb2 = holding(db2, gdtype);

  const int64_t saved_bytes = saved_bytes_of(p.get());
  AlignedMemory saved(saved_bytes, 64, 0xFF);
  for (int i = 0; i < 3; ++i) {
    const Problem mb = micro_batch(first, i, k.dtype, tokens[i]);
    const size_t t = static_cast<size_t>(tokens[i]);
    Buffer y(k.dtype, t * H), dx(k.dtype, t * H), dgamma(k.dtype, H), dbeta(k.dtype, H);
    LNMLP_TEST_CHECK(lnmlp_plan_forward(p.get(), tokens[i], mb.bx.data(), mb.bgamma.data(), mb.bbeta.data(),
                                        mb.bw1.data(), mb.bb1.data(), mb.bw2.data(), mb.bb2.data(), y.data(),
                                        saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
    LNMLP_TEST_CHECK(lnmlp_plan_backward(p.get(), tokens[i], mb.bdy.data(), mb.bx.data(), mb.bgamma.data(),
                                         mb.bbeta.data(), mb.bw1.data(), mb.bb1.data(), mb.bw2.data(), saved.get(),
                                         dx.data(), dgamma.data(), dbeta.data(), bdw1.data(), bdb1.data(), bdw2.data(),
                                         bdb2.data(), nullptr, LNMLP_CALL_DEFAULT, nullptr));
    // dgamma is this micro-batch's alone (overwritten, never accumulated).
    const lnmlp_ref::Grads g = lnmlp_ref::backward(mb.cfg, mb.x, mb.p, mb.dy);
    const Tolerance tol = k.recipe == LNMLP_RECIPE_NONE ? tolerance_for(k.dtype) : kTolFp8;
    EXPECT_TRUE(within_tolerance("dgamma", dgamma.to_doubles(), g.dgamma, nullptr, tol)) << "micro-batch " << i;
    for (size_t j = 0; j < dw1.size(); ++j) dw1[j] += g.dw1[j];
    for (size_t j = 0; j < db1.size(); ++j) db1[j] += g.db1[j];
    for (size_t j = 0; j < dw2.size(); ++j) dw2[j] += g.dw2[j];
    for (size_t j = 0; j < db2.size(); ++j) db2[j] += g.db2[j];
  }
  // Each accumulation rounds once into the buffer's dtype: the I/O dtype's tolerance (FP8's
  // under a recipe) bounds the sum as it bounds one gradient.
  const Tolerance tol = k.recipe == LNMLP_RECIPE_NONE ? tolerance_for(k.dtype) : kTolFp8;
  EXPECT_TRUE(within_tolerance("dW1", weight_in_out(bdw1, H, AF, layout).to_doubles(), dw1, nullptr, tol));
  EXPECT_TRUE(within_tolerance("db1", bdb1.to_doubles(), db1, nullptr, tol));
  EXPECT_TRUE(within_tolerance("dW2", weight_in_out(bdw2, F, H, layout).to_doubles(), dw2, nullptr, tol));
  EXPECT_TRUE(within_tolerance("db2", bdb2.to_doubles(), db2, nullptr, tol));

  // A micro-batch with no tokens leaves the accumulated gradients as they are.
  const Buffer before = bdw1;
  Buffer dgamma(k.dtype, H), dbeta(k.dtype, H);
  LNMLP_TEST_CHECK(lnmlp_plan_backward(p.get(), 0, nullptr, nullptr, first.bgamma.data(), first.bbeta.data(),
                                       first.bw1.data(), first.bb1.data(), first.bw2.data(), nullptr, nullptr,
                                       dgamma.data(), dbeta.data(), bdw1.data(), bdb1.data(), bdw2.data(), bdb2.data(),
                                       nullptr, LNMLP_CALL_DEFAULT, nullptr));
  EXPECT_EQ(bdw1.bytes, before.bytes);
}

INSTANTIATE_TEST_SUITE_P(All, GradAccumulation, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

TEST(GradAccumulationArguments, AreChecked) {
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  EXPECT_EQ(lnmlp_desc_set_weight_gradients(d, 2, -1), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_desc_set_weight_gradients(d, 1, 7), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_desc_set_weight_gradients(d, 1, -2), LNMLP_ERROR_INVALID_ARGUMENT);
  // f16 gradients of a bf16 plan: neither the plan's dtype nor fp32.
  ASSERT_EQ(lnmlp_desc_set_shape(d, 4, 8, 8), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_dtype(d, LNMLP_DTYPE_BF16), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_weight_gradients(d, 1, LNMLP_DTYPE_F16), LNMLP_SUCCESS);
  lnmlp_plan* p = nullptr;
  EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("lnmlp_desc_set_weight_gradients"), std::string::npos);
  EXPECT_EQ(p, nullptr);
  lnmlp_desc_destroy(d);
}

// fp32 weights with a bf16 plan: accepted only under an FP8 recipe, reported by the shape query,
// and checked as fp32 tensors (4-byte alignment) by forward.
TEST(WeightDtypeArguments, AreCheckedAndReported) {
  lnmlp_desc* d = nullptr;
  ASSERT_EQ(lnmlp_desc_create(&d), LNMLP_SUCCESS);
  EXPECT_EQ(lnmlp_desc_set_weight_dtype(d, 7), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lnmlp_desc_set_weight_dtype(d, -2), LNMLP_ERROR_INVALID_ARGUMENT);
  const int64_t T = 4, H = 16, F = 16;
  ASSERT_EQ(lnmlp_desc_set_shape(d, T, H, F), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_desc_set_dtype(d, LNMLP_DTYPE_BF16), LNMLP_SUCCESS);
  lnmlp_plan* p = nullptr;
  ASSERT_EQ(lnmlp_desc_set_weight_dtype(d, LNMLP_DTYPE_F16), LNMLP_SUCCESS);
  EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(lnmlp_last_error()).find("lnmlp_desc_set_weight_dtype"), std::string::npos);
  ASSERT_EQ(lnmlp_desc_set_weight_dtype(d, LNMLP_DTYPE_F32), LNMLP_SUCCESS);
  EXPECT_EQ(lnmlp_plan_create(d, &p), LNMLP_ERROR_NOT_SUPPORTED);
  EXPECT_NE(std::string(lnmlp_last_error()).find("FP8 recipe"), std::string::npos);
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(lnmlp_desc_set_recipe(d, LNMLP_RECIPE_CURRENT), LNMLP_SUCCESS);
  ASSERT_EQ(lnmlp_plan_create(d, &p), LNMLP_SUCCESS) << lnmlp_last_error();
  lnmlp_desc_destroy(d);
  const auto dtype_of = [&](int32_t tensor) {
    int64_t rank = 0, dims[LNMLP_MAX_TENSOR_RANK] = {};
    int32_t dtype = -1;
    EXPECT_EQ(lnmlp_plan_get_tensor_shape(p, tensor, T, &rank, dims, &dtype), LNMLP_SUCCESS);
    return dtype;
  };
  EXPECT_EQ(dtype_of(LNMLP_TENSOR_W1), LNMLP_DTYPE_F32);
  EXPECT_EQ(dtype_of(LNMLP_TENSOR_W2), LNMLP_DTYPE_F32);
  EXPECT_EQ(dtype_of(LNMLP_TENSOR_X), LNMLP_DTYPE_BF16);
  EXPECT_EQ(dtype_of(LNMLP_TENSOR_GAMMA), LNMLP_DTYPE_BF16);
  EXPECT_EQ(dtype_of(LNMLP_TENSOR_DW1), LNMLP_DTYPE_BF16);  // the gradients keep their own option
  // w1 2-byte aligned (enough for bf16, not for fp32) is refused, naming it.
  std::vector<uint16_t> x(T * H), gamma(H), beta(H), y(T * H);
  std::vector<float> w1(H * F + 1), w2(F * H);
  const int64_t saved_bytes = saved_bytes_of(p);
  AlignedMemory saved(saved_bytes, 256, 0);
  const void* w1_off = reinterpret_cast<const char*>(w1.data()) + 2;
  EXPECT_EQ(lnmlp_plan_forward(p, T, x.data(), gamma.data(), beta.data(), w1_off, nullptr, w2.data(), nullptr, y.data(),
                               saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr),
            LNMLP_ERROR_MISALIGNED);
  EXPECT_NE(std::string(lnmlp_last_error()).find("w1"), std::string::npos) << lnmlp_last_error();
  EXPECT_EQ(lnmlp_plan_forward(p, T, x.data(), gamma.data(), beta.data(), w1.data(), nullptr, w2.data(), nullptr,
                               y.data(), saved.get(), nullptr, LNMLP_CALL_DEFAULT, nullptr),
            LNMLP_SUCCESS)
      << lnmlp_last_error();
  lnmlp_plan_destroy(p);
}

}  // namespace
