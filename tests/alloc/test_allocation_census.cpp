// The fault-injection census of a plan's calls on a token count it has already prepared: for each
// call -- the first forward and backward after plan creation, a repeated forward and backward,
// the FP8 state's export and import -- and for every k, the k-th heap allocation of the call fails
// (alloc_counter.c). Each k runs in a child process (a crash would be a finding, not the end of the
// census). Every run must end SUCCESS or OUT_OF_MEMORY; after OUT_OF_MEMORY the FP8 state is as it
// was, and the same call made again succeeds with the bits of a plan that never failed. Plans with
// no recipe, delayed, current and MXFP8 scaling; CTest runs it natively and with oneDNN held to
// AVX2 (whose sgemm driver allocates its packing buffers in every call). Two kinds of prepared
// count: the plan's maximum, and a smaller count named by lnmlp_desc_set_prepared_tokens, whose
// first forward and backward are the calls that would otherwise make its GEMMs.
//
// Not here: a call with a token count the plan has not prepared, and plan creation. Both create
// oneDNN primitives, and oneDNN's objects are allocated by an operator new that returns NULL
// unchecked when malloc fails (its c_compatible::operator new), so a failure there can crash
// inside oneDNN (the header says which calls may allocate).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fp32_plan.h"
#include "lnmlp.h"

extern "C" void alloc_counter_arm(void);
extern "C" void alloc_counter_disarm(long* count, long* bytes, long* largest);
extern "C" long alloc_counter_fail_nth(long n);

namespace {

constexpr int64_t kTokens = 64, kHidden = 32, kFfn = 48;

// The calls' token count: the plan's maximum, or a smaller one the plan was asked to prepare.
struct Count {
  int64_t tokens;
  std::vector<int64_t> prepared;
  const char* name;
};
const Count kMaximum{kTokens, {}, "maximum"};
const Count kPrepared{40, {40}, "prepared"};

// A census plan: an Fp32Plan with its FP8 state's export blob.
struct Plan : Fp32Plan {
  std::vector<unsigned char> blob;

  Plan(int32_t recipe, const Count& count) : Fp32Plan(count.tokens, kHidden, kFfn, recipe, kTokens, count.prepared) {
    int64_t bytes = 0;
    lnmlp_plan_get_state_bytes(plan, &bytes);
    blob.resize(static_cast<size_t>(bytes));
  }
  int32_t export_state() {
    return blob.empty() ? LNMLP_SUCCESS : lnmlp_plan_export_state(plan, blob.data(), static_cast<int64_t>(blob.size()));
  }
  int32_t import_state() {
    return blob.empty() ? LNMLP_SUCCESS : lnmlp_plan_import_state(plan, blob.data(), static_cast<int64_t>(blob.size()));
  }
  // The FP8 state as bytes (the export blob).
  std::string state() {
    std::string s(blob.size(), '\0');
    if (!s.empty()) lnmlp_plan_export_state(plan, &s[0], static_cast<int64_t>(s.size()));
    return s;
  }
};

enum Call { kFirstForward, kFirstBackward, kForward, kBackward, kExport, kImport, kCalls };
const char* const kCallNames[kCalls] = {"first forward",     "first backward", "repeated forward",
                                        "repeated backward", "state export",   "state import"};

// The calls that come before call c on its plan.
int32_t prefix(Plan& p, int c) {
  int32_t s = LNMLP_SUCCESS;
  switch (c) {
    case kFirstForward: break;
    case kFirstBackward: s |= p.forward(); break;
    case kForward:
    case kExport: s |= p.forward() | p.backward(); break;
    case kBackward: s |= p.forward() | p.backward() | p.forward(); break;
    default: s |= p.forward() | p.backward() | p.export_state(); break;
  }
  return s;
}

// Call c itself.
int32_t run(Plan& p, int c) {
  switch (c) {
    case kFirstForward:
    case kForward: return p.forward();
    case kFirstBackward:
    case kBackward: return p.backward();
    case kExport: return p.export_state();
    default: return p.import_state();
  }
}

// Exit codes of a child.
enum Outcome { kSucceeded = 1, kOutOfMemory = 2, kPastTheEnd = 3, kWrong = 4 };

// Child: fail the k-th allocation of call c, then check.
int child(int32_t recipe, const Count& tokens, int c, long k, const std::vector<float>& want_outputs,
          const std::string& want_state) {
  Plan p(recipe, tokens);
  if (prefix(p, c) != LNMLP_SUCCESS) return kWrong;
  const std::string before = p.state();
  alloc_counter_fail_nth(k);
  alloc_counter_arm();
  const int32_t status = run(p, c);
  long count = 0, bytes = 0, largest = 0;
  alloc_counter_disarm(&count, &bytes, &largest);
  const long failed = alloc_counter_fail_nth(0);
  if (failed == 0) return status == LNMLP_SUCCESS ? kPastTheEnd : kWrong;
  if (status != LNMLP_SUCCESS && status != LNMLP_ERROR_OUT_OF_MEMORY) {
    std::printf("  %s, allocation %ld failed: %s (%s)\n", kCallNames[c], k, lnmlp_status_string(status),
                lnmlp_last_error());
    return kWrong;
  }
  if (status == LNMLP_ERROR_OUT_OF_MEMORY) {
    if (p.state() != before) {
      std::printf("  %s, allocation %ld failed: OUT_OF_MEMORY changed the FP8 state\n", kCallNames[c], k);
      return kWrong;
    }
    if (run(p, c) != LNMLP_SUCCESS) {
      std::printf("  %s, allocation %ld failed: the call made again fails: %s\n", kCallNames[c], k, lnmlp_last_error());
      return kWrong;
    }
  }
  if (p.outputs() != want_outputs || p.state() != want_state) {
    std::printf("  %s, allocation %ld failed (%s): results differ from a plan that never failed\n", kCallNames[c], k,
                lnmlp_status_string(status));
    return kWrong;
  }
  return status == LNMLP_SUCCESS ? kSucceeded : kOutOfMemory;
}

// The census of `calls` calls (the first ones of Call) at one token count.
int census(int32_t recipe, const Count& count, int calls) {
  int failures = 0;
  for (int c = 0; c < calls; ++c) {
    Plan clean(recipe, count);
    prefix(clean, c);
    run(clean, c);
    const std::vector<float> want_outputs = clean.outputs();
    const std::string want_state = clean.state();
    long tried = 0, succeeded = 0, oom = 0;
    for (long k = 1;; ++k) {
      std::fflush(stdout);
      const pid_t pid = fork();
      if (pid == 0) _exit(child(recipe, count, c, k, want_outputs, want_state));
      int ws = 0;
      waitpid(pid, &ws, 0);
      if (WIFSIGNALED(ws)) {
        std::printf("  FAILED: %s, allocation %ld failed: the process died of signal %d\n", kCallNames[c], k,
                    WTERMSIG(ws));
        ++failures;
        continue;
      }
      const int outcome = WEXITSTATUS(ws);
      if (outcome == kPastTheEnd) break;
      ++tried;
      if (outcome == kSucceeded) ++succeeded;
      if (outcome == kOutOfMemory) ++oom;
      if (outcome == kWrong) ++failures;
      if (k > 100000) {
        std::printf("  FAILED: %s makes more than 100000 allocations\n", kCallNames[c]);
        ++failures;
        break;
      }
    }
    std::printf(
        "recipe %d, %-8s count, %-17s: %3ld allocation points, %3ld OUT_OF_MEMORY, %3ld SUCCESS (the failure "
        "absorbed)\n",
        recipe, count.name, kCallNames[c], tried, oom, succeeded);
  }
  return failures;
}

}  // namespace

int main() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* info = nullptr;
  lnmlp_get_build_info(&info);
  std::printf("%s\n", info);
  int failures = 0;
  for (int32_t recipe : {LNMLP_RECIPE_NONE, LNMLP_RECIPE_DELAYED, LNMLP_RECIPE_CURRENT, LNMLP_RECIPE_MXFP8}) {
    failures += census(recipe, kMaximum, kCalls);
    failures += census(recipe, kPrepared, kFirstBackward + 1);
  }
  std::printf("%s\n", failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
