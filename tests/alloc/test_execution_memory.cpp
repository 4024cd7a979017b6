// Execution allocates no memory that grows with the problem: after a warm-up call, forward and
// backward run with a malloc interposer armed (alloc_counter.c) for every dtype and remat policy
// and every FP8 recipe, and the heap allocations of the whole process during those calls are
// counted, at T tokens and at 4T; and a call flagged LNMLP_CALL_WEIGHTS_UNCHANGED after an unflagged
// warm-up, which makes the plan's packed copies of the weights where the CPU backend keeps them.
//
// lnmlp's own code allocates nothing while executing. oneDNN's matmul execute does build a small
// argument map per call (a few dozen bytes; seen with backtraces from this interposer), and the
// OpenMP runtime may resize its team bookkeeping; neither can be turned off. Below AVX-512 (e.g. on
// AMD Zen 3) oneDNN 2.x's f32 matmul is its sgemm driver, which mallocs its packing buffers on every
// call, sized by its blocking and the weights' dimensions; the library's build info says so
// ("per-call heap buffers"). So the test bounds what matters to a user: nothing allocated depends
// on the number of tokens (the same allocations at T and 4T), and without the sgemm driver, no
// allocation that could be tensor or workspace memory (largest <= kMaxSingle) and a small total
// (<= kMaxTotal per forward + backward).
#include <cstdio>
#include <cstring>
#include <vector>

#include "lnmlp.h"

extern "C" void alloc_counter_arm(void);
extern "C" void alloc_counter_disarm(long* count, long* bytes, long* largest);

namespace {

constexpr long kMaxSingle = 4096;
constexpr long kMaxTotal = 64 * 1024;

struct Allocations {
  bool ok = false;
  long count = 0, bytes = 0, largest = 0;
};

Allocations measure(int64_t T, int32_t dtype, int32_t remat, int32_t threads, int32_t recipe, int32_t flags) {
  const int64_t H = 64, F = 80;
  const int32_t acts[2] = {LNMLP_ACT_SILU, LNMLP_ACT_LINEAR};
  lnmlp_desc* d = nullptr;
  lnmlp_plan* p = nullptr;
  lnmlp_desc_create(&d);
  lnmlp_desc_set_shape(d, T, H, F);
  lnmlp_desc_set_activations(d, 2, acts);
  lnmlp_desc_set_bias(d, 1, 1);
  lnmlp_desc_set_dtype(d, dtype);
  lnmlp_desc_set_remat(d, remat);
  lnmlp_desc_set_num_threads(d, threads);
  lnmlp_desc_set_recipe(d, recipe);
  if (lnmlp_plan_create(d, &p) != LNMLP_SUCCESS) {
    std::printf("plan_create failed: %s\n", lnmlp_last_error());
    return {};
  }
  lnmlp_desc_destroy(d);
  int64_t saved_bytes = 0;
  lnmlp_plan_get_saved_bytes(p, &saved_bytes);
  const size_t e = dtype == LNMLP_DTYPE_F32 ? 4 : 2;
  // Small values, valid in every dtype; the content does not matter here.
  auto buf = [&](size_t n) { return std::vector<unsigned char>(n * e, 0x3c); };
  auto x = buf(T * H), g = buf(H), b = buf(H), w1 = buf(H * 2 * F), b1 = buf(2 * F), w2 = buf(F * H), b2 = buf(H);
  auto y = buf(T * H), dy = buf(T * H), dx = buf(T * H), dg = buf(H), dbeta = buf(H), dw1 = buf(H * 2 * F),
       db1 = buf(2 * F), dw2 = buf(F * H), db2 = buf(H);
  std::vector<unsigned char> saved_store(static_cast<size_t>(saved_bytes) + 64);
  void* saved = saved_store.data() + (64 - reinterpret_cast<uintptr_t>(saved_store.data()) % 64) % 64;
  auto step = [&](int32_t call_flags) {
    int32_t s1 = lnmlp_plan_forward(p, T, x.data(), g.data(), b.data(), w1.data(), b1.data(), w2.data(), b2.data(),
                                    y.data(), saved, nullptr, call_flags, nullptr);
    int32_t s2 = lnmlp_plan_backward(p, T, dy.data(), x.data(), g.data(), b.data(), w1.data(), b1.data(), w2.data(),
                                     saved, dx.data(), dg.data(), dbeta.data(), dw1.data(), db1.data(), dw2.data(),
                                     db2.data(), nullptr, call_flags, nullptr);
    return s1 == LNMLP_SUCCESS && s2 == LNMLP_SUCCESS;
  };
  Allocations a;
  a.ok = step(LNMLP_CALL_DEFAULT);  // warm-up: first-call initialisation of the GEMM library and the thread pool
  alloc_counter_arm();
  a.ok = step(flags) && a.ok;
  alloc_counter_disarm(&a.count, &a.bytes, &a.largest);
  lnmlp_plan_destroy(p);
  return a;
}

bool gemm_packs_on_the_heap() {
  const char* info = nullptr;
  return lnmlp_get_build_info(&info) == LNMLP_SUCCESS && std::strstr(info, "per-call heap buffers") != nullptr;
}

bool run_case(int32_t dtype, int32_t remat, int32_t threads, int32_t recipe, int32_t flags = LNMLP_CALL_DEFAULT) {
  const Allocations a = measure(96, dtype, remat, threads, recipe, flags),
                    b = measure(384, dtype, remat, threads, recipe, flags);
  std::printf(
      "dtype %d remat %d threads %d recipe %d flags %d: %ld allocations, %ld bytes, largest %ld (4x the tokens: %ld, "
      "%ld, %ld)\n",
      dtype, remat, threads, recipe, flags, a.count, a.bytes, a.largest, b.count, b.bytes, b.largest);
  const bool independent_of_tokens = a.count == b.count && a.bytes == b.bytes && a.largest == b.largest;
  const bool small = gemm_packs_on_the_heap() || (a.largest <= kMaxSingle && a.bytes <= kMaxTotal);
  return a.ok && b.ok && independent_of_tokens && small;
}

}  // namespace

int main() {
  int passed = 0, failed = 0;
  for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
    for (int32_t remat : {LNMLP_REMAT_SAVE_ALL, LNMLP_REMAT_SAVE_FFN1, LNMLP_REMAT_SAVE_STATS})
      for (int32_t threads : {1, 2}) (run_case(dtype, remat, threads, LNMLP_RECIPE_NONE) ? passed : failed)++;
  // The first flagged call: it packs the weights (packed_b_bytes, src/cpu/gemm.h) on AVX-512 CPUs.
  for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16})
    for (int32_t threads : {1, 2})
      (run_case(dtype, LNMLP_REMAT_SAVE_ALL, threads, LNMLP_RECIPE_NONE, LNMLP_CALL_WEIGHTS_UNCHANGED) ? passed
                                                                                                       : failed)++;
  // Every FP8 recipe, each dtype once (remat and threads rotating).
  int i = 0;
  for (int32_t recipe : {LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_BLOCK, LNMLP_RECIPE_MXFP8})
    for (int32_t dtype : {LNMLP_DTYPE_F32, LNMLP_DTYPE_BF16, LNMLP_DTYPE_F16}) {
      (run_case(dtype, i % 3, 1 + i % 2, recipe) ? passed : failed)++;
      ++i;
    }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
