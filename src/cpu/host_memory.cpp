#include "host_memory.h"

#include <cstdlib>

#include "common/error.h"
#include "plan/layout.h"

namespace lnmlp::cpu {

void* allocate_host(int64_t bytes) {
  const int64_t padded = padded_region_bytes(bytes, "the workspace");
  void* p = std::aligned_alloc(kRegionAlign, static_cast<size_t>(padded));
  if (p == nullptr) fail(LNMLP_ERROR_OUT_OF_MEMORY, "could not allocate ", bytes, " bytes of workspace");
  return p;
}

void release_host(void* p) noexcept { std::free(p); }

}  // namespace lnmlp::cpu
