// The boundary between the core library (liblnmlp.so) and the CUDA backend module
// (liblnmlp_cuda.so), which the core loads with dlopen only when a plan asks for the CUDA backend,
// so that the core has no link dependency on the CUDA runtime or cuBLASLt.
//
// The module exports ONE symbol, LNMLP_CUDA_MODULE_ENTRY, returning a table of plain C functions.
// No C++ exception and no C++ type with type information crosses this boundary: every function
// returns an lnmlp status (int32_t, LNMLP_SUCCESS or LNMLP_ERROR_*) and, on failure, writes a
// NUL-terminated message into msg (capacity msg_cap bytes). The structs passed by pointer (Config,
// SavedLayout, ForwardArgs, BackwardArgs) are plain data compiled from the same headers into both
// sides of one build; abi and config_size guard against mixing builds.
//
// NCCL (lnmlp_comm_create_nccl) lives in the module too: the core asks it for an opaque
// communicator over the caller's ncclComm_t (nccl_create), and hands that to create() for a
// sharded plan; the Config's shard.comm pointer (the core's object) is never dereferenced by the
// module.
#pragma once

#include <cstdint>

#include "plan/call_args.h"
#include "plan/config.h"
#include "plan/layout.h"

// Bump when the table or any struct passed through it changes.
#define LNMLP_CUDA_MODULE_ABI 13
#define LNMLP_CUDA_MODULE_ENTRY "lnmlp_cuda_module_v13"
#define LNMLP_CUDA_MODULE_FILE "liblnmlp_cuda.so.1"

extern "C" {

typedef struct lnmlp_cuda_engine lnmlp_cuda_engine;  // opaque, owned by the module
typedef struct lnmlp_cuda_comm lnmlp_cuda_comm;      // opaque, an NCCL communicator of the module

// The collectives of lnmlp_cuda_module_table::nccl_collective (lnmlp::Communicator's four).
enum {
  LNMLP_CUDA_ALL_GATHER = 0,
  LNMLP_CUDA_REDUCE_SCATTER_SUM = 1,
  LNMLP_CUDA_ALL_REDUCE_SUM = 2,
  LNMLP_CUDA_ALL_REDUCE_MAX = 3
};

typedef struct lnmlp_cuda_module_table {
  int32_t abi;          // LNMLP_CUDA_MODULE_ABI of the module's build
  int64_t config_size;  // sizeof(lnmlp::Config) in the module's build
  int64_t layout_size;  // sizeof(lnmlp::SavedLayout)
  int64_t args_size;    // sizeof(lnmlp::ForwardArgs) + sizeof(lnmlp::BackwardArgs)
  // LNMLP_SUCCESS when a CUDA driver and at least one device are present; *count = device count.
  int32_t (*probe)(int32_t* count, char* msg, int64_t msg_cap);
  // How an FP8 recipe (an lnmlp::Recipe) runs on device 0: *answer = LNMLP_SUPPORTED (natively,
  // on FP8 tensor cores), LNMLP_SUPPORTED_EMULATED or LNMLP_UNSUPPORTED (lnmlp_query_support).
  int32_t (*fp8_support)(int32_t recipe, int32_t* answer, char* msg, int64_t msg_cap);
  // comm: the plan's NCCL communicator (from nccl_create), or NULL; the plan keeps it alive.
  int32_t (*create)(const lnmlp::Config* cfg, const lnmlp::SavedLayout* saved, lnmlp_cuda_comm* comm,
                    lnmlp_cuda_engine** out, char* msg, int64_t msg_cap);
  void (*destroy)(lnmlp_cuda_engine* b);
  int32_t (*workspace_bytes)(const lnmlp_cuda_engine* b, int64_t* bytes, char* msg, int64_t msg_cap);
  int32_t (*alignment)(const lnmlp_cuda_engine* b, int64_t* bytes, char* msg, int64_t msg_cap);
  int32_t (*forward)(lnmlp_cuda_engine* b, const lnmlp::ForwardArgs* args, void* workspace, char* msg, int64_t msg_cap);
  int32_t (*backward)(lnmlp_cuda_engine* b, const lnmlp::BackwardArgs* args, void* workspace, char* msg,
                      int64_t msg_cap);
  int32_t (*allocate)(lnmlp_cuda_engine* b, int64_t bytes, void** out, char* msg, int64_t msg_cap);
  int32_t (*release)(lnmlp_cuda_engine* b, void* p);  // never fails observably
  int32_t (*copy_to_host)(lnmlp_cuda_engine* b, void* host_dst, const void* src, int64_t bytes, char* msg,
                          int64_t msg_cap);
  int32_t (*copy_from_host)(lnmlp_cuda_engine* b, void* dst, const void* host_src, int64_t bytes, char* msg,
                            int64_t msg_cap);
  // 1 when the module was built with NCCL's header (NCCL itself is loaded on first use).
  int32_t nccl_built;
  // A communicator over *(const ncclComm_t*)nccl_comm (used as given, not duplicated or
  // destroyed): its size, rank and CUDA device. NOT_SUPPORTED without NCCL or a GPU.
  int32_t (*nccl_create)(const void* nccl_comm, lnmlp_cuda_comm** out, int32_t* size, int32_t* rank, int32_t* device,
                         char* msg, int64_t msg_cap);
  void (*nccl_destroy)(lnmlp_cuda_comm* c);
  // One LNMLP_CUDA_* collective over device buffers, enqueued on `stream` (a cudaStream_t); type
  // is an lnmlp::CommType, count as in lnmlp::Communicator.
  int32_t (*nccl_collective)(lnmlp_cuda_comm* c, int32_t op, const void* send, void* recv, int64_t count, int32_t type,
                             void* stream, char* msg, int64_t msg_cap);
  // The libraries the module runs on, for lnmlp_get_build_info: writes (NUL-terminated, cut to
  // cap) "cuBLASLt <version> (<file>); NCCL <version> (<file>)", or for NCCL why it is absent.
  // Loads NCCL if it is not loaded yet, as a communicator's creation would; *nccl_loaded = 1 when
  // it loaded. Needs no GPU.
  void (*libraries)(int32_t* nccl_loaded, char* text, int64_t cap);
} lnmlp_cuda_module_table;

// The entry point: const lnmlp_cuda_module_table* entry(void) (module/loader.h's call_module_entry calls it).

}  // extern "C"
