// A registry of live descriptors and plans, so that a destroyed or foreign handle is reported as
// LNMLP_ERROR_INVALID_HANDLE instead of being dereferenced.
#pragma once

#include "plan.h"

namespace lnmlp {

void register_desc(lnmlp_desc* d);
// Removes d from the registry; throws INVALID_HANDLE if it is not live.
void unregister_desc(const lnmlp_desc* d);
// Throws NULL_POINTER / INVALID_HANDLE unless d is a live descriptor.
void require_desc(const lnmlp_desc* d, const char* name = "desc");

void register_plan(lnmlp_plan* p);
// Removes p from the registry; throws INVALID_HANDLE if it is not live, PLAN_BUSY if it is running.
void unregister_plan(const lnmlp_plan* p);
void require_plan(const lnmlp_plan* p);

void register_comm(lnmlp_comm* c);
void unregister_comm(const lnmlp_comm* c);
void require_comm(const lnmlp_comm* c);

// Marks a live plan busy for the lifetime of the guard; throws PLAN_BUSY if another thread holds it.
class PlanUse {
 public:
  explicit PlanUse(lnmlp_plan* p);
  ~PlanUse();
  PlanUse(const PlanUse&) = delete;
  PlanUse& operator=(const PlanUse&) = delete;

 private:
  lnmlp_plan* plan_;
};

}  // namespace lnmlp
