// The CUDA module's NCCL communicator: an lnmlp::Communicator (comm.h) whose collectives run on a
// CUDA stream over device buffers, through the caller's ncclComm_t (lnmlp_comm_create_nccl).
//
// NCCL is not a link dependency of the module: it is loaded with dlopen when the first
// communicator is created (libnccl.so.2: the copy the process already has loaded, as a framework
// that made the ncclComm_t has, else the loader's search path, else the library CMake found), so
// the CUDA backend still loads and runs unsharded where NCCL is not installed. Compiled with NCCL's
// header only where CMake found one (LNMLP_HAVE_NCCL); otherwise creation answers NOT_SUPPORTED.
#pragma once

#include <memory>
#include <string>

#include "comm/comm.h"

namespace lnmlp::cuda {

// Whether this module was built with NCCL's header.
bool nccl_built();

// A communicator over *(const ncclComm_t*)nccl_comm, used as given (not duplicated, not
// destroyed). Throws NOT_SUPPORTED without NCCL or a GPU, INVALID_ARGUMENT for a NULL ncclComm_t,
// BACKEND when NCCL reports an error.
std::unique_ptr<Communicator> make_nccl_communicator(const void* nccl_comm);

// The CUDA device of a communicator from make_nccl_communicator.
int nccl_device(const Communicator& c);

// "NCCL <version> (<file>)" for the build info, loading NCCL if no communicator has yet (needs no
// GPU), and *loaded = whether it is loaded; else why not (not built in, not found, too old).
std::string nccl_library_description(bool* loaded);

}  // namespace lnmlp::cuda
