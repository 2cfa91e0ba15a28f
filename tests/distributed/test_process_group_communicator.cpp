// ProcessGroupCommunicator over libtorch's ProcessGroupGloo (CPU, a FileStore for the rendezvous),
// under the same mpirun as the other tests: every collective gives MpiCommunicator's bits on the same
// inputs, the ShardedOptimizer over it equals one process bit for bit, and errors (bad arguments, a
// collective that times out, one the backend fails) name the backend, the collective and the rank.
#include "dist_util.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include <lowbit/distributed/process_group_communicator.h>

namespace lowbit_test {
namespace {

// ---- Gloo process groups over one FileStore --------------------------------------------------------

// The store's file: a name rank 0 picks (its pid), sent to every rank over the job's communicator.
c10::intrusive_ptr<c10d::Store>& store() {
  static c10::intrusive_ptr<c10d::Store> s;
  if (!s) {
    at::Tensor id = at::full({1}, static_cast<int64_t>(getpid()), at::kLong);
    // A job that aborted left its file behind, and pids come round again (pid_max may be 32768): a
    // stale store under this name would hand this job another job's keys, so rank 0 removes it
    // before any rank opens it.
    if (comm().rank() == 0) std::remove(("gloo_store." + std::to_string(getpid())).c_str());
    comm().broadcast(id, 0);
    const std::string path = "gloo_store." + std::to_string(id.item<int64_t>());
    s = c10::make_intrusive<c10d::FileStore>(path, comm().size());  // the last rank to close it removes it
  }
  return s;
}

// A new Gloo group of the job's ranks (loopback), named `prefix` in the store; `gloo_timeout_s` is
// the backend's own limit on a collective.
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(const std::string& prefix, double gloo_timeout_s) {
  auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(int64_t(gloo_timeout_s * 1000)));
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>(prefix, store()),
                                                     comm().rank(), comm().size(), options);
}

std::shared_ptr<ld::ProcessGroupCommunicator> g_gloo;

// The Gloo communicator most tests share; dropped when the tests end (before MPI finalizes).
std::shared_ptr<ld::ProcessGroupCommunicator> gloo() {
  if (!g_gloo) {
    ld::ProcessGroupOptions o;
    o.timeout_s = 120;
    g_gloo = std::make_shared<ld::ProcessGroupCommunicator>(make_gloo("main", 120), o);
  }
  return g_gloo;
}

struct DropGloo : ::testing::Environment {
  void TearDown() override {
    g_gloo.reset();
    store().reset();
  }
};
const auto* const kDropGloo = ::testing::AddGlobalTestEnvironment(new DropGloo);

#define SKIP_UNLESS_CPU() \
  if (device().is_cuda()) GTEST_SKIP() << "Gloo tests run on the CPU job only"

// ---- collectives --------------------------------------------------------------------------------

TEST(ProcessGroupCommunicator, CollectivesGiveTheExpectedValues) {
  SKIP_UNLESS_CPU();
  expect_a_communicator_of_the_job(*gloo(), "gloo");
}

TEST(ProcessGroupCommunicator, EveryCollectiveEqualsMpiBitForBit) {
  SKIP_UNLESS_CPU();
  expect_collectives_equal_the_jobs(
      *gloo(), {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt, at::kByte});
}

// ---- the sharded optimizer over it ------------------------------------------------------------------

TEST(ProcessGroupCommunicator, ShardedOptimizerMatchesOneProcess) {
  SKIP_UNLESS_CPU();
  expect_sharded_over_matches_one_process(gloo());
}

// ---- errors -----------------------------------------------------------------------------------------

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(ProcessGroupCommunicator, BadArgumentsAreNamed) {
  SKIP_UNLESS_CPU();
  expect_bad_arguments_named(*gloo());
  ld::Communicator& pg = *gloo();
  const int n = pg.size();
  at::Tensor out = at::empty({3});
  EXPECT_HAS(error_of([&] { pg.reduce_scatter(at::zeros({3 * n + 1}), out); }),
             "ProcessGroupCommunicator(gloo): reduce_scatter: input has " + std::to_string(3 * n + 1) + " elements");
  at::Tensor nc = at::zeros({4, 4}).t();
  EXPECT_HAS(error_of([&] { pg.all_reduce(nc); }), "ProcessGroupCommunicator(gloo): all_reduce: tensor must be a dense");
  at::Tensor l = at::zeros({4}, at::kLong);
  EXPECT_HAS(error_of([&] { pg.all_reduce(l, ld::ReduceOp::Avg); }), "all_reduce: Avg needs a floating-point tensor");
  at::Tensor big = at::zeros({2 * n}, at::kDouble);
  EXPECT_HAS(error_of([&] { pg.all_gather(at::zeros({2}), big); }),
             "ProcessGroupCommunicator(gloo): all_gather: input has dtype Float but output has dtype Double");
  at::Tensor b = at::zeros({2});
  EXPECT_HAS(error_of([&] { pg.broadcast(b, -1); }), "broadcast: root must be in [0, " + std::to_string(n) + "), got -1");
  EXPECT_HAS(error_of([] { ld::ProcessGroupCommunicator none(c10::intrusive_ptr<c10d::Backend>{}); }),
             "backend is null");
  ld::ProcessGroupOptions o;
  o.timeout_s = 0;
  EXPECT_HAS(error_of([&] { ld::ProcessGroupCommunicator zero(gloo()->c10d_backend(), o); }),
             "the timeout must be > 0 seconds, got 0");
  pg.barrier();  // still usable: nothing was started
}

// A peer that leaves closes its sockets, and a write to one raises SIGPIPE: at its default it would end
// the process before the failed collective is reported (the peers_gone test below then dies by signal
// 13 now and then, as it did under load). Constructing a communicator ignores it, unless the program
// has a handler of its own.
void no_handler(int) {}
sighandler_t sigpipe_now() {
  struct sigaction a {};
  sigaction(SIGPIPE, nullptr, &a);
  return a.sa_handler;
}

TEST(ProcessGroupCommunicator, SigpipeIsIgnoredUnlessTheProgramHandlesIt) {
  SKIP_UNLESS_CPU();
  const sighandler_t before = signal(SIGPIPE, SIG_DFL);
  { ld::ProcessGroupCommunicator pg(gloo()->c10d_backend()); }
  EXPECT_EQ(sigpipe_now(), SIG_IGN) << "SIGPIPE left at its default";
  signal(SIGPIPE, no_handler);
  { ld::ProcessGroupCommunicator pg(gloo()->c10d_backend()); }
  EXPECT_EQ(sigpipe_now(), &no_handler) << "the program's own SIGPIPE handler was replaced";
  signal(SIGPIPE, before);
}

// Rank 0 alone starts an all_reduce (timeout `ours`) on a fresh group whose other ranks never join:
// they keep the group open until rank 0 is done, or (`peers_leave`) close it at once. Every rank
// first waits until all have built the group: a peer that left as soon as its own side of Gloo's
// mesh was connected could close it while rank 0 was still connecting (seen once under the
// sanitizers: "connectFullMesh failed ... Connection closed by peer").
std::string lone_all_reduce(const std::string& prefix, double ours, bool peers_leave) {
  auto group = make_gloo(prefix, 10);
  comm().barrier();
  std::string error;
  if (comm().rank() == 0) {
    ld::ProcessGroupOptions o;
    o.timeout_s = ours;
    ld::ProcessGroupCommunicator pg(group, o);
    at::Tensor x = at::ones({4});
    error = error_of([&] { pg.all_reduce(x); });
    // Failed once, refused after.
    const std::string again = error_of([&] { pg.barrier(); });
    EXPECT_HAS(again, "barrier on a communicator that failed before: ProcessGroupCommunicator(gloo): all_reduce");
  } else if (peers_leave) {
    group.reset();
  }
  comm().barrier();
  return error;  // the group ends here; rank 0's Gloo work ends with it (its peers are gone)
}

TEST(ProcessGroupCommunicator, ACollectiveThatTimesOutIsAnErrorNamingItAndTheRank) {
  SKIP_UNLESS_CPU();
  if (comm().size() < 2) GTEST_SKIP() << "needs a peer that does not join";
  const std::string n = std::to_string(comm().size());
  const std::string e = lone_all_reduce("timeout", 0.3, false);
  if (comm().rank() == 0)
    EXPECT_HAS(e, "ProcessGroupCommunicator(gloo): all_reduce of 4 elements did not finish within 0.3 s on rank 0 of " + n);
}

TEST(ProcessGroupCommunicator, ACollectiveTheBackendFailsIsAnErrorNamingItAndTheRank) {
  SKIP_UNLESS_CPU();
  if (comm().size() < 2) GTEST_SKIP() << "needs a peer that does not join";
  const std::string n = std::to_string(comm().size());
  const std::string e = lone_all_reduce("peers_gone", 60, true);
  if (comm().rank() == 0) EXPECT_HAS(e, "ProcessGroupCommunicator(gloo): all_reduce of 4 elements failed on rank 0 of " + n);
}

}  // namespace
}  // namespace lowbit_test
