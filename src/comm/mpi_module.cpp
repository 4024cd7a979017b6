// The MPI communicator module, liblnmlp_mpi.so.1 (comm/mpi_table.h): lnmlp's four collectives
// over a caller's MPI_Comm, as a table of C callbacks. The only part of lnmlp linked with MPI;
// the core loads it with dlopen when lnmlp_comm_create_mpi is called.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <new>

#include "comm/mpi_table.h"

namespace {

MPI_Comm comm_of(void* user) { return *static_cast<MPI_Comm*>(user); }

// The MPI type of a buffer of LNMLP_DTYPE_* elements: 16-bit floats are gathered as bits (lnmlp
// sums and maxes in F32 only); 0 for a type lnmlp never sends.
MPI_Datatype mpi_type(int32_t type) {
  switch (type) {
    case LNMLP_DTYPE_F32: return MPI_FLOAT;
    case LNMLP_DTYPE_BF16:
    case LNMLP_DTYPE_F16: return MPI_UINT16_T;
    case LNMLP_DTYPE_U8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

// MPI's counts are int; MPI_ERR_COUNT where a count does not fit (or a type is not one lnmlp sends,
// or a sum or maximum is asked of anything but F32).
bool fits(int64_t n, int32_t type, bool reduces) {
  return n >= 0 && n <= 2147483647 && mpi_type(type) != MPI_DATATYPE_NULL && (!reduces || type == LNMLP_DTYPE_F32);
}

int32_t all_gather(const void* s, void* r, int64_t n, int32_t type, void* user, void*) {
  if (!fits(n, type, false)) return MPI_ERR_COUNT;
  const int count = static_cast<int>(n);
  return MPI_Allgather(s, count, mpi_type(type), r, count, mpi_type(type), comm_of(user));
}

int32_t reduce_scatter(const void* s, void* r, int64_t n, int32_t type, void* user, void*) {
  if (!fits(n, type, true)) return MPI_ERR_COUNT;
  return MPI_Reduce_scatter_block(s, r, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_of(user));
}

int32_t all_reduce_sum(const void* s, void* r, int64_t n, int32_t type, void* user, void*) {
  if (!fits(n, type, true)) return MPI_ERR_COUNT;
  return MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_of(user));
}

// Amaxes only (non-negative floats or NaN): max-reduced as their bit patterns, unsigned integers
// in which every NaN is above +inf, so a NaN on any rank reaches every rank as it does locally
// (MPI_MAX on floats need not propagate it).
int32_t all_reduce_max(const void* s, void* r, int64_t n, int32_t type, void* user, void*) {
  if (!fits(n, type, true)) return MPI_ERR_COUNT;
  return MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, static_cast<int>(n), MPI_UINT32_T, MPI_MAX, comm_of(user));
}

void say(char* msg, int64_t cap, const char* text) {
  if (msg != nullptr && cap > 0) std::snprintf(msg, static_cast<size_t>(cap), "%s", text);
}

int32_t open_comm(const void* mpi_comm, lnmlp_comm_callbacks* table, char* msg, int64_t cap) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    say(msg, cap, "MPI is not initialized; call MPI_Init first");
    return LNMLP_ERROR_INVALID_ARGUMENT;
  }
  const MPI_Comm c = *static_cast<const MPI_Comm*>(mpi_comm);
  if (c == MPI_COMM_NULL) {
    say(msg, cap, "*mpi_comm is MPI_COMM_NULL");
    return LNMLP_ERROR_INVALID_ARGUMENT;
  }
  int size = 0, rank = 0;
  if (MPI_Comm_size(c, &size) != MPI_SUCCESS || MPI_Comm_rank(c, &rank) != MPI_SUCCESS) {
    say(msg, cap, "MPI_Comm_size / MPI_Comm_rank failed on *mpi_comm: not a valid communicator");
    return LNMLP_ERROR_INVALID_ARGUMENT;
  }
  MPI_Comm* user = new (std::nothrow) MPI_Comm(c);
  if (user == nullptr) {
    say(msg, cap, "out of memory for the MPI communicator");
    return LNMLP_ERROR_OUT_OF_MEMORY;
  }
  *table = lnmlp_comm_callbacks{static_cast<int64_t>(sizeof(lnmlp_comm_callbacks)),
                                size,
                                rank,
                                all_gather,
                                reduce_scatter,
                                all_reduce_sum,
                                all_reduce_max,
                                user};
  return LNMLP_SUCCESS;
}

void close_comm(void* user) { delete static_cast<MPI_Comm*>(user); }

void error_string(int32_t code, char* msg, int64_t cap) {
  if (code == MPI_ERR_COUNT) {
    say(msg, cap, "a collective's count does not fit MPI's int, or its type is not one lnmlp sends");
    return;
  }
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) std::snprintf(text, sizeof text, "MPI error %d", code);
  say(msg, cap, text);
}

const lnmlp_mpi_module_table kTable = {LNMLP_MPI_MODULE_ABI, open_comm, close_comm, error_string};

}  // namespace

extern "C" __attribute__((visibility("default"))) const lnmlp_mpi_module_table* lnmlp_mpi_module_v1() {
  return &kTable;
}
