// The module's one exported symbol: the C function table of module/table.h. Each entry runs the
// CUDA engine (the block schedule over the CUDA primitives, cuda_exec.h) inside a guard that turns
// every exception into a status and a message, so nothing C++ crosses into the core library.
#include <cstring>
#include <new>
#include <string>

#include "block/engine.h"
#include "common/error.h"
#include "cuda_exec.h"
#include "devices.h"
#include "gemm_cublaslt.h"
#include "module/table.h"
#include "nccl_comm.h"

struct lnmlp_cuda_engine {
  lnmlp::block::BlockEngine impl;
};

struct lnmlp_cuda_comm {
  std::unique_ptr<lnmlp::Communicator> impl;
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

int32_t fp8_support(int32_t recipe, int32_t* answer, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *answer = lnmlp::cuda::fp8_support(static_cast<lnmlp::Recipe>(recipe), 0); });
}

int32_t create(const lnmlp::Config* cfg, const lnmlp::SavedLayout* saved, lnmlp_cuda_comm* comm,
               lnmlp_cuda_engine** out, char* msg, int64_t cap) {
  return guard(msg, cap, [&] {
    // The core's communicator pointer means nothing here: the module's own one replaces it.
    lnmlp::Config c = *cfg;
    c.shard.comm = comm != nullptr ? comm->impl.get() : nullptr;
    *out = new lnmlp_cuda_engine{lnmlp::block::BlockEngine(c, *saved, lnmlp::cuda::make_cuda_exec(c))};
  });
}

void destroy(lnmlp_cuda_engine* b) { delete b; }

int32_t workspace_bytes(const lnmlp_cuda_engine* b, int64_t* v, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *v = b->impl.workspace_bytes(); });
}

int32_t alignment(const lnmlp_cuda_engine* b, int64_t* v, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *v = b->impl.alignment(); });
}

int32_t forward(lnmlp_cuda_engine* b, const lnmlp::ForwardArgs* a, void* ws, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl.forward(*a, ws); });
}

int32_t backward(lnmlp_cuda_engine* b, const lnmlp::BackwardArgs* a, void* ws, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl.backward(*a, ws); });
}

int32_t allocate(lnmlp_cuda_engine* b, int64_t bytes, void** out, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { *out = b->impl.allocate(bytes); });
}

int32_t release(lnmlp_cuda_engine* b, void* p) {
  b->impl.release(p);
  return LNMLP_SUCCESS;
}

int32_t copy_to_host(lnmlp_cuda_engine* b, void* dst, const void* src, int64_t n, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl.copy_to_host(dst, src, n); });
}

int32_t copy_from_host(lnmlp_cuda_engine* b, void* dst, const void* src, int64_t n, char* msg, int64_t cap) {
  return guard(msg, cap, [&] { b->impl.copy_from_host(dst, src, n); });
}

int32_t nccl_create(const void* nccl_comm, lnmlp_cuda_comm** out, int32_t* size, int32_t* rank, int32_t* device,
                    char* msg, int64_t cap) {
  return guard(msg, cap, [&] {
    auto c = std::make_unique<lnmlp_cuda_comm>();
    c->impl = lnmlp::cuda::make_nccl_communicator(nccl_comm);
    *size = c->impl->size();
    *rank = c->impl->rank();
    *device = lnmlp::cuda::nccl_device(*c->impl);
    *out = c.release();
  });
}

void nccl_destroy(lnmlp_cuda_comm* c) { delete c; }

int32_t nccl_collective(lnmlp_cuda_comm* c, int32_t op, const void* send, void* recv, int64_t count, int32_t type,
                        void* stream, char* msg, int64_t cap) {
  return guard(msg, cap, [&] {
    const auto t = static_cast<lnmlp::CommType>(type);
    switch (op) {
      case LNMLP_CUDA_ALL_GATHER: c->impl->all_gather(send, recv, count, t, stream); return;
      case LNMLP_CUDA_REDUCE_SCATTER_SUM: c->impl->reduce_scatter_sum(send, recv, count, t, stream); return;
      case LNMLP_CUDA_ALL_REDUCE_SUM: c->impl->all_reduce_sum(send, recv, count, t, stream); return;
      case LNMLP_CUDA_ALL_REDUCE_MAX: c->impl->all_reduce_max(send, recv, count, t, stream); return;
      default: lnmlp::fail(LNMLP_ERROR_INTERNAL, "unknown collective ", op);
    }
  });
}

void libraries(int32_t* nccl_loaded, char* text, int64_t cap) {
  try {
    bool loaded = false;
    const std::string nccl = lnmlp::cuda::nccl_library_description(&loaded);
    *nccl_loaded = loaded ? 1 : 0;
    write_message(text, cap, (std::string(lnmlp::cuda::cublaslt_description()) + "; " + nccl).c_str());
  } catch (...) {
    *nccl_loaded = 0;
    write_message(text, cap, "the CUDA module's libraries could not be described (out of memory)");
  }
}

const lnmlp_cuda_module_table kTable = {
    LNMLP_CUDA_MODULE_ABI,
    static_cast<int64_t>(sizeof(lnmlp::Config)),
    static_cast<int64_t>(sizeof(lnmlp::SavedLayout)),
    static_cast<int64_t>(sizeof(lnmlp::ForwardArgs) + sizeof(lnmlp::BackwardArgs)),
    probe,
    fp8_support,
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
    lnmlp::cuda::nccl_built() ? 1 : 0,
    nccl_create,
    nccl_destroy,
    nccl_collective,
    libraries,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const lnmlp_cuda_module_table* lnmlp_cuda_module_v13(void) {
  return &kTable;
}
