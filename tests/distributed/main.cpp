// lowbit_dist_tests: GoogleTest under mpirun. Every rank runs every test in the same order (the
// tests are collective); --cuda runs them over NCCL on each rank's GPU instead of MPI on the CPU.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <lowbit/distributed/mpi_communicator.h>

#include "dist_util.h"

namespace ld = lowbit::distributed;

namespace lowbit_test {
namespace {
std::shared_ptr<ld::Communicator> g_comm;
at::Device g_device = at::kCPU;
}  // namespace
ld::Communicator& comm() { return *g_comm; }
std::shared_ptr<ld::Communicator> comm_ptr() { return g_comm; }
at::Device device() { return g_device; }
}  // namespace lowbit_test

namespace {

// --failure=hang|kill|hang_first|abort: a job that must end with an error rather than hang. The last
// rank stops taking part in the middle of a run (it sleeps, or is killed), or (hang_first) right after
// the communicator is made, so that the others' first collective is stuck inside NCCL connecting to
// it; the other ranks' next collective must fail within --timeout seconds and end the whole job
// with an error naming it. With abort the last rank calls abort_job mid-run, which must end the job
// at once, long before the timeout.
int run_failure(const std::string& mode, double timeout, bool cuda) {
  ld::InitOptions o;
  o.timeout_s = timeout;
  o.device_type = cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  auto comm = ld::init_from_env(o);
  const at::Device dev = cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ld::launch_env().local_rank)) : at::Device(at::kCPU);
  std::vector<at::Tensor> params = lowbit_test::make_params(at::kFloat, dev);
  const bool victim = comm->rank() == comm->size() - 1 && comm->size() > 1;
  if (mode == "hang_first" && victim) {
    std::fprintf(stderr, "rank %d: hanging before the first collective\n", comm->rank());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::hours(1));
  }
  // *_fsdp: the same through a FullyShardedModule of three Linear units, whose forward's all-gathers
  // are the first collectives to meet the missing rank.
  const bool fsdp = mode.size() > 5 && mode.compare(mode.size() - 5, 5, "_fsdp") == 0;
  torch::nn::Sequential model(torch::nn::Linear(64, 64), torch::nn::Linear(64, 64), torch::nn::Linear(64, 64));
  model->to(dev);
  std::unique_ptr<ld::ShardedOptimizer> sharded;
  std::unique_ptr<ld::FullyShardedModule> fully;
  if (fsdp) {
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (const auto& m : model->children()) units.push_back(m);
    fully = std::make_unique<ld::FullyShardedModule>(
        model.ptr(), units, std::make_shared<lowbit::optim::AdamW>(model->parameters(), lowbit::optim::AdamWOptions(1e-3)),
        comm);
    params = {model->parameters()[0]};
  } else {
    sharded = std::make_unique<ld::ShardedOptimizer>(
        std::make_shared<lowbit::optim::AdamW>(params, lowbit::optim::AdamWOptions(1e-3)), comm);
  }
  for (int s = 1; s <= 3; ++s) {
    if (s == 2 && victim && mode == "abort")  // an error only this rank meets: it ends the job at once
      ld::abort_job(4, "an error only this rank met (the failure test)");
    if (s == 2 && victim && mode != "hang_first") {
      const bool kill = mode == "kill" || mode == "kill_fsdp";
      std::fprintf(stderr, "rank %d: %s now\n", comm->rank(), kill ? "killed" : "hanging");
      std::fflush(stderr);
      if (kill) std::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    if (fully) {
      const at::Tensor x = at::ones({8, 64}, at::TensorOptions().device(dev)) * (comm->rank() + s);
      const at::Tensor loss = fully->forward([&] {
        at::Tensor y = x;
        for (size_t u = 0; u < fully->units(); ++u)
          y = fully->unit(u, [&] { return model[u]->as<torch::nn::Linear>()->forward(y); });
        return y.sum();
      });
      loss.backward();
      fully->step();
      fully->gather_all();  // the parameter read below
      (void)params[0].sum().item<double>();
      fully->release_all();
      std::fprintf(stderr, "rank %d: step %d done\n", comm->rank(), s);
      continue;
    }
    for (size_t k = 0; k < params.size(); ++k)
      params[k].mutable_grad() = lowbit_test::rank_grad(comm->rank(), s, static_cast<int>(k), params[k].sizes(), at::kFloat).to(dev);
    sharded->step();
    // As a training loop does (loss.item()), wait for the step: NCCL's collectives return once
    // enqueued, so the others would otherwise run on past the hung collective until their
    // communicator's destructor waited for it.
    (void)params[0].sum().item<double>();
    std::fprintf(stderr, "rank %d: step %d done\n", comm->rank(), s);
  }
  std::fprintf(stderr, "rank %d: the job went on without its peer\n", comm->rank());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool cuda = false;
  std::string failure;
  double timeout = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cuda") == 0) cuda = true;
    if (std::strncmp(argv[i], "--failure=", 10) == 0) failure = argv[i] + 10;
    if (std::strncmp(argv[i], "--timeout=", 10) == 0) timeout = std::atof(argv[i] + 10);
  }
  if (!failure.empty()) return run_failure(failure, timeout, cuda);
  ::testing::InitGoogleTest(&argc, argv);
  int status = 0;
  {
    ld::InitOptions o;
    o.timeout_s = 120;
    o.device_type = cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
    lowbit_test::g_comm = ld::init_from_env(o);
    if (cuda) lowbit_test::g_device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ld::launch_env().local_rank));
    // Only rank 0 prints every test; the others print their failures only.
    if (lowbit_test::g_comm->rank() != 0) GTEST_FLAG_SET(brief, true);
    status = RUN_ALL_TESTS();
    // The job passes only if every rank passed.
    at::Tensor failed = at::full({1}, status != 0 ? 1 : 0, at::TensorOptions().dtype(at::kInt).device(lowbit_test::g_device));
    lowbit_test::g_comm->all_reduce(failed);
    if (failed.cpu().item<int>() != 0) status = 1;
    if (lowbit_test::g_comm->rank() == 0)
      std::printf("lowbit_dist_tests: %s on %d rank(s)\n", status ? "FAILED" : "passed", lowbit_test::g_comm->size());
    lowbit_test::g_comm.reset();
  }
  return status;
}
