#include "fork_child.h"

#include <pthread.h>

#include <atomic>

namespace lnmlp::cpu {
namespace {

std::atomic<bool> forked{false};

void note_fork_child() { forked.store(true, std::memory_order_relaxed); }

// Registered when the library loads; glibc drops the handler again if the library is dlclose'd.
[[maybe_unused]] const int registered = pthread_atfork(nullptr, nullptr, note_fork_child);

}  // namespace

bool in_forked_child() noexcept { return forked.load(std::memory_order_relaxed); }

}  // namespace lnmlp::cpu
