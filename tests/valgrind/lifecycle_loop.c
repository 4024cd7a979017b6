/* A plan's whole life, many times over, for valgrind's memcheck (scripts/valgrind.sh): for every
 * dtype, remat policy and FP8 recipe, on one and two threads, with the plan's own workspace and an
 * attached one, create a plan, run forward and backward on every token count of a few, export and
 * import its FP8 state, make a few calls that must fail (so error messages are made), and destroy
 * it. memcheck must see no invalid read or write, no use of an uninitialised value, and nothing
 * definitely or indirectly lost. Run natively too (CTest), where it checks the statuses only.
 *
 *   lnmlp_lifecycle_loop [rounds]    (default 2) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnmlp.h"

static int failures = 0;

static void expect(int32_t status, int32_t wanted, const char* what) {
  if (status != wanted) {
    printf("FAILED: %s: %s, wanted %s (%s)\n", what, lnmlp_status_string(status), lnmlp_status_string(wanted),
           lnmlp_last_error());
    ++failures;
  }
}

/* 64-byte aligned, filled with small values valid in every dtype (0x3c3c: bf16 0.0115, f16 1.06). */
static void* buffer(int64_t bytes) {
  const size_t n = (size_t)((bytes + 63) / 64 * 64 + 64);
  void* p = aligned_alloc(64, n);
  if (p != NULL) memset(p, 0x3c, n);
  return p;
}

static void one_plan(int32_t dtype, int32_t remat, int32_t recipe, int32_t threads, int32_t external) {
  const int64_t T = 48, H = 64, F = 96;
  const int32_t acts[2] = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  lnmlp_desc* d = NULL;
  lnmlp_plan* p = NULL;
  expect(lnmlp_desc_create(&d), LNMLP_SUCCESS, "desc_create");
  expect(lnmlp_desc_set_shape(d, T, H, F), LNMLP_SUCCESS, "set_shape");
  expect(lnmlp_desc_set_activations(d, 2, acts), LNMLP_SUCCESS, "set_activations");
  expect(lnmlp_desc_set_bias(d, 1, 1), LNMLP_SUCCESS, "set_bias");
  expect(lnmlp_desc_set_dtype(d, dtype), LNMLP_SUCCESS, "set_dtype");
  expect(lnmlp_desc_set_remat(d, remat), LNMLP_SUCCESS, "set_remat");
  expect(lnmlp_desc_set_recipe(d, recipe), LNMLP_SUCCESS, "set_recipe");
  expect(lnmlp_desc_set_num_threads(d, threads), LNMLP_SUCCESS, "set_num_threads");
  expect(lnmlp_desc_set_external_workspace(d, external), LNMLP_SUCCESS, "set_external_workspace");
  expect(lnmlp_desc_set_shape(d, -1, H, F), LNMLP_ERROR_INVALID_ARGUMENT, "a negative token count");
  expect(lnmlp_plan_create(d, &p), LNMLP_SUCCESS, "plan_create");
  expect(lnmlp_desc_destroy(d), LNMLP_SUCCESS, "desc_destroy");
  if (p == NULL) return;

  const int64_t e = dtype == LNMLP_DTYPE_F32 ? 4 : 2;
  int64_t saved_bytes = 0, work_bytes = 0, state_bytes = 0;
  expect(lnmlp_plan_get_saved_bytes(p, &saved_bytes), LNMLP_SUCCESS, "get_saved_bytes");
  expect(lnmlp_plan_get_workspace_bytes(p, &work_bytes), LNMLP_SUCCESS, "get_workspace_bytes");
  expect(lnmlp_plan_get_state_bytes(p, &state_bytes), LNMLP_SUCCESS, "get_state_bytes");
  void *x = buffer(T * H * e), *g = buffer(H * e), *b = buffer(H * e), *w1 = buffer(H * 2 * F * e);
  void *b1 = buffer(2 * F * e), *w2 = buffer(F * H * e), *b2 = buffer(H * e), *y = buffer(T * H * e);
  void *dy = buffer(T * H * e), *dx = buffer(T * H * e), *dg = buffer(H * e), *dbeta = buffer(H * e);
  void *dw1 = buffer(H * 2 * F * e), *db1 = buffer(2 * F * e), *dw2 = buffer(F * H * e), *db2 = buffer(H * e);
  void *saved = buffer(saved_bytes), *work = external ? buffer(work_bytes) : NULL;
  void* state = buffer(state_bytes);
  if (external) {
    expect(lnmlp_plan_forward(p, T, x, g, b, w1, b1, w2, b2, y, saved, NULL, 0, NULL), LNMLP_ERROR_NO_WORKSPACE,
           "forward before a workspace is attached");
    expect(lnmlp_plan_attach_workspace(p, work, work_bytes), LNMLP_SUCCESS, "attach_workspace");
  }
  const int64_t counts[3] = {T, 1, 17};
  for (int i = 0; i < 3; ++i) {
    const int32_t flags = i == 2 ? LNMLP_CALL_WEIGHTS_UNCHANGED : LNMLP_CALL_DEFAULT;
    expect(lnmlp_plan_forward(p, counts[i], x, g, b, w1, b1, w2, b2, y, saved, NULL, flags, NULL), LNMLP_SUCCESS,
           "forward");
    expect(lnmlp_plan_backward(p, counts[i], dy, x, g, b, w1, b1, w2, saved, dx, dg, dbeta, dw1, db1, dw2, db2, NULL,
                               flags, NULL),
           LNMLP_SUCCESS, "backward");
  }
  expect(lnmlp_plan_forward(p, T + 1, x, g, b, w1, b1, w2, b2, y, saved, NULL, 0, NULL), LNMLP_ERROR_INVALID_ARGUMENT,
         "forward with more tokens than the plan");
  expect(lnmlp_plan_forward(p, T, x, g, NULL, w1, b1, w2, b2, y, saved, NULL, 0, NULL), LNMLP_ERROR_NULL_POINTER,
         "forward without beta");
  if (state_bytes > 0) {
    expect(lnmlp_plan_export_state(p, state, state_bytes), LNMLP_SUCCESS, "export_state");
    expect(lnmlp_plan_import_state(p, state, state_bytes), LNMLP_SUCCESS, "import_state");
    expect(lnmlp_plan_import_state(p, state, state_bytes - 1), LNMLP_ERROR_INVALID_ARGUMENT, "a short state blob");
  }
  expect(lnmlp_plan_destroy(p), LNMLP_SUCCESS, "plan_destroy");
  expect(lnmlp_plan_destroy(p), LNMLP_ERROR_INVALID_HANDLE, "destroying it again");
  void* all[] = {x, g, b, w1, b1, w2, b2, y, dy, dx, dg, dbeta, dw1, db1, dw2, db2, saved, work, state};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; ++i) free(all[i]);
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 2;
  const int32_t dtypes[3] = {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16};
  const int32_t recipes[5] = {LNMLP_RECIPE_NONE, LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK,
                              LNMLP_RECIPE_MXFP8};
  int plans = 0;
  for (int r = 0; r < rounds; ++r)
    for (int di = 0; di < 3; ++di)
      for (int ri = 0; ri < 5; ++ri) {
        /* remat, threads and the workspace's owner rotate, so each appears with every dtype and recipe. */
        const int k = r + di + ri;
        one_plan(dtypes[di], k % 3, recipes[ri], 1 + k % 2, (k / 2) % 2);
        ++plans;
      }
  printf("%d plans created, run and destroyed: %s\n", plans, failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
