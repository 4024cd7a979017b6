// The NCCL communicator's checks that run on any machine (tests/gpu/test_cuda_sharding.cpp runs
// sharded CUDA plans where there is a GPU): lnmlp_comm_create_nccl's arguments, its answer where it
// cannot run (no GPU, no CUDA module, no NCCL), and the plan-creation checks that pair the CUDA
// backend with NCCL and the CPU backend with MPI / callbacks.
#include <gtest/gtest.h>

#include <string>

#include "sharding_util.h"

namespace lnmlp_test {
namespace {

bool cuda_usable() {
  int32_t yes = 0;
  return lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_BACKEND, &yes) == LNMLP_SUCCESS && yes == 1;
}

std::string last_error() { return lnmlp_last_error(); }

TEST(NcclCommunicator, NullArguments) {
  lnmlp_comm* c = nullptr;
  EXPECT_EQ(lnmlp_comm_create_nccl(nullptr, &c), LNMLP_ERROR_NULL_POINTER);
  EXPECT_NE(last_error().find("pass a pointer to an ncclComm_t"), std::string::npos) << last_error();
  EXPECT_EQ(c, nullptr);
  void* nccl_comm = nullptr;  // stands for an ncclComm_t (a pointer type)
  EXPECT_EQ(lnmlp_comm_create_nccl(&nccl_comm, nullptr), LNMLP_ERROR_NULL_POINTER);
  EXPECT_NE(last_error().find("comm is NULL"), std::string::npos) << last_error();
}

// Where the CUDA backend cannot run (no GPU here, no module, or no NCCL) the answer is
// NOT_SUPPORTED with a reason, and nothing is created. With a GPU and NCCL, a NULL ncclComm_t
// behind the pointer is INVALID_ARGUMENT (never dereferenced as a communicator).
TEST(NcclCommunicator, UnavailableOrInvalidCreatesNothing) {
  void* nccl_comm = nullptr;
  lnmlp_comm* c = nullptr;
  const int32_t st = lnmlp_comm_create_nccl(&nccl_comm, &c);
  EXPECT_EQ(c, nullptr);
  const std::string msg = last_error();
  if (!cuda_usable()) {
    EXPECT_EQ(st, LNMLP_ERROR_NOT_SUPPORTED) << msg;
    // The message says why: no CUDA backend in this build, the module not loadable, or no device.
    EXPECT_TRUE(msg.find("CUDA") != std::string::npos || msg.find("NCCL") != std::string::npos) << msg;
    EXPECT_NE(msg.find("lnmlp_comm_create_nccl"), std::string::npos) << msg;  // the function named
    int32_t yes = 1;
    ASSERT_EQ(lnmlp_query_support(LNMLP_BACKEND_CUDA, LNMLP_FEATURE_SHARDING, &yes), LNMLP_SUCCESS);
    EXPECT_EQ(yes, 0);
  } else {
    EXPECT_TRUE(st == LNMLP_ERROR_NOT_SUPPORTED || st == LNMLP_ERROR_INVALID_ARGUMENT) << st << ": " << msg;
  }
}


// These checks run before the CUDA module is asked for anything, so they hold on any machine.
TEST(NcclCommunicator, CudaPlanNeedsAnNcclCommunicator) {
  InProcessGroup group(2);
  {
    ShardDesc d(8, 8, LNMLP_BACKEND_CUDA);
    ASSERT_EQ(lnmlp_desc_set_sharding(d.d, 2, 0, 1), LNMLP_SUCCESS);
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("no communicator"), std::string::npos) << last_error();
    EXPECT_NE(last_error().find("lnmlp_comm_create_nccl"), std::string::npos) << last_error();
  }
  {
    ShardDesc d(8, 8, LNMLP_BACKEND_CUDA);
    ASSERT_EQ(lnmlp_desc_set_sharding(d.d, 2, 0, 0), LNMLP_SUCCESS);
    ASSERT_EQ(lnmlp_desc_set_communicator(d.d, group.comm(0)), LNMLP_SUCCESS);
    EXPECT_EQ(d.create(), LNMLP_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(last_error().find("the CUDA backend shards over an NCCL communicator, but the descriptor's is a callback "
                                "communicator (lnmlp_comm_create_callbacks); create one with lnmlp_comm_create_nccl"),
              std::string::npos)
        << last_error();
  }
  {  // The same descriptor on the CPU backend is fine: callbacks are a CPU communicator.
    ShardDesc d(8, 8, LNMLP_BACKEND_CPU);
    ASSERT_EQ(lnmlp_desc_set_sharding(d.d, 2, 0, 0), LNMLP_SUCCESS);
    ASSERT_EQ(lnmlp_desc_set_communicator(d.d, group.comm(0)), LNMLP_SUCCESS);
    EXPECT_EQ(d.create(), LNMLP_SUCCESS) << last_error();
  }
}

}  // namespace
}  // namespace lnmlp_test
