// The collectives a sharded plan runs, behind one interface: a caller's callback table
// (callbacks.cpp), MPI (mpi.cpp) or NCCL (the core's api/nccl_communicator.cpp, a proxy for the
// CUDA module's cuda/nccl_comm.cpp). Failures throw lnmlp::Error (LNMLP_ERROR_BACKEND).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "lnmlp.h"
#include "numerics/dtype.h"

namespace lnmlp {

// Values match the public LNMLP_DTYPE_* constants (the callbacks' `type`).
enum class CommType : int32_t { F32 = 0, BF16 = 1, F16 = 2, U8 = 3 };

constexpr CommType comm_type(numerics::DType d) {
  return d == numerics::DType::BF16 ? CommType::BF16 : d == numerics::DType::F16 ? CommType::F16 : CommType::F32;
}

// Which kind of communicator: the CPU backend shards over host memory (callbacks, MPI), the CUDA
// backend over device memory on a stream (NCCL).
enum class CommKind : int32_t { Callbacks = 0, Mpi = 1, Nccl = 2 };

constexpr const char* comm_kind_name(CommKind k) {
  return k == CommKind::Nccl  ? "an NCCL communicator (lnmlp_comm_create_nccl)"
         : k == CommKind::Mpi ? "an MPI communicator (lnmlp_comm_create_mpi)"
                              : "a callback communicator (lnmlp_comm_create_callbacks)";
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual CommKind kind() const = 0;
  virtual int32_t size() const = 0;
  virtual int32_t rank() const = 0;
  // count: elements each rank sends (all_gather) / receives (reduce_scatter) / reduces (all_reduce).
  virtual void all_gather(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
  virtual void all_reduce_sum(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
  virtual void all_reduce_max(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
};

// The collective step of both backends' GEMM2 output and dn (docs/design.md, "Sharding"): a rank's fp32
// partial sums [rows, width] (all T rows) summed over the group: in place (all-reduce), or under
// sequence parallelism into this rank's rows `local` [rows/P, width] (reduce-scatter). Returns
// where this rank's summed rows are; with comm == NULL (an unsharded plan), partial itself.
inline float* group_sum_rows(Communicator* comm, bool sp, float* partial, float* local, int64_t rows, int64_t width,
                             void* stream) {
  if (comm == nullptr) return partial;
  if (sp) {
    comm->reduce_scatter_sum(partial, local, rows / comm->size() * width, CommType::F32, stream);
    return local;
  }
  comm->all_reduce_sum(partial, partial, rows * width, CommType::F32, stream);
  return partial;
}

// A communicator calling a table of C collectives (lnmlp_comm_fn): a caller's table or the MPI
// module's. `explain` gives the message of a collective (its table field's name) that returned a
// nonzero status; `release` (may be empty) runs when the communicator goes.
using ExplainFailure = std::function<std::string(const char* collective, int32_t status)>;
std::shared_ptr<Communicator> make_table_communicator(const lnmlp_comm_callbacks& table, CommKind kind,
                                                      ExplainFailure explain, std::function<void()> release);

// Both throw lnmlp::Error with a message naming what is wrong.
std::shared_ptr<Communicator> make_callback_communicator(const lnmlp_comm_callbacks& table);
std::shared_ptr<Communicator> make_mpi_communicator(const void* mpi_comm);  // NOT_SUPPORTED without MPI
// Whether this build has MPI, for lnmlp_get_build_info.
bool mpi_built();

}  // namespace lnmlp
