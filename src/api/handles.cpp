#include "handles.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "common/error.h"

namespace lnmlp {
namespace {

const char* kind_name(const lnmlp_desc*) { return "descriptor"; }
const char* kind_name(const lnmlp_plan*) { return "plan"; }
const char* kind_name(const lnmlp_comm*) { return "communicator"; }

// Outside the registry, so that a registry made again after release_registry_if_empty() never
// hands out an old handle's number.
std::atomic<uint64_t> next_serial{1};

struct Registry {
  std::mutex mutex;
  std::unordered_map<uintptr_t, std::shared_ptr<lnmlp_desc>> descs;
  std::unordered_map<uintptr_t, std::shared_ptr<lnmlp_plan>> plans;
  std::unordered_map<uintptr_t, std::shared_ptr<lnmlp_comm>> comms;

  auto& table(const lnmlp_desc*) { return descs; }
  auto& table(const lnmlp_plan*) { return plans; }
  auto& table(const lnmlp_comm*) { return comms; }
  bool empty() const { return descs.empty() && plans.empty() && comms.empty(); }
};

// Made on first use, freed only by release_registry_if_empty(): while handles live, their objects
// may still be released during exit, after static destructors.
std::atomic<Registry*> the_registry{nullptr};

Registry& registry() {
  Registry* r = the_registry.load(std::memory_order_acquire);
  if (r != nullptr) return *r;
  auto* made = new Registry;
  if (the_registry.compare_exchange_strong(r, made, std::memory_order_acq_rel)) return *made;
  delete made;  // another thread made it first
  return *r;
}

[[noreturn]] void invalid(const char* kind, const void* p) {
  fail(LNMLP_ERROR_INVALID_HANDLE, kind, " ", p,
       " is not a live handle (already destroyed, or never created by lnmlp)");
}

uintptr_t key(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }

}  // namespace

template <typename T> T* register_handle(std::unique_ptr<T> object) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  // Serial * 16 + 8: never 0 (NULL), never reused, and never a plausible object address.
  const uintptr_t token = static_cast<uintptr_t>(next_serial++) * 16 + 8;
  r.table(static_cast<const T*>(nullptr)).emplace(token, std::shared_ptr<T>(std::move(object)));
  return reinterpret_cast<T*>(token);  // NOLINT(performance-no-int-to-ptr): a token, never dereferenced
}

template <typename T> std::shared_ptr<T> lookup_handle(const T* handle, const char* name) {
  if (handle == nullptr) fail(LNMLP_ERROR_NULL_POINTER, name, " is NULL");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& t = r.table(handle);
  const auto it = t.find(key(handle));
  if (it == t.end()) invalid(kind_name(handle), handle);
  return it->second;
}

template <typename T> void unregister_handle(const T* handle) {
  std::shared_ptr<T> last;  // freed after the lock is released
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto& t = r.table(handle);
  const auto it = t.find(key(handle));
  if (it == t.end()) invalid(kind_name(handle), handle);
  last = std::move(it->second);
  t.erase(it);
}

void unregister_plan(const lnmlp_plan* handle) {
  std::shared_ptr<lnmlp_plan> last;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.plans.find(key(handle));
    if (it == r.plans.end()) invalid("plan", handle);
    if (it->second->busy.load())
      fail(LNMLP_ERROR_PLAN_BUSY, "the plan is running on another thread; destroy it after that call returns");
    last = std::move(it->second);
    r.plans.erase(it);
  }
}

template lnmlp_desc* register_handle(std::unique_ptr<lnmlp_desc>);
template lnmlp_plan* register_handle(std::unique_ptr<lnmlp_plan>);
template lnmlp_comm* register_handle(std::unique_ptr<lnmlp_comm>);
template std::shared_ptr<lnmlp_desc> lookup_handle(const lnmlp_desc*, const char*);
template std::shared_ptr<lnmlp_plan> lookup_handle(const lnmlp_plan*, const char*);
template std::shared_ptr<lnmlp_comm> lookup_handle(const lnmlp_comm*, const char*);
template void unregister_handle(const lnmlp_desc*);
template void unregister_handle(const lnmlp_comm*);

bool release_registry_if_empty() noexcept {
  Registry* r = the_registry.load(std::memory_order_acquire);
  if (r == nullptr) return true;
  {
    std::lock_guard<std::mutex> lock(r->mutex);
    if (!r->empty()) return false;
  }
  the_registry.store(nullptr, std::memory_order_release);
  delete r;
  return true;
}

void PlanUse::mark_busy() {
  bool expected = false;
  if (!plan_->busy.compare_exchange_strong(expected, true))
    fail(LNMLP_ERROR_PLAN_BUSY, "the plan is in use by another thread; a plan runs on one thread at a time");
}

PlanUse::~PlanUse() { plan_->busy.store(false); }

}  // namespace lnmlp
