// The workspace of one pass, handed out region by region in the order the schedule asks for it.
// At plan creation the schedule runs once over a sizing workspace (base NULL: it hands out no
// memory and only counts), so a plan's workspace is exactly what its schedule takes, by
// construction, with no second list of regions to keep in step; at run time the same requests,
// which depend on the configuration only, get the same offsets of the plan's workspace. Forward
// and backward each start at offset 0 (a plan's workspace is the larger of the two). Regions are
// 256-byte aligned (plan/layout.h's RegionAllocator, which also checks the sizes for overflow).
#pragma once

#include <cstdint>

#include "common/error.h"
#include "plan/call_args.h"
#include "plan/layout.h"

namespace lnmlp::block {

class Workspace {
 public:
  // live false: the sizing run (base is then ignored). A live workspace of `capacity` bytes
  // (0 bytes: base may be NULL) refuses a request beyond its end.
  Workspace(void* base, bool live, int64_t capacity = 0)
      : base_(static_cast<char*>(base)), live_(live), capacity_(capacity) {}
  bool live() const { return live_; }

  // count elements of elem_bytes each; NULL while sizing.
  void* take_bytes(int64_t count, int64_t elem_bytes, const char* what) {
    const Region r = alloc_.take(count, elem_bytes, what);
    if (live_ && alloc_.total() > capacity_)
      fail(LNMLP_ERROR_INTERNAL, "the workspace region for ", what, " ends at byte ", alloc_.total(),
           ", beyond the plan's workspace of ", capacity_, " bytes");
    return live_ && base_ != nullptr ? base_ + r.offset : nullptr;
  }
  template <typename T> T* take(int64_t count, const char* what) {
    return static_cast<T*>(take_bytes(count, sizeof(T), what));
  }
  // NULL (and nothing taken) unless cond.
  template <typename T> T* take_if(bool cond, int64_t count, const char* what) {
    return cond ? take<T>(count, what) : nullptr;
  }
  int64_t bytes() const { return alloc_.total(); }

 private:
  char* base_;
  bool live_;
  int64_t capacity_;
  RegionAllocator alloc_;
};

// The region r of a saved (or deferred) buffer, typed; NULL when r is absent or while sizing.
template <typename T> T* saved_at(const Region& r, const SavedBuffer& buffer) {
  return reinterpret_cast<T*>(buffer.at(r));
}

}  // namespace lnmlp::block
