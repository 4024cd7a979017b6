// The collectives a sharded plan runs, behind one interface: a caller's callback table
// (comm_callbacks.cpp) or MPI (comm_mpi.cpp). Failures throw lnmlp::Error (LNMLP_ERROR_BACKEND).
#pragma once

#include <cstdint>
#include <memory>

#include "lnmlp.h"
#include "numerics/dtype.h"

namespace lnmlp {

// Values match the public LNMLP_COMM_* constants.
enum class CommType : int32_t { F32 = 0, BF16 = 1, F16 = 2, U8 = 3 };

constexpr CommType comm_type(numerics::DType d) {
  return d == numerics::DType::BF16 ? CommType::BF16 : d == numerics::DType::F16 ? CommType::F16 : CommType::F32;
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int32_t size() const = 0;
  virtual int32_t rank() const = 0;
  // count: elements each rank sends (all_gather) / receives (reduce_scatter) / reduces (all_reduce).
  virtual void all_gather(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
  virtual void reduce_scatter_sum(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
  virtual void all_reduce_sum(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
  virtual void all_reduce_max(const void* send, void* recv, int64_t count, CommType t, void* stream) = 0;
};

// Both throw lnmlp::Error with a message naming what is wrong.
std::shared_ptr<Communicator> make_callback_communicator(const lnmlp_comm_callbacks& table);
std::shared_ptr<Communicator> make_mpi_communicator(const void* mpi_comm);  // NOT_SUPPORTED without MPI
// Whether this build has MPI, for lnmlp_get_build_info.
bool mpi_built();

}  // namespace lnmlp
