/* dlopen_example.c -- using lnmlp from C without linking it (C99 + POSIX dlopen).
 *
 * A plugin host does not link liblnmlp: it loads it at run time, resolves each function by name,
 * and refuses a library whose ABI differs from the header it was compiled with (the SONAME
 * liblnmlp.so.<ABI> encodes the same number). This example does exactly that, then runs one
 * fused block (LayerNorm -> GEMM1 + b1 -> GELU -> GEMM2 + b2, f32) forward and backward and checks
 * every output against a float64 reference written below.
 *
 *   cc -std=c99 -I include examples/c/dlopen_example.c -o dlopen_example -ldl -lm
 *   ./dlopen_example [path/to/liblnmlp.so.2]     (default: $LNMLP_LIBRARY, else "liblnmlp.so.2")
 *
 * Exit status: 0 when everything matches, 1 otherwise.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lnmlp.h" /* for the types and enum values only: no lnmlp_* symbol is linked */

/* ---- typed function pointers, one per function used ---------------------------------------- */
typedef int32_t (*get_version_fn)(int32_t*, int32_t*, int32_t*, int32_t*);
typedef const char* (*status_string_fn)(int32_t);
typedef const char* (*last_error_fn)(void);
typedef int32_t (*desc_create_fn)(lnmlp_desc**);
typedef int32_t (*desc_destroy_fn)(lnmlp_desc*);
typedef int32_t (*desc_set_shape_fn)(lnmlp_desc*, int64_t, int64_t, int64_t);
typedef int32_t (*desc_set_i32_fn)(lnmlp_desc*, int32_t); /* set_norm, set_dtype */
typedef int32_t (*desc_set_epsilon_fn)(lnmlp_desc*, float);
typedef int32_t (*desc_set_activations_fn)(lnmlp_desc*, int64_t, const int32_t*);
typedef int32_t (*desc_set_bias_fn)(lnmlp_desc*, int32_t, int32_t);
typedef int32_t (*plan_create_fn)(const lnmlp_desc*, lnmlp_plan**);
typedef int32_t (*plan_destroy_fn)(lnmlp_plan*);
typedef int32_t (*plan_get_i64_fn)(const lnmlp_plan*, int64_t*); /* saved bytes, alignment */
/* forward/backward (ABI 2): plan, the call's tokens, the tensors, fp8_state, flags, stream. */
typedef int32_t (*plan_forward_fn)(lnmlp_plan*, int64_t, const void*, const void*, const void*, const void*,
                                   const void*, const void*, const void*, void*, void*, void*, int32_t, void*);
typedef int32_t (*plan_backward_fn)(lnmlp_plan*, int64_t, const void*, const void*, const void*, const void*,
                                    const void*, const void*, const void*, const void*, void*, void*, void*, void*,
                                    void*, void*, void*, void*, int32_t, void*);

/* Compile-time proof that each typedef matches the header's prototype: comparing pointers of
 * incompatible function types is a constraint violation, so a drift fails the build (-Werror).
 * sizeof does not evaluate its operand, so no lnmlp_* symbol is referenced or linked. */
#define SAME_TYPE(fn, type) typedef char fn##_matches_header[sizeof((type)0 == &fn) ? 1 : -1]
SAME_TYPE(lnmlp_get_version, get_version_fn);
SAME_TYPE(lnmlp_status_string, status_string_fn);
SAME_TYPE(lnmlp_last_error, last_error_fn);
SAME_TYPE(lnmlp_desc_create, desc_create_fn);
SAME_TYPE(lnmlp_desc_destroy, desc_destroy_fn);
SAME_TYPE(lnmlp_desc_set_shape, desc_set_shape_fn);
SAME_TYPE(lnmlp_desc_set_norm, desc_set_i32_fn);
SAME_TYPE(lnmlp_desc_set_dtype, desc_set_i32_fn);
SAME_TYPE(lnmlp_desc_set_epsilon, desc_set_epsilon_fn);
SAME_TYPE(lnmlp_desc_set_activations, desc_set_activations_fn);
SAME_TYPE(lnmlp_desc_set_bias, desc_set_bias_fn);
SAME_TYPE(lnmlp_plan_create, plan_create_fn);
SAME_TYPE(lnmlp_plan_destroy, plan_destroy_fn);
SAME_TYPE(lnmlp_plan_get_saved_bytes, plan_get_i64_fn);
SAME_TYPE(lnmlp_plan_get_alignment, plan_get_i64_fn);
SAME_TYPE(lnmlp_plan_forward, plan_forward_fn);
SAME_TYPE(lnmlp_plan_backward, plan_backward_fn);

static struct {
  get_version_fn get_version;
  status_string_fn status_string;
  last_error_fn last_error;
  desc_create_fn desc_create;
  desc_destroy_fn desc_destroy;
  desc_set_shape_fn desc_set_shape;
  desc_set_i32_fn desc_set_norm, desc_set_dtype;
  desc_set_epsilon_fn desc_set_epsilon;
  desc_set_activations_fn desc_set_activations;
  desc_set_bias_fn desc_set_bias;
  plan_create_fn plan_create;
  plan_destroy_fn plan_destroy;
  plan_get_i64_fn plan_get_saved_bytes, plan_get_alignment;
  plan_forward_fn plan_forward;
  plan_backward_fn plan_backward;
} api;

/* dlsym returns void*; ISO C has no conversion from object to function pointers, so copy the
 * bytes (what POSIX guarantees to work) instead of casting. */
static int resolve(void* lib, const char* name, void* fn_ptr_out, size_t size) {
  void* sym = dlsym(lib, name);
  if (sym == NULL || size != sizeof sym) {
    fprintf(stderr, "dlsym(%s) failed: %s\n", name, dlerror());
    return 0;
  }
  memcpy(fn_ptr_out, &sym, size);
  return 1;
}
#define RESOLVE(field, name) ok &= resolve(lib, name, &api.field, sizeof api.field)

static int load_api(void* lib) {
  int ok = 1;
  RESOLVE(get_version, "lnmlp_get_version");
  RESOLVE(status_string, "lnmlp_status_string");
  RESOLVE(last_error, "lnmlp_last_error");
  RESOLVE(desc_create, "lnmlp_desc_create");
  RESOLVE(desc_destroy, "lnmlp_desc_destroy");
  RESOLVE(desc_set_shape, "lnmlp_desc_set_shape");
  RESOLVE(desc_set_norm, "lnmlp_desc_set_norm");
  RESOLVE(desc_set_dtype, "lnmlp_desc_set_dtype");
  RESOLVE(desc_set_epsilon, "lnmlp_desc_set_epsilon");
  RESOLVE(desc_set_activations, "lnmlp_desc_set_activations");
  RESOLVE(desc_set_bias, "lnmlp_desc_set_bias");
  RESOLVE(plan_create, "lnmlp_plan_create");
  RESOLVE(plan_destroy, "lnmlp_plan_destroy");
  RESOLVE(plan_get_saved_bytes, "lnmlp_plan_get_saved_bytes");
  RESOLVE(plan_get_alignment, "lnmlp_plan_get_alignment");
  RESOLVE(plan_forward, "lnmlp_plan_forward");
  RESOLVE(plan_backward, "lnmlp_plan_backward");
  return ok;
}

#define CALL(expr)                                                                              \
  do {                                                                                          \
    int32_t st_ = (expr);                                                                       \
    if (st_ != LNMLP_SUCCESS) {                                                                 \
      fprintf(stderr, "%s failed: %s: %s\n", #expr, api.status_string(st_), api.last_error()); \
      goto done;                                                                                \
    }                                                                                           \
  } while (0)

/* ---- the problem and its float64 reference -------------------------------------------------- */
enum { T = 6, H = 16, F = 24 };
static const double EPS = 1e-5;

static double gelu(double x) { /* the tanh approximation, as the library computes it */
  const double c = 0.7978845608028654; /* sqrt(2/pi) */
  return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}
static double gelu_grad(double x) {
  const double c = 0.7978845608028654, u = c * (x + 0.044715 * x * x * x), th = tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

typedef struct {
  float x[T * H], gamma[H], beta[H], w1[H * F], b1[F], w2[F * H], b2[H], dy[T * H];
} inputs;
typedef struct {
  double y[T * H], dx[T * H], dgamma[H], dbeta[H], dw1[H * F], db1[F], dw2[F * H], db2[H];
} results;

/* y = gelu(layernorm(x) @ W1 + b1) @ W2 + b2 and every gradient, in plain loops. */
static void reference(const inputs* in, results* r) {
  static double xhat[T][H], rs[T], h[T][F], a[T][F], dh[T][F], dn[T][H];
  int t, i, j;
  memset(r, 0, sizeof *r);
  for (t = 0; t < T; ++t) {
    double mu = 0, var = 0;
    for (i = 0; i < H; ++i) mu += in->x[t * H + i];
    mu /= H;
    for (i = 0; i < H; ++i) var += (in->x[t * H + i] - mu) * (in->x[t * H + i] - mu);
    rs[t] = 1.0 / sqrt(var / H + EPS);
    for (i = 0; i < H; ++i) xhat[t][i] = (in->x[t * H + i] - mu) * rs[t];
    for (j = 0; j < F; ++j) {
      h[t][j] = in->b1[j];
      for (i = 0; i < H; ++i) h[t][j] += (xhat[t][i] * in->gamma[i] + in->beta[i]) * in->w1[i * F + j];
      a[t][j] = gelu(h[t][j]);
    }
    for (i = 0; i < H; ++i) {
      r->y[t * H + i] = in->b2[i];
      for (j = 0; j < F; ++j) r->y[t * H + i] += a[t][j] * in->w2[j * H + i];
    }
  }
  for (t = 0; t < T; ++t) {
    for (i = 0; i < H; ++i) r->db2[i] += in->dy[t * H + i];
    for (j = 0; j < F; ++j) {
      double da = 0;
      for (i = 0; i < H; ++i) {
        r->dw2[j * H + i] += a[t][j] * in->dy[t * H + i];
        da += in->dy[t * H + i] * in->w2[j * H + i];
      }
      dh[t][j] = da * gelu_grad(h[t][j]);
      r->db1[j] += dh[t][j];
    }
    for (i = 0; i < H; ++i) {
      dn[t][i] = 0;
      for (j = 0; j < F; ++j) {
        r->dw1[i * F + j] += (xhat[t][i] * in->gamma[i] + in->beta[i]) * dh[t][j];
        dn[t][i] += dh[t][j] * in->w1[i * F + j];
      }
      r->dgamma[i] += dn[t][i] * xhat[t][i];
      r->dbeta[i] += dn[t][i];
    }
    { /* dx = rs * (g*dn - mean(g*dn) - xhat * mean(g*dn*xhat)) */
      double m1 = 0, m2 = 0;
      for (i = 0; i < H; ++i) {
        m1 += dn[t][i] * in->gamma[i];
        m2 += dn[t][i] * in->gamma[i] * xhat[t][i];
      }
      m1 /= H;
      m2 /= H;
      for (i = 0; i < H; ++i) r->dx[t * H + i] = rs[t] * (dn[t][i] * in->gamma[i] - m1 - xhat[t][i] * m2);
    }
  }
}

/* Largest |got - want| / (1 + |want|) over n values; reports and counts a mismatch. */
static int compare(const char* name, const float* got, const double* want, int n) {
  double worst = 0;
  int k;
  for (k = 0; k < n; ++k) {
    double e = fabs((double)got[k] - want[k]) / (1.0 + fabs(want[k]));
    if (!(e <= worst)) worst = e; /* NaN-safe: a NaN makes worst NaN */
  }
  printf("  %-7s max rel. error %.2e  %s\n", name, worst, worst <= 1e-4 ? "ok" : "MISMATCH");
  return worst <= 1e-4 ? 0 : 1;
}

static float lcg(unsigned* s) { /* deterministic inputs in [-1, 1) without rand()'s variation */
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : getenv("LNMLP_LIBRARY");
  void* lib;
  int32_t major = 0, minor = 0, patch = 0, abi = 0;
  const int32_t act = LNMLP_ACT_GELU;
  lnmlp_desc* desc = NULL;
  lnmlp_plan* plan = NULL;
  int64_t saved_bytes = 0, align = 0;
  void* saved = NULL;
  static inputs in;
  static results want;
  static float y[T * H], dx[T * H], dgamma[H], dbeta[H], dw1[H * F], db1[F], dw2[F * H], db2[H];
  int k, bad = 1; /* pessimistic until the end */
  unsigned seed = 12345u;

  if (path == NULL || path[0] == '\0') path = "liblnmlp.so.2";
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "dlopen(%s) failed: %s\n", path, dlerror());
    return 1;
  }
  if (!load_api(lib)) goto close_lib;

  /* Refuse a library of another ABI before calling anything else in it. */
  if (api.get_version(&major, &minor, &patch, &abi) != LNMLP_SUCCESS || abi != LNMLP_ABI_VERSION) {
    fprintf(stderr, "%s has ABI version %d, but this program was compiled for ABI %d: refusing it\n",
            path, (int)abi, LNMLP_ABI_VERSION);
    goto close_lib;
  }
  printf("loaded %s: lnmlp %d.%d.%d, ABI %d\n", path, (int)major, (int)minor, (int)patch, (int)abi);

  for (k = 0; k < T * H; ++k) in.x[k] = 2.0f * lcg(&seed), in.dy[k] = lcg(&seed);
  for (k = 0; k < H; ++k) in.gamma[k] = 1.0f + 0.25f * lcg(&seed), in.beta[k] = 0.1f * lcg(&seed);
  for (k = 0; k < H; ++k) in.b2[k] = 0.1f * lcg(&seed);
  for (k = 0; k < H * F; ++k) in.w1[k] = 0.3f * lcg(&seed);
  for (k = 0; k < F * H; ++k) in.w2[k] = 0.3f * lcg(&seed);
  for (k = 0; k < F; ++k) in.b1[k] = 0.1f * lcg(&seed);

  CALL(api.desc_create(&desc));
  CALL(api.desc_set_shape(desc, T, H, F));
  CALL(api.desc_set_norm(desc, LNMLP_NORM_LAYERNORM));
  CALL(api.desc_set_epsilon(desc, (float)EPS));
  CALL(api.desc_set_activations(desc, 1, &act));
  CALL(api.desc_set_bias(desc, 1, 1));
  CALL(api.desc_set_dtype(desc, LNMLP_DTYPE_F32));
  CALL(api.plan_create(desc, &plan));
  CALL(api.plan_get_saved_bytes(plan, &saved_bytes));
  CALL(api.plan_get_alignment(plan, &align));

  /* The saved buffer must be aligned as the plan says; over-allocate and round up (C99 has no
   * aligned_alloc). */
  saved = malloc((size_t)(saved_bytes + align));
  if (saved == NULL) goto done;
  {
    unsigned char* p = (unsigned char*)saved;
    unsigned char* aligned = p + ((size_t)align - (size_t)((uintptr_t)p % (size_t)align)) % (size_t)align;
    /* All T tokens (a call may take 0 .. T); fp8_state NULL (no FP8 recipe), flags 0, stream NULL. */
    CALL(api.plan_forward(plan, T, in.x, in.gamma, in.beta, in.w1, in.b1, in.w2, in.b2, y, aligned, NULL,
                          LNMLP_CALL_DEFAULT, NULL));
    CALL(api.plan_backward(plan, T, in.dy, in.x, in.gamma, in.beta, in.w1, in.b1, in.w2, aligned, dx, dgamma, dbeta,
                           dw1, db1, dw2, db2, NULL, LNMLP_CALL_DEFAULT, NULL));
  }

  reference(&in, &want);
  printf("T=%d H=%d F=%d layernorm, gelu, biases, f32; saved %lld bytes; against a float64 reference:\n",
         T, H, F, (long long)saved_bytes);
  bad = compare("y", y, want.y, T * H) + compare("dx", dx, want.dx, T * H) +
        compare("dgamma", dgamma, want.dgamma, H) + compare("dbeta", dbeta, want.dbeta, H) +
        compare("dW1", dw1, want.dw1, H * F) + compare("db1", db1, want.db1, F) +
        compare("dW2", dw2, want.dw2, F * H) + compare("db2", db2, want.db2, H);
  printf("%s\n", bad ? "FAILED" : "PASSED");

done:
  free(saved);
  if (plan != NULL) api.plan_destroy(plan);
  if (desc != NULL) api.desc_destroy(desc);
close_lib:
  dlclose(lib);
  return bad ? 1 : 0;
}
