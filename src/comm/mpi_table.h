// The boundary between the core library (liblnmlp.so) and the MPI communicator module
// (liblnmlp_mpi.so.1), which the core loads with dlopen only when lnmlp_comm_create_mpi is called,
// so that the core (and a wheel of it) has no link dependency on an MPI library: MPI is found at
// run time, and only by a program that asks for it. The module links no MPI either: compiled
// against the build's mpi.h, it leaves MPI's symbols to the global scope, where the core first
// loads the build's MPI library by its soname (LNMLP_MPI_LIBRARY_SONAME, src/CMakeLists.txt).
//
// The module exports ONE symbol, LNMLP_MPI_MODULE_ENTRY, returning a table of plain C functions.
// open() fills the public lnmlp_comm_callbacks table over the caller's MPI_Comm (the same four
// collectives a framework's callback communicator gives, on host memory), whose `user` is the
// module's state for that communicator, released by close(). A collective returns 0 or the MPI
// error code, which error_string() turns into MPI's message. No C++ exception and no C++ type
// crosses this boundary.
#pragma once

#include <cstdint>

#include "lnmlp.h"

// Bump when the table changes.
#define LNMLP_MPI_MODULE_ABI 1
#define LNMLP_MPI_MODULE_ENTRY "lnmlp_mpi_module_v1"
#define LNMLP_MPI_MODULE_FILE "liblnmlp_mpi.so.1"

extern "C" {

typedef struct lnmlp_mpi_module_table {
  int32_t abi;  // LNMLP_MPI_MODULE_ABI of the module's build
  // Fills *table (its struct_size, the group's size and rank, the four collectives, user) over the
  // MPI_Comm that mpi_comm points to. Returns an lnmlp status; on failure a message in msg.
  int32_t (*open)(const void* mpi_comm, lnmlp_comm_callbacks* table, char* msg, int64_t msg_cap);
  // Releases what open() put in table->user.
  void (*close)(void* user);
  // MPI's message for a collective's nonzero return.
  void (*error_string)(int32_t code, char* msg, int64_t msg_cap);
} lnmlp_mpi_module_table;

// The entry point: const lnmlp_mpi_module_table* entry(void) (module/loader.h's call_module_entry calls it).

}  // extern "C"
