// Memory pressure during execution: with oneDNN held to AVX2, its f32 matmul is the sgemm driver,
// which mallocs its packing buffers in every call (as on AMD Zen 3); a malloc interposer
// (alloc_counter.c) makes every allocation above 4 KiB fail while armed. A forward or backward
// that meets such a failure must return LNMLP_ERROR_OUT_OF_MEMORY with a message (it returned
// LNMLP_ERROR_BACKEND), leave the FP8 state as it was, and leave the plan usable: once memory is
// back, the same call gives the bits of a call that never failed, also when it says its weights are
// unchanged (the copies the failed call began are not reused).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fp32_plan.h"
#include "lnmlp.h"

extern "C" void alloc_counter_arm(void);
extern "C" void alloc_counter_disarm(long* count, long* bytes, long* largest);
extern "C" long alloc_counter_fail_above(long n);

namespace {

// Before oneDNN's first use (static initialisation precedes main): its largest ISA is AVX2.
[[maybe_unused]] const int kAvx2Only = setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);

constexpr long kFailAbove =
    4096;  // above what execution allocates besides the sgemm buffers (test_execution_memory.cpp)
constexpr int64_t kTokens = 128, kHidden = 256, kFfn = 512;

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what);
    ++failures;
  }
}

struct Case : Fp32Plan {
  explicit Case(int32_t recipe) : Fp32Plan(kTokens, kHidden, kFfn, recipe) {}
  std::vector<float> state() const {  // every quantizer's scale and history, in order
    int64_t n = 0;
    lnmlp_plan_get_amax_history_length(plan, &n);
    std::vector<float> all;
    for (int32_t q = 0; n > 0 && q < LNMLP_QUANTIZER_COUNT; ++q) {
      std::vector<float> h(static_cast<size_t>(n));
      float scale = 0;
      lnmlp_plan_get_quantizer_state(plan, q, &scale, h.data(), n);
      all.push_back(scale);
      all.insert(all.end(), h.begin(), h.end());
    }
    return all;
  }
};

// Runs call() under memory pressure: it must fail with OUT_OF_MEMORY, because an allocation did.
template <typename Call> void fails_for_memory(const char* name, Call call) {
  alloc_counter_fail_above(kFailAbove);
  alloc_counter_arm();
  const int32_t status = call();
  long count = 0, bytes = 0, largest = 0;
  alloc_counter_disarm(&count, &bytes, &largest);
  const long refused = alloc_counter_fail_above(-1);
  std::printf("%s under memory pressure: %s (%s); %ld allocations above %ld bytes refused\n", name,
              lnmlp_status_string(status), status == LNMLP_SUCCESS ? "" : lnmlp_last_error(), refused, kFailAbove);
  expect(refused > 0, "an allocation was refused (else oneDNN is not on its per-call-buffer path)");
  expect(status == LNMLP_ERROR_OUT_OF_MEMORY, "the call returned LNMLP_ERROR_OUT_OF_MEMORY");
  expect(std::strstr(lnmlp_last_error(), "memory") != nullptr, "the message says memory");
}

void run(int32_t recipe) {
  std::printf("-- recipe %d\n", recipe);
  Case clean(recipe), pressed(recipe);
  // Two forwards then a backward, as `pressed` does between its failures (delayed scaling's state
  // moves with each successful call).
  expect(clean.forward() == LNMLP_SUCCESS && clean.forward() == LNMLP_SUCCESS && clean.backward() == LNMLP_SUCCESS,
         "calls without pressure succeed");
  expect(pressed.forward() == LNMLP_SUCCESS, "the warm-up forward succeeds");  // primitives made
  std::vector<float> state = pressed.state();
  fails_for_memory("forward", [&] { return pressed.forward(); });
  expect(pressed.state() == state, "a failed forward leaves the FP8 state as it was");
  expect(pressed.forward(LNMLP_CALL_WEIGHTS_UNCHANGED) == LNMLP_SUCCESS, "the plan works once memory is back");
  expect(pressed.y == clean.y, "and gives the bits of a plan that never failed");
  state = pressed.state();
  fails_for_memory("backward", [&] { return pressed.backward(); });
  expect(pressed.state() == state, "a failed backward leaves the FP8 state as it was");
  expect(pressed.backward() == LNMLP_SUCCESS, "backward works once memory is back");
  expect(pressed.dx == clean.dx && pressed.dw1 == clean.dw1 && pressed.dw2 == clean.dw2 && pressed.db1 == clean.db1,
         "and gives the gradients of a plan that never failed");
}

}  // namespace

int main() {
  const char* info = nullptr;
  lnmlp_get_build_info(&info);
  if (std::strstr(info, "per-call heap buffers") == nullptr) {
    std::printf("FAILED: ONEDNN_MAX_CPU_ISA=AVX2 did not put oneDNN on its sgemm path: %s\n", info);
    return 1;
  }
  for (int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_DELAYED}) run(recipe);
  std::printf("%s\n", failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
