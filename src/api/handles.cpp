#include "handles.h"

#include <mutex>
#include <unordered_set>

#include "common/error.h"

namespace lnmlp {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_set<const void*> descs;
  std::unordered_set<const void*> plans;
  std::unordered_set<const void*> comms;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: handles may be released during exit
  return *r;
}

[[noreturn]] void invalid(const char* kind, const void* p) {
  fail(LNMLP_ERROR_INVALID_HANDLE, kind, " ", p,
       " is not a live handle (already destroyed, or never created by lnmlp)");
}

}  // namespace

void register_desc(lnmlp_desc* d) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().descs.insert(d);
}

void unregister_desc(const lnmlp_desc* d) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (registry().descs.erase(d) == 0) invalid("descriptor", d);
}

void require_desc(const lnmlp_desc* d, const char* name) {
  if (d == nullptr) fail(LNMLP_ERROR_NULL_POINTER, name, " is NULL");
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (registry().descs.count(d) == 0) invalid("descriptor", d);
}

void register_plan(lnmlp_plan* p) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().plans.insert(p);
}

void unregister_plan(const lnmlp_plan* p) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (registry().plans.count(p) == 0) invalid("plan", p);
  if (p->busy.load())
    fail(LNMLP_ERROR_PLAN_BUSY, "the plan is running on another thread; destroy it after that call returns");
  registry().plans.erase(p);
}

void require_plan(const lnmlp_plan* p) {
  if (p == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "plan is NULL");
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (registry().plans.count(p) == 0) invalid("plan", p);
}

void register_comm(lnmlp_comm* c) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  registry().comms.insert(c);
}

void unregister_comm(const lnmlp_comm* c) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (registry().comms.erase(c) == 0) invalid("communicator", c);
}

void require_comm(const lnmlp_comm* c) {
  if (c == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "comm is NULL");
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (registry().comms.count(c) == 0) invalid("communicator", c);
}

PlanUse::PlanUse(lnmlp_plan* p) : plan_(p) {
  if (p == nullptr) fail(LNMLP_ERROR_NULL_POINTER, "plan is NULL");
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (registry().plans.count(p) == 0) invalid("plan", p);
  bool expected = false;
  if (!p->busy.compare_exchange_strong(expected, true))
    fail(LNMLP_ERROR_PLAN_BUSY, "the plan is in use by another thread; a plan runs on one thread at a time");
}

PlanUse::~PlanUse() { plan_->busy.store(false); }

}  // namespace lnmlp
