// The core's NCCL communicator (lnmlp_comm_create_nccl) is a proxy for one the CUDA module holds
// (comm/nccl.cpp); a sharded CUDA plan hands the module its own one.
#pragma once

#include "comm.h"

struct lnmlp_cuda_comm;  // module/table.h

namespace lnmlp {

// The module's communicator behind an NCCL Communicator; NULL for any other kind.
lnmlp_cuda_comm* cuda_module_comm(const Communicator* c);

}  // namespace lnmlp
