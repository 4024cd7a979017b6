#include "error.h"

#include <cstdio>

namespace lnmlp {
namespace {
// A fixed buffer: recording an error never allocates, so it cannot fail while reporting an
// out-of-memory condition.
constexpr size_t kMaxMessage = 1024;
thread_local char t_last_error[kMaxMessage] = "";
}  // namespace

void set_last_error(const char* function, const char* message) noexcept {
  std::snprintf(t_last_error, kMaxMessage, "%s: %s", function, message);
}

const char* last_error() noexcept { return t_last_error; }

}  // namespace lnmlp
