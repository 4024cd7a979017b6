// The module's one exported symbol: the C function table of cuda_module.h. Each entry runs the
// C++ backend inside a guard that turns every exception into a status and a message, so nothing
// C++ crosses into the core library.
#include <cstring>
#include <new>

#include "../cuda_module.h"
#include "../error.h"
#include "cuda_backend.h"

struct lnmlp_cuda_backend {
  std::unique_ptr<lnmlp::Backend> impl;
};

namespace {

void write_message(char* msg, int64_t cap, const char* text) noexcept {
  if (msg == nullptr || cap <= 0) return;
  const size_t n = std::strlen(text);
  const size_t k = n < static_cast<size_t>(cap - 1) ? n : static_cast<size_t>(cap - 1);
  std::memcpy(msg, text, k);
  msg[k] = '\0';
}

template <typename Fn> int32_t guard(char* msg, int64_t cap, Fn&& fn) noexcept {
  try {
    fn();
    return LNMLP_SUCCESS;
  } catch (const lnmlp::Error& e) {
    write_message(msg, cap, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    write_message(msg, cap, "out of host memory in the CUDA backend");
    return LNMLP_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    write_message(msg, cap, e.what());
    return LNMLP_ERROR_INTERNAL;
  } catch (...) {
    write_message(msg, cap, "internal error in the CUDA backend: unknown exception");
    return LNMLP_ERROR_INTERNAL;
  }
}

int32_t probe(int32_t* count, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *count = lnmlp::cuda::device_count(); });
}

int32_t create(const lnmlp::Config* cfg, const lnmlp::SavedLayout* saved, lnmlp_cuda_backend** out, char* msg,
               int64_t cap) {
  return guard(msg, cap, [&] {
    auto b = std::make_unique<lnmlp_cuda_backend>();
    b->impl = lnmlp::cuda::make_cuda_backend(*cfg, *saved);
    *out = b.release();
  });
}

void destroy(lnmlp_cuda_backend* b) { delete b; }

int32_t workspace_bytes(const lnmlp_cuda_backend* b, int64_t* v, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *v = b->impl->workspace_bytes(); });
}

int32_t alignment(const lnmlp_cuda_backend* b, int64_t* v, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *v = b->impl->alignment(); });
}

int32_t forward(lnmlp_cuda_backend* b, const lnmlp::ForwardArgs* a, void* ws, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl->forward(*a, ws); });
}

int32_t backward(lnmlp_cuda_backend* b, const lnmlp::BackwardArgs* a, void* ws, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl->backward(*a, ws); });
}

int32_t allocate(lnmlp_cuda_backend* b, int64_t bytes, void** out, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *out = b->impl->allocate(bytes); });
}

int32_t release(lnmlp_cuda_backend* b, void* p) {
  b->impl->release(p);
  return LNMLP_SUCCESS;
}

int32_t copy_to_host(lnmlp_cuda_backend* b, void* dst, const void* src, int64_t n, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl->copy_to_host(dst, src, n); });
}

int32_t copy_from_host(lnmlp_cuda_backend* b, void* dst, const void* src, int64_t n, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl->copy_from_host(dst, src, n); });
}

const lnmlp_cuda_module_table kTable = {
    LNMLP_CUDA_MODULE_ABI,
    static_cast<int64_t>(sizeof(lnmlp::Config)),
    static_cast<int64_t>(sizeof(lnmlp::SavedLayout)),
    static_cast<int64_t>(sizeof(lnmlp::ForwardArgs) + sizeof(lnmlp::BackwardArgs)),
    probe,
    create,
    destroy,
    workspace_bytes,
    alignment,
    forward,
    backward,
    allocate,
    release,
    copy_to_host,
    copy_from_host,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const lnmlp_cuda_module_table* lnmlp_cuda_module_v1(void) {
  return &kTable;
}
