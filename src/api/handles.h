// The handles of descriptors, plans and communicators.
//
// A handle is a token -- a serial number never reused while the process lives -- that a registry
// maps to its object, not the object's address: a destroyed handle can never name a later object
// allocated at the same address (LNMLP_ERROR_INVALID_HANDLE instead). Every API call resolves its
// handles with Held (or PlanUse), which takes shared ownership, so an object destroyed by another
// thread during a call is freed only when that call returns.
#pragma once

#include <memory>

#include "plan.h"

namespace lnmlp {

// A new handle for `object`, which the registry now owns.
template <typename T> T* register_handle(std::unique_ptr<T> object);
// The object behind a live handle; NULL_POINTER for NULL (naming `name`), INVALID_HANDLE otherwise.
template <typename T> std::shared_ptr<T> lookup_handle(const T* handle, const char* name);
// Removes a live handle (INVALID_HANDLE otherwise); the object goes when its last holder lets go.
template <typename T> void unregister_handle(const T* handle);
// As unregister_handle, but PLAN_BUSY while a call is running on the plan.
void unregister_plan(const lnmlp_plan* handle);
// Frees the registry when no handle is live (the library being unloaded: src/api/unload.cpp) and
// says whether it did; a later call makes a new one.
bool release_registry_if_empty() noexcept;

// Resolves one handle for the lifetime of the guard and rebinds the caller's handle variable to
// the object itself, so the rest of the call reads `plan->...` on an object that stays alive.
template <typename T> class Held {
 public:
  template <typename P> Held(P*& handle, const char* name) : object_(lookup_handle<T>(handle, name)) {
    handle = object_.get();
  }
  T* get() const { return object_.get(); }

 private:
  std::shared_ptr<T> object_;
};

// Held for a plan that the call runs or changes: also marks it busy (PLAN_BUSY if another thread
// holds it), since a plan runs on one thread at a time.
class PlanUse {
 public:
  template <typename P> explicit PlanUse(P*& handle) : plan_(lookup_handle<lnmlp_plan>(handle, "plan")) {
    mark_busy();
    handle = plan_.get();
  }
  ~PlanUse();
  PlanUse(const PlanUse&) = delete;
  PlanUse& operator=(const PlanUse&) = delete;

 private:
  void mark_busy();
  std::shared_ptr<lnmlp_plan> plan_;
};

}  // namespace lnmlp
