// A communicator over an MPI communicator (lnmlp_comm_create_mpi); compiled with MPI only when
// CMake found it (LNMLP_HAVE_MPI), otherwise the factory says why it is missing.
#include "comm.h"
#include "common/error.h"
#include "lnmlp.h"

#if defined(LNMLP_HAVE_MPI)
#include <mpi.h>
#endif

namespace lnmlp {

#if defined(LNMLP_HAVE_MPI)
namespace {

MPI_Datatype mpi_type(CommType t) {
  switch (t) {
    case CommType::F32: return MPI_FLOAT;
    case CommType::BF16:
    case CommType::F16: return MPI_UINT16_T;  // gathered as bits; lnmlp sums and maxes in F32 only
    case CommType::U8: return MPI_UINT8_T;
  }
  fail(LNMLP_ERROR_INTERNAL, "unhandled communicator element type ", static_cast<int>(t));
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail(LNMLP_ERROR_BACKEND, what, " failed: ", msg);
}

int as_int(int64_t n) {
  if (n > 2147483647) fail(LNMLP_ERROR_SIZE_OVERFLOW, "a collective of ", n, " elements exceeds MPI's int counts");
  return static_cast<int>(n);
}

MPI_Op sum_or_max(CommType t, MPI_Op op, const char* what) {
  if (t != CommType::F32) fail(LNMLP_ERROR_INTERNAL, what, " on a non-F32 buffer");
  return op;
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm c) : comm_(c) {
    check(MPI_Comm_size(c, &size_), "MPI_Comm_size");
    check(MPI_Comm_rank(c, &rank_), "MPI_Comm_rank");
  }
  CommKind kind() const override { return CommKind::Mpi; }
  int32_t size() const override { return size_; }
  int32_t rank() const override { return rank_; }
  void all_gather(const void* s, void* r, int64_t n, CommType t, void*) override {
    check(MPI_Allgather(s, as_int(n), mpi_type(t), r, as_int(n), mpi_type(t), comm_), "MPI_Allgather");
  }
  void reduce_scatter_sum(const void* s, void* r, int64_t n, CommType t, void*) override {
    check(MPI_Reduce_scatter_block(s, r, as_int(n), mpi_type(t), sum_or_max(t, MPI_SUM, "a sum"), comm_),
          "MPI_Reduce_scatter_block");
  }
  void all_reduce_sum(const void* s, void* r, int64_t n, CommType t, void*) override {
    all_reduce(s, r, n, mpi_type(t), sum_or_max(t, MPI_SUM, "a sum"));
  }
  // Amaxes only (non-negative floats or NaN): max-reduced as their bit patterns, unsigned integers
  // in which every NaN is above +inf, so a NaN on any rank reaches every rank as it does locally
  // (MPI_MAX on floats need not propagate it).
  void all_reduce_max(const void* s, void* r, int64_t n, CommType t, void*) override {
    all_reduce(s, r, n, MPI_UINT32_T, sum_or_max(t, MPI_MAX, "a maximum"));
  }

 private:
  void all_reduce(const void* s, void* r, int64_t n, MPI_Datatype type, MPI_Op op) {
    check(MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, as_int(n), type, op, comm_), "MPI_Allreduce");
  }
  MPI_Comm comm_;
  int size_ = 1, rank_ = 0;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_communicator(const void* mpi_comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) fail(LNMLP_ERROR_INVALID_ARGUMENT, "MPI is not initialized; call MPI_Init first");
  const MPI_Comm c = *static_cast<const MPI_Comm*>(mpi_comm);
  if (c == MPI_COMM_NULL) fail(LNMLP_ERROR_INVALID_ARGUMENT, "*mpi_comm is MPI_COMM_NULL");
  return std::make_shared<MpiCommunicator>(c);
}

bool mpi_built() { return true; }

#else

std::shared_ptr<Communicator> make_mpi_communicator(const void*) {
  fail(LNMLP_ERROR_NOT_SUPPORTED,
       "this build of lnmlp has no MPI (CMake found none, or LNMLP_MPI=OFF); install an MPI (Debian: "
       "libopenmpi-dev) and rebuild, or use lnmlp_comm_create_callbacks");
}

bool mpi_built() { return false; }

#endif

}  // namespace lnmlp
