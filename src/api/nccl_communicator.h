// The core's NCCL communicator (lnmlp_comm_create_nccl) is a proxy for one the CUDA module holds
// (nccl_communicator.cpp); a sharded CUDA plan hands the module its own one.
#pragma once

#include <memory>

#include "comm/comm.h"

struct lnmlp_cuda_comm;  // module/table.h

namespace lnmlp {

// NOT_SUPPORTED without the CUDA module, a GPU, or NCCL.
std::shared_ptr<Communicator> make_nccl_communicator(const void* nccl_comm);

// The module's communicator behind an NCCL Communicator; NULL for any other kind.
lnmlp_cuda_comm* cuda_module_comm(const Communicator* c);

}  // namespace lnmlp
