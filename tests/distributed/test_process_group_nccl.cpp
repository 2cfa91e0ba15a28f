// ProcessGroupCommunicator over libtorch's ProcessGroupNCCL (the --cuda job of scripts/gpu_session dist:
// one GPU per rank; a FileStore for the rendezvous): every collective gives NcclCommunicator's bits
// on the same inputs, and the ShardedOptimizer over it equals one process bit for bit. Built where
// the libtorch ships ProcessGroupNCCL (USE_C10D_NCCL) and lowbit has NCCL; the CPU job skips it.
#include "dist_util.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdio>
#include <unistd.h>

#include <lowbit/distributed/process_group_communicator.h>

namespace lowbit_test {
namespace {

c10::intrusive_ptr<c10d::Store> g_store;
std::shared_ptr<ld::ProcessGroupCommunicator> g_nccl;

// A ProcessGroupNCCL of the job's ranks on their GPUs, shared by the tests; its store's file is named
// by rank 0's pid (removed first: a stale file of an aborted job would hand over its keys).
std::shared_ptr<ld::ProcessGroupCommunicator> nccl_group() {
  if (!g_nccl) {
    if (comm().rank() == 0) std::remove(("nccl_store." + std::to_string(getpid())).c_str());
    at::Tensor id = at::full({1}, static_cast<int64_t>(getpid()), at::TensorOptions().dtype(at::kLong).device(device()));
    comm().broadcast(id, 0);
    const std::string path = "nccl_store." + std::to_string(id.cpu().item<int64_t>());
    g_store = c10::make_intrusive<c10d::FileStore>(path, comm().size());
    auto backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(c10::make_intrusive<c10d::PrefixStore>("pg", g_store),
                                                               comm().rank(), comm().size());
    ld::ProcessGroupOptions o;
    o.timeout_s = 120;
    g_nccl = std::make_shared<ld::ProcessGroupCommunicator>(backend, o);
  }
  return g_nccl;
}

struct DropNccl : ::testing::Environment {
  void TearDown() override {
    g_nccl.reset();
    g_store.reset();
  }
};
const auto* const kDropNccl = ::testing::AddGlobalTestEnvironment(new DropNccl);

#define SKIP_UNLESS_CUDA() \
  if (!device().is_cuda()) GTEST_SKIP() << "ProcessGroupNCCL runs in the --cuda job"

TEST(ProcessGroupNccl, CollectivesGiveTheExpectedValues) {
  SKIP_UNLESS_CUDA();
  expect_a_communicator_of_the_job(*nccl_group(), "nccl");
}

TEST(ProcessGroupNccl, EveryCollectiveEqualsNcclCommunicatorBitForBit) {
  SKIP_UNLESS_CUDA();
  expect_collectives_equal_the_jobs(*nccl_group(), {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kLong});
}

TEST(ProcessGroupNccl, ShardedOptimizerMatchesOneProcess) {
  SKIP_UNLESS_CUDA();
  expect_sharded_over_matches_one_process(nccl_group());
}

}  // namespace
}  // namespace lowbit_test
