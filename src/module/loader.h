// The core's side of the module boundaries (table.h, comm/mpi_table.h): finding and loading
// liblnmlp_cuda.so.1 with dlopen, once, and checking that it belongs to this build. The plan's
// proxy engine (api/cuda_engine.cpp) and the NCCL communicator (api/nccl_communicator.cpp) call
// through the CUDA table; module/mpi_loader.cpp loads the MPI module the same way.
#pragma once

#include <cstdint>
#include <string>

struct lnmlp_cuda_module_table;  // table.h

namespace lnmlp {

// A module's entry point: `file` loaded from this library's directory, else from the loader's
// search path, and its symbol `entry`; NULL with what was tried appended to *tried.
void* load_module_entry(const char* file, const char* entry, std::string* tried);

// Calls a module's entry point (from load_module_entry: a `const Table* (void)` function) and
// returns the module's table (NULL if it gives none).
template <typename Table> const Table* call_module_entry(void* entry) {
  const Table* (*fn)(void) = nullptr;
  static_assert(sizeof(fn) == sizeof(entry), "function and object pointers differ in size");
  __builtin_memcpy(&fn, &entry, sizeof fn);
  return fn();
}

// The loaded CUDA module's table; throws NOT_SUPPORTED (saying why it could not be loaded).
const lnmlp_cuda_module_table& cuda_module_table();

// lnmlp_query_support's answer for the CUDA backend: tries to load the module and probe for a
// device (never throws, never crashes).
int32_t cuda_feature_supported(int32_t feature) noexcept;

// For lnmlp_get_build_info, once something has asked for the CUDA module (a CUDA plan,
// lnmlp_query_support with LNMLP_BACKEND_CUDA, an NCCL communicator): "module <file> loaded, on
// cuBLASLt <version> (<file>); NCCL <version> (<file>)" (NCCL loaded by this call if need be), or
// why the module could not be loaded. "" before (loading it maps cuBLASLt, hundreds of MB: only a
// CUDA user should pay for that).
std::string cuda_module_description();

}  // namespace lnmlp
