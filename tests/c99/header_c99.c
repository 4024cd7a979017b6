/* lnmlp.h as a strict C99 program sees it (-std=c99 -pedantic -Wall -Wextra -Werror): checks the
 * version and ABI, builds a tiny plan, runs forward and backward, and compares the results with
 * the same block computed here by plain loops. Returns 0 on success.
 * It sees the stable core only (the build defines LNMLP_EXPERIMENTAL for everything else): the
 * whole life of a plan needs nothing from the experimental tier. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#undef LNMLP_EXPERIMENTAL
#include "lnmlp.h"

/* Without LNMLP_EXPERIMENTAL the tier is not declared: each of these declarations would clash with
 * the header's (a compile error) if it were. */
enum { LNMLP_BACKEND_CUDA = 99, LNMLP_FEATURE_SHARDING = 98 };
typedef int lnmlp_comm_callbacks;
static const int lnmlp_desc_set_sharding = 0, lnmlp_comm_create_callbacks = 0, lnmlp_plan_export_state = 0;

#define T 3
#define H 4
#define F 5

static int failures = 0;

#define CHECK(cond)                                                     \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                       \
    }                                                                   \
  } while (0)

#define CALL(expr)                                                                  \
  do {                                                                              \
    int32_t st_ = (expr);                                                           \
    if (st_ != LNMLP_SUCCESS) {                                                     \
      fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,           \
              lnmlp_status_string(st_), lnmlp_last_error());                        \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

static int close_to(double got, double want) { return fabs(got - want) <= 1e-4 * (1.0 + fabs(want)); }

int main(void) {
  int32_t major = -1, minor = -1, patch = -1, abi = -1;
  int32_t supported = -1;
  const char* info = NULL;
  lnmlp_desc* desc = NULL;
  lnmlp_plan* plan = NULL;
  int64_t saved_bytes = 0, align = 0;
  void* saved = NULL;
  const int32_t act = LNMLP_ACT_RELU;
  float x[T * H], gamma[H], beta[H], w1[H * F], b1[F], w2[F * H], b2[H], y[T * H];
  float dy[T * H], dx[T * H], dgamma[H], dbeta[H], dw1[H * F], db1[F], dw2[F * H], db2[H];
  /* the expectation, computed here */
  double n[T][H], hpre[T][F], a[T][F], want_y[T][H], want_db2[H], want_dw2[F][H], want_db1[F];
  int t, i, j;
  lnmlp_comm_callbacks not_a_table = lnmlp_desc_set_sharding + lnmlp_comm_create_callbacks + lnmlp_plan_export_state;
  CHECK(not_a_table == 0 && LNMLP_BACKEND_CUDA + LNMLP_FEATURE_SHARDING == 197);

  /* Versions: what this program was compiled with must be what it runs with. */
  CALL(lnmlp_get_version(&major, &minor, &patch, &abi));
  if (abi != LNMLP_ABI_VERSION) {
    fprintf(stderr, "ABI mismatch: library %d, header %d\n", (int)abi, LNMLP_ABI_VERSION);
    return 1;
  }
  CHECK(major == LNMLP_VERSION_MAJOR && minor == LNMLP_VERSION_MINOR && patch == LNMLP_VERSION_PATCH);
  CALL(lnmlp_get_build_info(&info));
  CHECK(info != NULL && info[0] != '\0');
  CALL(lnmlp_query_support(LNMLP_BACKEND_CPU, LNMLP_FEATURE_BACKEND, &supported));
  CHECK(supported == 1);
  CHECK(strcmp(lnmlp_status_string(LNMLP_ERROR_NULL_POINTER), "LNMLP_ERROR_NULL_POINTER") == 0);
  CHECK(lnmlp_last_error() != NULL);

  /* Inputs: small exact values. */
  for (i = 0; i < T * H; ++i) {
    x[i] = (float)((i * 7) % 11 - 5) / 4.0f;
    dy[i] = (float)((i * 5) % 7 - 3) / 8.0f;
  }
  for (j = 0; j < H; ++j) {
    gamma[j] = 1.0f + (float)j / 8.0f;
    beta[j] = (float)(j - 2) / 16.0f;
    b2[j] = (float)(1 - j) / 8.0f;
  }
  for (i = 0; i < H * F; ++i) w1[i] = (float)((i * 3) % 9 - 4) / 8.0f;
  for (i = 0; i < F * H; ++i) w2[i] = (float)((i * 5) % 7 - 3) / 8.0f;
  for (i = 0; i < F; ++i) b1[i] = (float)(i - 2) / 8.0f;

  /* The plan: layernorm, relu, both biases, f32, saves everything. */
  CALL(lnmlp_desc_create(&desc));
  CALL(lnmlp_desc_set_shape(desc, T, H, F));
  CALL(lnmlp_desc_set_norm(desc, LNMLP_NORM_LAYERNORM));
  CALL(lnmlp_desc_set_epsilon(desc, 1e-5f));
  CALL(lnmlp_desc_set_activations(desc, 1, &act));
  CALL(lnmlp_desc_set_bias(desc, 1, 1));
  CALL(lnmlp_desc_set_dtype(desc, LNMLP_DTYPE_F32));
  CALL(lnmlp_desc_set_remat(desc, LNMLP_REMAT_SAVE_ALL));
  CALL(lnmlp_plan_create(desc, &plan));
  CALL(lnmlp_desc_destroy(desc));

  /* A failure is reported, not crashed on. */
  CHECK(lnmlp_plan_forward(plan, T, NULL, gamma, beta, w1, b1, w2, b2, y, NULL, NULL, LNMLP_CALL_DEFAULT, NULL) ==
        LNMLP_ERROR_NULL_POINTER);
  CHECK(lnmlp_last_error()[0] != '\0');

  CALL(lnmlp_plan_get_saved_bytes(plan, &saved_bytes));
  CALL(lnmlp_plan_get_alignment(plan, &align));
  CHECK(saved_bytes > 0 && align > 0);
  /* aligned_alloc is C11; over-allocate and align by hand instead. */
  {
    char* raw = (char*)malloc((size_t)(saved_bytes + align));
    size_t off;
    if (raw == NULL) return 1;
    off = (size_t)((uintptr_t)align - (uintptr_t)raw % (uintptr_t)align) % (size_t)align;
    saved = raw + off;
    CALL(lnmlp_plan_forward(plan, T, x, gamma, beta, w1, b1, w2, b2, y, saved, NULL, LNMLP_CALL_DEFAULT, NULL));
    CALL(lnmlp_plan_backward(plan, T, dy, x, gamma, beta, w1, b1, w2, saved, dx, dgamma, dbeta, dw1, db1, dw2, db2,
                             NULL, LNMLP_CALL_DEFAULT, NULL));
    free(raw);
  }
  CALL(lnmlp_plan_destroy(plan));

  /* The same block, by hand. */
  for (t = 0; t < T; ++t) {
    double mu = 0.0, var = 0.0, rs;
    for (j = 0; j < H; ++j) mu += x[t * H + j];
    mu /= H;
    for (j = 0; j < H; ++j) var += (x[t * H + j] - mu) * (x[t * H + j] - mu);
    var /= H;
    rs = 1.0 / sqrt(var + 1e-5f);
    for (j = 0; j < H; ++j) n[t][j] = (x[t * H + j] - mu) * rs * gamma[j] + beta[j];
    for (i = 0; i < F; ++i) {
      double s = b1[i];
      for (j = 0; j < H; ++j) s += n[t][j] * w1[j * F + i];
      hpre[t][i] = s;
      a[t][i] = s > 0.0 ? s : 0.0;
    }
    for (j = 0; j < H; ++j) {
      double s = b2[j];
      for (i = 0; i < F; ++i) s += a[t][i] * w2[i * H + j];
      want_y[t][j] = s;
    }
  }
  for (j = 0; j < H; ++j) {
    want_db2[j] = 0.0;
    for (t = 0; t < T; ++t) want_db2[j] += dy[t * H + j];
  }
  for (i = 0; i < F; ++i) {
    want_db1[i] = 0.0;
    for (j = 0; j < H; ++j) {
      want_dw2[i][j] = 0.0;
      for (t = 0; t < T; ++t) want_dw2[i][j] += a[t][i] * dy[t * H + j];
    }
    for (t = 0; t < T; ++t) {
      double da = 0.0;
      for (j = 0; j < H; ++j) da += dy[t * H + j] * w2[i * H + j];
      if (hpre[t][i] > 0.0) want_db1[i] += da;
    }
  }

  for (t = 0; t < T; ++t)
    for (j = 0; j < H; ++j)
      if (!close_to(y[t * H + j], want_y[t][j])) {
        fprintf(stderr, "y[%d][%d] = %.7g, expected %.7g\n", t, j, y[t * H + j], want_y[t][j]);
        ++failures;
      }
  for (j = 0; j < H; ++j) CHECK(close_to(db2[j], want_db2[j]));
  for (i = 0; i < F; ++i) {
    CHECK(close_to(db1[i], want_db1[i]));
    for (j = 0; j < H; ++j) CHECK(close_to(dw2[i * H + j], want_dw2[i][j]));
  }

  if (failures != 0) {
    fprintf(stderr, "header_c99: %d check(s) failed\n", failures);
    return 1;
  }
  printf("header_c99: lnmlp %d.%d.%d (ABI %d) OK\n", (int)major, (int)minor, (int)patch, (int)abi);
  return 0;
}
