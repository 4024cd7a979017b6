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
// A count the plan has not prepared: its first forward makes its oneDNN primitives, whose objects
// oneDNN allocates with an operator new that returns NULL unchecked when malloc fails (its
// c_compatible::operator new, handed to a constructor), so a failure there can crash the process
// (lnmlp.h says so). Its census counts those crashes -- a child whose SIGSEGV is at an address in
// oneDNN's library -- apart, and holds the rest to the same rules: every other run ends SUCCESS or
// OUT_OF_MEMORY with the plan usable (no poisoned primitive cache: the same call made again
// succeeds with the bits of a plan that never failed), and no crash anywhere else. Plan creation
// makes primitives the same way and gets the same census: it returns SUCCESS (and the plan
// computes right) or OUT_OF_MEMORY (writing no plan; the next creation succeeds and computes right),
// or crashes inside oneDNN.
#include <dlfcn.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucontext.h>
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
  bool makes_gemms;  // the first forward makes the count's GEMMs (so may crash inside oneDNN)
};
const Count kMaximum{kTokens, {}, "maximum", false};
const Count kPrepared{40, {40}, "prepared", false};
const Count kNotPrepared{40, {}, "new", true};

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
enum Outcome { kSucceeded = 1, kOutOfMemory = 2, kPastTheEnd = 3, kWrong = 4, kCrashedInOneDnn = 5 };

// A child's SIGSEGV handler: exits kCrashedInOneDnn where the faulting instruction is in oneDNN's
// library (its unchecked operator new, see the top), else dies of the signal as it would have.
void classify_crash(int sig, siginfo_t*, void* context) {
#if defined(__x86_64__)
  const void* pc = reinterpret_cast<const void*>(static_cast<const ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#else
  const void* pc = nullptr;  // another architecture: every crash is a failure
  (void)context;
#endif
  Dl_info where{};
  if (pc != nullptr && dladdr(pc, &where) != 0 && where.dli_fname != nullptr &&
      std::strstr(where.dli_fname, "libdnnl") != nullptr)
    _exit(kCrashedInOneDnn);
  signal(sig, SIG_DFL);  // returning re-runs the instruction, which now kills the child
}

void classify_crashes() {
  struct sigaction crash {};
  crash.sa_sigaction = classify_crash;
  crash.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &crash, nullptr);
}

// Child: fail the k-th allocation of call c, then check.
int child(int32_t recipe, const Count& tokens, int c, long k, const std::vector<float>& want_outputs,
          const std::string& want_state) {
  classify_crashes();
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

// The plan the creation census makes: kTokens, with kPrepared's count prepared, called with it.
std::vector<float> forward_backward(Plan& p) {
  return p.forward() == LNMLP_SUCCESS && p.backward() == LNMLP_SUCCESS ? p.outputs() : std::vector<float>{};
}

// Child: fail the k-th allocation of lnmlp_plan_create, then check.
int creation_child(int32_t recipe, long k, const std::vector<float>& want_outputs) {
  classify_crashes();
  Plan p(recipe, kPrepared);  // its buffers; its plan is replaced by the one made here
  lnmlp_desc* d = fp32_plan_desc(kTokens, kHidden, kFfn, recipe, kPrepared.prepared);
  lnmlp_plan* const untouched = reinterpret_cast<lnmlp_plan*>(uintptr_t{0x1234});
  lnmlp_plan* made = untouched;
  alloc_counter_fail_nth(k);
  alloc_counter_arm();
  const int32_t status = lnmlp_plan_create(d, &made);
  long count = 0, bytes = 0, largest = 0;
  alloc_counter_disarm(&count, &bytes, &largest);
  const long failed = alloc_counter_fail_nth(0);
  if (status == LNMLP_ERROR_OUT_OF_MEMORY) {
    if (made != untouched) {
      std::printf("  plan creation, allocation %ld failed: OUT_OF_MEMORY wrote *plan\n", k);
      return kWrong;
    }
    if (lnmlp_plan_create(d, &made) != LNMLP_SUCCESS) {
      std::printf("  plan creation, allocation %ld failed: the next creation fails: %s\n", k, lnmlp_last_error());
      return kWrong;
    }
  } else if (status != LNMLP_SUCCESS) {
    std::printf("  plan creation, allocation %ld failed: %s (%s)\n", k, lnmlp_status_string(status),
                lnmlp_last_error());
    return kWrong;
  }
  lnmlp_desc_destroy(d);
  lnmlp_plan_destroy(p.plan);
  p.plan = made;
  if (forward_backward(p) != want_outputs) {
    std::printf(
        "  plan creation, allocation %ld failed (%s): the plan's results differ from a plan that never "
        "failed\n",
        k, lnmlp_status_string(status));
    return kWrong;
  }
  if (failed == 0) return kPastTheEnd;
  return status == LNMLP_SUCCESS ? kSucceeded : kOutOfMemory;
}

// Runs child(k) in a child process for k = 1, 2, ... until a child's call makes fewer than k
// allocations, tallies the outcomes in a line starting with `what`, and returns the failures.
// may_crash_in_onednn: the call makes oneDNN primitives, so a crash inside oneDNN is counted, not
// failed (see the top).
template <typename Child> int sweep(const std::string& what, bool may_crash_in_onednn, Child&& child) {
  int failures = 0;
  long tried = 0, succeeded = 0, oom = 0, in_onednn = 0;
  for (long k = 1;; ++k) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) _exit(child(k));
    int ws = 0;
    waitpid(pid, &ws, 0);
    if (WIFSIGNALED(ws)) {
      std::printf("  FAILED: %s, allocation %ld failed: the process died of signal %d\n", what.c_str(), k,
                  WTERMSIG(ws));
      ++failures;
      continue;
    }
    const int outcome = WEXITSTATUS(ws);
    if (outcome == kPastTheEnd) break;
    ++tried;
    if (outcome == kSucceeded) ++succeeded;
    if (outcome == kOutOfMemory) ++oom;
    if (outcome == kCrashedInOneDnn) {
      ++in_onednn;
      if (!may_crash_in_onednn) {
        std::printf("  FAILED: %s, allocation %ld failed: crashed inside oneDNN in a call that makes no GEMM\n",
                    what.c_str(), k);
        ++failures;
      }
    }
    if (outcome == kWrong) ++failures;
    if (k > 100000) {
      std::printf("  FAILED: %s makes more than 100000 allocations\n", what.c_str());
      ++failures;
      break;
    }
  }
  std::printf(
      "%-45s: %3ld allocation points, %3ld OUT_OF_MEMORY, %3ld SUCCESS (the failure absorbed), %3ld crashed "
      "inside oneDNN\n",
      what.c_str(), tried, oom, succeeded, in_onednn);
  return failures;
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
    const std::string what = "recipe " + std::to_string(recipe) + ", " + count.name + " count, " + kCallNames[c];
    failures += sweep(what, count.makes_gemms && c == kFirstForward,
                      [&](long k) { return child(recipe, count, c, k, want_outputs, want_state); });
  }
  return failures;
}

// The census of plan creation.
int creation_census(int32_t recipe) {
  Plan clean(recipe, kPrepared);
  const std::vector<float> want_outputs = forward_backward(clean);
  return sweep("recipe " + std::to_string(recipe) + ", plan creation", true,
               [&](long k) { return creation_child(recipe, k, want_outputs); });
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
    failures += census(recipe, kNotPrepared, kFirstBackward + 1);
    failures += creation_census(recipe);
  }
  std::printf("%s\n", failures == 0 ? "passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
