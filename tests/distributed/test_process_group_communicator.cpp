// ProcessGroupCommunicator over libtorch's ProcessGroupGloo (CPU, a FileStore for the rendezvous),
// under the same mpirun as the other tests: every collective gives MpiCommunicator's bits on the same
// inputs, the ShardedOptimizer over it equals one process bit for bit, and errors (bad arguments, a
// collective that times out, one the backend fails) name the backend, the collective and the rank.
#include "dist_util.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdio>
#include <unistd.h>

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
  EXPECT_STREQ(gloo()->backend(), "gloo");
  EXPECT_EQ(gloo()->rank(), comm().rank());
  EXPECT_EQ(gloo()->size(), comm().size());
  expect_expected_values(*gloo());
}

// Rank r's input: random bits for 1 or 2 ranks (a + b is b + a in IEEE arithmetic, so any order of the
// sum gives the same bits); small integers / 64 for 3 ranks and more, whose sums are exact in any order.
at::Tensor rank_input(int rank, int64_t numel, at::ScalarType t, int salt) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7919ull * rank + 104729ull * salt + 1);
  if (!at::isFloatingType(t)) return at::randint(0, 50, {numel}, gen, at::kLong).to(t);
  if (comm().size() <= 2) return at::randn({numel}, gen, at::kDouble).mul_(1000).to(t);
  return (at::randint(-64, 65, {numel}, gen, at::kFloat) / 64).to(t);
}

TEST(ProcessGroupCommunicator, EveryCollectiveEqualsMpiBitForBit) {
  SKIP_UNLESS_CPU();
  ld::Communicator& mpi = comm();
  ld::Communicator& pg = *gloo();
  const int r = mpi.rank(), n = mpi.size();
  int salt = 0;
  for (at::ScalarType t : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt, at::kByte})
    for (int64_t numel : {1, 1000, 4099}) {
      SCOPED_TRACE(std::string(c10::toString(t)) + " " + std::to_string(numel) + " elements");
      const bool floating = at::isFloatingType(t);
      for (ld::ReduceOp op : {ld::ReduceOp::Sum, ld::ReduceOp::Avg}) {
        if (op == ld::ReduceOp::Avg && !floating) continue;
        const char* opname = op == ld::ReduceOp::Sum ? "Sum" : "Avg";
        at::Tensor a = rank_input(r, numel, t, ++salt), b = a.clone();
        mpi.all_reduce(a, op);
        pg.all_reduce(b, op);
        EXPECT_TRUE(bitwise_equal(a, b)) << "all_reduce " << opname;
        at::Tensor in = rank_input(r, numel * n, t, ++salt);
        at::Tensor oa = at::empty({numel}, in.options()), ob = at::empty({numel}, in.options());
        mpi.reduce_scatter(in, oa, op);
        pg.reduce_scatter(in, ob, op);
        EXPECT_TRUE(bitwise_equal(oa, ob)) << "reduce_scatter " << opname;
      }
      // all_gather from a separate input, then in place (input = output's chunk rank()).
      const at::Tensor mine = rank_input(r, numel, t, ++salt);
      at::Tensor ga = at::empty({numel * n}, mine.options()), gb = at::empty({numel * n}, mine.options());
      mpi.all_gather(mine, ga);
      pg.all_gather(mine, gb);
      EXPECT_TRUE(bitwise_equal(ga, gb)) << "all_gather";
      at::Tensor ia = at::zeros({n, numel}, mine.options()), ib = at::zeros({n, numel}, mine.options());
      ia[r].copy_(mine);
      ib[r].copy_(mine);
      mpi.all_gather(ia[r], ia);
      pg.all_gather(ib[r], ib);
      EXPECT_TRUE(bitwise_equal(ia.view({-1}), ga)) << "all_gather in place (MPI)";
      EXPECT_TRUE(bitwise_equal(ib.view({-1}), ga)) << "all_gather in place";
      at::Tensor ba = rank_input(r, numel, t, ++salt), bb = ba.clone();
      mpi.broadcast(ba, n - 1);
      pg.broadcast(bb, n - 1);
      EXPECT_TRUE(bitwise_equal(ba, bb)) << "broadcast";
    }
  pg.barrier();
}

// ---- the sharded optimizer over it ------------------------------------------------------------------

TEST(ProcessGroupCommunicator, ShardedOptimizerMatchesOneProcess) {
  SKIP_UNLESS_CPU();
  for (const RuleCase& rc : rule_cases())
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::FP32}) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, false); }, at::kFloat, {}, 2,
                                 default_grad, gloo());
    }
  // bf16 parameters with stochastic rounding, and ZeRO-1 (all_reduce instead of reduce_scatter).
  expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[0].make(p, StateFormat::Q8, true); },
                             at::kBFloat16, {}, 2, default_grad, gloo());
  ld::ShardedOptions zero1;
  zero1.zero1 = true;
  expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[0].make(p, StateFormat::Q8, false); },
                             at::kFloat, zero1, 2, default_grad, gloo());
  // Overlap: buckets reduce-scattered from backward()'s hooks (small buckets: several form).
  ld::ShardedOptions overlap;
  overlap.overlap = true;
  overlap.bucket_bytes = 8192;
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(std::string(rc.name) + " overlap");
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q4, false); },
                               at::kFloat, overlap, 2, default_grad, gloo());
  }
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

// Rank 0 alone starts an all_reduce (timeout `ours`) on a fresh group whose other ranks never join:
// they keep the group open until rank 0 is done, or (`peers_leave`) close it at once.
std::string lone_all_reduce(const std::string& prefix, double ours, bool peers_leave) {
  auto group = make_gloo(prefix, 10);
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
