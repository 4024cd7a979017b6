/* Two application threads, each with its own plan, running forward and backward at the same time
 * at GEMM-sized shapes (f32, bf16, f16), for valgrind's memcheck (scripts/valgrind.sh); each
 * thread's outputs must equal, bit for bit, those of the same plan run alone beforehand. Under
 * valgrind oneDNN sees no AVX-512, so its f32 GEMMs run the AVX2 sgemm driver, the path that
 * reads past its packing buffer (tests/valgrind/onednn.supp says what and why it is suppressed);
 * the bit-for-bit comparison shows the bytes read there do not reach any result. Run natively
 * too (CTest), where it checks the statuses and the bits.
 *
 *   lnmlp_concurrent_plans */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnmlp.h"

enum { T = 128, H = 256, F = 512, kOutputs = 8 };

typedef struct {
  int32_t dtype;
  int failures;
  void* out[kOutputs]; /* y, dx, dgamma, dbeta, dw1, db1, dw2, db2 of the last call */
  int64_t out_bytes[kOutputs];
} Run;

static void expect(Run* r, int32_t status, const char* what) {
  if (status != LNMLP_SUCCESS) {
    printf("FAILED: %s (dtype %d): %s (%s)\n", what, r->dtype, lnmlp_status_string(status), lnmlp_last_error());
    ++r->failures;
  }
}

/* 64-byte aligned, filled with a pattern of small values valid in every dtype. */
static void* buffer(int64_t bytes, unsigned seed) {
  const size_t n = (size_t)((bytes + 63) / 64 * 64 + 64);
  unsigned char* p = aligned_alloc(64, n);
  if (p == NULL) return NULL;
  for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(i % 2 ? 0x3c : (seed * 31u + i * 7u) % 251u);
  return p;
}

static void* run_plan(void* arg) {
  Run* r = arg;
  lnmlp_desc* d = NULL;
  lnmlp_plan* p = NULL;
  expect(r, lnmlp_desc_create(&d), "desc_create");
  expect(r, lnmlp_desc_set_shape(d, T, H, F), "set_shape");
  expect(r, lnmlp_desc_set_bias(d, 1, 1), "set_bias");
  expect(r, lnmlp_desc_set_dtype(d, r->dtype), "set_dtype");
  expect(r, lnmlp_desc_set_num_threads(d, 1), "set_num_threads");
  expect(r, lnmlp_plan_create(d, &p), "plan_create");
  lnmlp_desc_destroy(d);
  if (p == NULL) return NULL;
  const int64_t e = r->dtype == LNMLP_DTYPE_F32 ? 4 : 2;
  int64_t saved_bytes = 0;
  expect(r, lnmlp_plan_get_saved_bytes(p, &saved_bytes), "get_saved_bytes");
  void *x = buffer(T * H * e, 1), *g = buffer(H * e, 2), *b = buffer(H * e, 3), *w1 = buffer(H * F * e, 4);
  void *b1 = buffer(F * e, 5), *w2 = buffer(F * H * e, 6), *b2 = buffer(H * e, 7), *dy = buffer(T * H * e, 8);
  void* saved = buffer(saved_bytes, 9);
  const int64_t sizes[kOutputs] = {T * H, T * H, H, H, H * F, F, F * H, H};
  for (int i = 0; i < kOutputs; ++i) {
    r->out_bytes[i] = sizes[i] * e;
    r->out[i] = buffer(r->out_bytes[i], 10);
  }
  void** o = r->out;
  const int64_t counts[3] = {T, 37, T};
  for (int i = 0; i < 3; ++i) {
    expect(r, lnmlp_plan_forward(p, counts[i], x, g, b, w1, b1, w2, b2, o[0], saved, NULL, 0, NULL), "forward");
    expect(r,
           lnmlp_plan_backward(p, counts[i], dy, x, g, b, w1, b1, w2, saved, o[1], o[2], o[3], o[4], o[5], o[6], o[7],
                               NULL, 0, NULL),
           "backward");
  }
  lnmlp_plan_destroy(p);
  void* inputs[] = {x, g, b, w1, b1, w2, b2, dy, saved};
  for (size_t i = 0; i < sizeof inputs / sizeof inputs[0]; ++i) free(inputs[i]);
  return NULL;
}

static void release(Run* r) {
  for (int i = 0; i < kOutputs; ++i) free(r->out[i]);
}

int main(void) {
  const int32_t dtypes[3] = {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16};
  int failures = 0;
  /* Each pair: f32 beside bf16, then f32 beside f16 and bf16 beside f16. */
  const int pairs[3][2] = {{0, 1}, {0, 2}, {1, 2}};
  for (int k = 0; k < 3; ++k) {
    Run alone[2], together[2];
    pthread_t th[2];
    for (int i = 0; i < 2; ++i) {
      memset(&alone[i], 0, sizeof alone[i]);
      alone[i].dtype = together[i].dtype = dtypes[pairs[k][i]];
      run_plan(&alone[i]);
      together[i].failures = 0;
    }
    for (int i = 0; i < 2; ++i) pthread_create(&th[i], NULL, run_plan, &together[i]);
    for (int i = 0; i < 2; ++i) pthread_join(th[i], NULL);
    for (int i = 0; i < 2; ++i) {
      failures += alone[i].failures + together[i].failures;
      for (int j = 0; j < kOutputs; ++j)
        if (memcmp(alone[i].out[j], together[i].out[j], (size_t)alone[i].out_bytes[j]) != 0) {
          printf("FAILED: dtype %d, output %d differs between the plan run alone and beside another\n", alone[i].dtype,
                 j);
          ++failures;
        }
      release(&alone[i]);
      release(&together[i]);
    }
  }
  printf("concurrent plans: %s\n", failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
