// copy_engine_support: what decides NcclOptions' unset copy-engine options, over MPI on the CPU
// (the decision's collectives are the bootstrap's). Every rank must get the same answer, naming the
// first rank that rules the copy engines out, and NCCL is asked on every rank or on none.
#include "dist_util.h"

#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <lowbit/distributed/copy_engine_support.h>
#include <lowbit/distributed/mpi_communicator.h>

namespace lowbit_test {
namespace {

constexpr int kNccl = 22803;    // 2.28.3, the GPU machines' NCCL
constexpr int kDriver = 13000;  // CUDA 13.0

// An MPI communicator of the job's ranks of its own: the decision's all-gathers are on CPU tensors,
// whatever the job's communicator is.
std::shared_ptr<ld::MpiCommunicator> bootstrap() {
  ld::MpiOptions mo;
  mo.timeout_s = 120;
  return std::make_shared<ld::MpiCommunicator>(MPI_COMM_WORLD, mo);
}

// Sets (or, with nullopt, unsets) an environment variable for its lifetime, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value->c_str(), 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

struct Asked {
  int times = 0;
  bool answer = true;
  std::function<bool()> fn() {
    return [this] {
      ++times;
      return answer;
    };
  }
};

TEST(CopyEngineSupport, EveryRankGetsTheFirstReasonAndNcclIsAskedOnAllRanksOrNone) {
  auto b = bootstrap();
  const int n = b->size(), last = n - 1;
  const bool is_last = b->rank() == last;
  const std::string on_last = " on rank " + std::to_string(last);
  // Only variables this test sets count.
  ScopedEnv p2p("NCCL_P2P_DISABLE", std::nullopt), win("NCCL_WIN_ENABLE", std::nullopt),
      cumem("NCCL_CUMEM_ENABLE", std::nullopt);
  Asked asked;
  ld::CopyEngineSupport s = ld::copy_engine_support(*b, kNccl, kDriver, asked.fn());
  if (n == 1) {
    EXPECT_FALSE(s.supported);
    EXPECT_EQ(s.why_not, "one rank");
    EXPECT_EQ(asked.times, 0);
    return;
  }
  EXPECT_TRUE(s.supported) << s.why_not;
  EXPECT_EQ(s.why_not, "");
  EXPECT_EQ(asked.times, 1);

  // What the last rank alone rules out, every rank hears, and NCCL is asked on none.
  s = ld::copy_engine_support(*b, is_last ? 22707 : kNccl, kDriver, asked.fn());
  EXPECT_FALSE(s.supported);
  EXPECT_EQ(s.why_not, "NCCL 2.27.7 (2.28 or later runs all-gathers on the copy engines)" + on_last);
  s = ld::copy_engine_support(*b, kNccl, is_last ? 12040 : kDriver, asked.fn());
  EXPECT_EQ(s.why_not, "the driver's CUDA 12.4 (NCCL's copy-engine collectives need 12.5 or later)" + on_last);
  {
    ScopedEnv set("NCCL_P2P_DISABLE", is_last ? std::optional<std::string>("1") : std::nullopt);
    s = ld::copy_engine_support(*b, kNccl, kDriver, asked.fn());
    EXPECT_EQ(s.why_not, "NCCL_P2P_DISABLE=1" + on_last);
  }
  {
    ScopedEnv set("NCCL_WIN_ENABLE", is_last ? "0" : "1");
    s = ld::copy_engine_support(*b, kNccl, kDriver, asked.fn());
    EXPECT_EQ(s.why_not, "NCCL_WIN_ENABLE=0" + on_last);
  }
  {
    ScopedEnv set("NCCL_CUMEM_ENABLE", is_last ? "0" : "1");
    s = ld::copy_engine_support(*b, kNccl, kDriver, asked.fn());
    EXPECT_EQ(s.why_not, "NCCL_CUMEM_ENABLE=0" + on_last);
  }
  // The first rank's reason wins when two differ.
  s = ld::copy_engine_support(*b, b->rank() >= 1 ? 22707 : kNccl, b->rank() == 0 ? 12040 : kDriver, asked.fn());
  EXPECT_EQ(s.why_not, "the driver's CUDA 12.4 (NCCL's copy-engine collectives need 12.5 or later) on rank 0");
  EXPECT_EQ(asked.times, 1) << "NCCL asked although a rank had ruled the copy engines out";

  // NCCL says no on the last rank: asked on every rank, and every rank hears which said no.
  asked.answer = !is_last;
  s = ld::copy_engine_support(*b, kNccl, kDriver, asked.fn());
  EXPECT_FALSE(s.supported);
  EXPECT_EQ(s.why_not, "NCCL has no symmetric memory between this node's GPUs (not every pair reaches the other "
                       "directly)" + on_last);
  EXPECT_EQ(asked.times, 2);
}

}  // namespace
}  // namespace lowbit_test
