// NcclCommunicator completes collectives asynchronously: a call returns once its collective is
// enqueued, the result is ordered before the caller stream's later work, and a watchdog thread
// enforces the timeout: a collective that cannot finish fails the communicator with an error naming
// it, its element count and the rank, and nothing hangs. The caller's stream is held by a host
// function, so "returns at once" is a fact, not a timing. Over NCCL only (--cuda); one rank is
// enough (LOWBIT_DIST_NP=1 scripts/gpu_session dist), more run it on every rank.
#include "dist_util.h"

#include <lowbit/build_config.h>

#if LOWBIT_WITH_NCCL

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>

#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <lowbit/distributed/fully_sharded_module.h>
#include <lowbit/distributed/mpi_communicator.h>
#include <lowbit/distributed/nccl_communicator.h>

namespace lowbit_test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Holds the caller's current stream from here until release(): a host function enqueued on it
// spins on a flag. So that a test that goes wrong fails rather than hangs, it also lets go at a
// deadline (expired() then says so). While it holds, this thread must not allocate CUDA memory or
// wait for the device.
class StreamHold {
 public:
  explicit StreamHold(double deadline_s) : state_(std::make_shared<State>()) {
    state_->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s));
    auto* arg = new std::shared_ptr<State>(state_);  // the host function's own reference: it may outlive this
    const cudaError_t e =
        cudaLaunchHostFunc(c10::cuda::getCurrentCUDAStream(device().index()).stream(), &StreamHold::spin, arg);
    if (e != cudaSuccess) {
      delete arg;
      TORCH_CHECK(false, "cudaLaunchHostFunc failed: ", cudaGetErrorString(e));
    }
  }
  ~StreamHold() { release(); }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void release() { state_->open.store(true); }
  bool expired() const { return state_->expired.load(); }

 private:
  struct State {
    std::atomic<bool> open{false}, expired{false};
    Clock::time_point deadline;
  };
  static void CUDART_CB spin(void* arg) {
    std::unique_ptr<std::shared_ptr<State>> state(static_cast<std::shared_ptr<State>*>(arg));
    while (!(*state)->open.load()) {
      if (Clock::now() > (*state)->deadline) {
        (*state)->expired.store(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  std::shared_ptr<State> state_;
};

// A communicator of the job's ranks of its own (collective: every rank makes it), failures thrown.
std::unique_ptr<ld::NcclCommunicator> make_nccl(double timeout_s) {
  ld::NcclOptions no;
  no.timeout_s = timeout_s;
  no.abort_on_failure = false;
  return nccl_of_the_job(no);
}


TEST(NcclAsync, ACollectiveThatCannotFinishFailsTheCommunicatorAfterTheTimeout) {
  SKIP_WITHOUT_NCCL();
  auto c = make_nccl(2.0);
  const int r = c->rank(), n = c->size();
  at::Tensor x = at::ones({1000}, at::TensorOptions().device(device()));
  // The first use (kernels loaded, peers connected) before the stream is held.
  c->all_reduce(x);
  c->synchronize();
  EXPECT_TRUE(bitwise_equal(x, at::full({1000}, static_cast<double>(n), at::kFloat)));
  {
    StreamHold hold(/*deadline_s=*/30);
    const auto start = Clock::now();
    c->all_reduce(x);  // enqueued behind the hold: it cannot run, and the call does not wait for it
    EXPECT_LT(seconds_since(start), 0.5) << "all_reduce waited on the host";
    std::this_thread::sleep_for(std::chrono::seconds(3));  // 1 s past the timeout: the watchdog failed it
    EXPECT_FALSE(hold.expired());
  }
  const std::string want = "all_reduce of 1000 elements did not finish within 2 s on rank " + std::to_string(r) +
                           " of " + std::to_string(n);
  const std::string waited = error_of([&] { c->synchronize(); });
  EXPECT_NE(waited.find(want), std::string::npos) << waited;
  const std::string next = error_of([&] { c->all_reduce(x); });
  EXPECT_NE(next.find("all_reduce on a communicator that failed before"), std::string::npos) << next;
  EXPECT_NE(next.find(want), std::string::npos) << next;
  const auto start = Clock::now();
  c.reset();
  EXPECT_LT(seconds_since(start), 10.0) << "the destructor of the failed communicator";
  comm().barrier();  // the job's communicator is untouched
}

TEST(NcclAsync, ManyCollectivesReturnBeforeTheyRunAndGiveTheRightValues) {
  SKIP_WITHOUT_NCCL();
  auto c = make_nccl(60.0);
  const int r = c->rank(), n = c->size();
  const auto opts = at::TensorOptions().device(device());
  at::Tensor warm = at::zeros({4}, opts);
  c->all_reduce(warm);
  c->synchronize();
  constexpr int kCalls = 200;
  std::vector<at::Tensor> xs;
  for (int k = 0; k < kCalls; ++k) xs.push_back(at::full({4}, static_cast<double>(k + r), opts));  // before the hold
  {
    StreamHold hold(/*deadline_s=*/30);
    const auto start = Clock::now();
    for (at::Tensor& x : xs) c->all_reduce(x);  // none of them can run yet
    EXPECT_LT(seconds_since(start), 5.0) << kCalls << " all_reduces behind a held stream";
    EXPECT_FALSE(hold.expired()) << "a collective waited on the host for the held stream";
  }
  // Ordered before the caller stream's later work (.cpu() reads through it): no synchronize() needed.
  for (int k = 0; k < kCalls; ++k)
    EXPECT_TRUE(bitwise_equal(xs[k], at::full({4}, static_cast<double>(n * k + n * (n - 1) / 2), at::kFloat)))
        << "all_reduce " << k;
  c->synchronize();
  // And with the hosts in step: barrier() waits for it.
  c->barrier();
}

TEST(NcclAsync, OrderingAfterOneCollectiveDoesNotWaitForLaterOnes) {
  SKIP_WITHOUT_NCCL();
  auto c = make_nccl(60.0);
  const int n = c->size();
  const auto opts = at::TensorOptions().device(device());
  at::Tensor a = at::ones({1024}, opts), b = at::ones({16}, opts), seen = at::zeros({1024}, opts);
  c->all_reduce(b);  // first use before any hold
  c->synchronize();
  const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(device().index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device().index());
  const int64_t before = c->collectives_issued();
  cudaEvent_t reached = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&reached, cudaEventDisableTiming), cudaSuccess);
  bool main_ran_on = false;
  {
    ld::DeferredStreamWaits deferred(*c);
    c->all_reduce(a);  // collective `before + 1`, free to run
    const int64_t first = c->collectives_issued();
    EXPECT_EQ(first, before + 1);
    std::unique_ptr<StreamHold> hold;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      hold = std::make_unique<StreamHold>(/*deadline_s=*/30);
      c->all_reduce(b);  // ordered after the held side stream: it cannot run until the hold lets go
    }
    EXPECT_EQ(c->collectives_issued(), before + 2);
    c->order_after_collective(first);  // the main stream waits for `a` only
    seen.copy_(a);
    ASSERT_EQ(cudaEventRecord(reached, main.stream()), cudaSuccess);
    const auto start = Clock::now();
    while (seconds_since(start) < 20 && !main_ran_on) {
      main_ran_on = cudaEventQuery(reached) == cudaSuccess;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_FALSE(hold->expired());
    hold.reset();  // lets `b` run
  }
  EXPECT_TRUE(main_ran_on) << "the main stream waited for a collective issued after the one it asked for";
  c->order_after_collective(c->collectives_issued());
  EXPECT_TRUE(bitwise_equal(seen, at::full({1024}, static_cast<double>(n), at::kFloat)));
  EXPECT_TRUE(bitwise_equal(b, at::full({16}, static_cast<double>(n * n), at::kFloat)));  // all-reduced twice
  const std::string error = error_of([&] { c->order_after_collective(c->collectives_issued() + 1); });
  EXPECT_NE(error.find("order_after_collective(" + std::to_string(before + 3) + "): " + std::to_string(before + 2) +
                       " collectives were issued"), std::string::npos) << error;
  cudaEventDestroy(reached);
  c->synchronize();
}

TEST(NcclAsync, ACollectiveDuringAGraphCaptureIsRefusedAndChangesNothing) {
  SKIP_WITHOUT_NCCL();
  auto c = make_nccl(60.0);
  const int n = c->size();
  at::Tensor x = at::ones({8}, at::TensorOptions().device(device()));
  std::string error;
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool(false, device().index()));
    at::cuda::CUDAGraph graph;
    graph.capture_begin();
    error = error_of([&] { c->all_reduce(x); });
    graph.capture_end();
  }
  EXPECT_NE(error.find("all_reduce: the caller's stream is capturing a CUDA graph"), std::string::npos) << error;
  c->all_reduce(x);  // still usable
  c->synchronize();
  EXPECT_TRUE(bitwise_equal(x, at::full({8}, static_cast<double>(n), at::kFloat)));
}

TEST(NcclAsync, TheTimelineHasEachCollectiveAndMarkInTheOrderTheGpuRanThem) {
  SKIP_WITHOUT_NCCL();
  auto c = make_nccl(60.0);
  at::Tensor x = at::ones({1 << 20}, at::TensorOptions().device(device()));
  c->all_reduce(x);  // connected before the timeline
  c->synchronize();
  c->start_timeline();
  c->all_reduce(x);
  c->mark("between");  // on the caller's stream, which waits for the all_reduce
  c->all_reduce(x);
  const auto t = c->timeline();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].what, "all_reduce");
  EXPECT_EQ(t[0].numel, 1 << 20);
  EXPECT_GE(t[0].start_ms, 0.0);
  EXPECT_LE(t[0].start_ms, t[0].end_ms);
  EXPECT_EQ(t[1].what, "between");
  EXPECT_EQ(t[1].numel, 0);
  EXPECT_GE(t[1].start_ms, t[0].end_ms);
  EXPECT_GE(t[2].start_ms, t[1].start_ms);
  EXPECT_TRUE(c->timeline().empty()) << "timeline() stops the recording";
  EXPECT_TRUE(bitwise_equal(x, at::full({1 << 20}, std::pow(static_cast<double>(c->size()), 3), at::kFloat)));
}

// The host runs ahead of the device (here: the device held up for about a second at the start of a
// step), yet a fully sharded step reserves memory for a few units' transient buffers, not for every
// unit's: the caching allocator can hand a buffer a collective used out again only once that
// collective finished, so without a bound on how far the host runs ahead each unit's gathered
// parameters and gradient buffer would be reserved anew (24 units x 2 x 16 MiB here).
TEST(NcclAsync, AFullyShardedStepAheadOfTheDeviceReservesAFewUnitsNotEvery) {
  SKIP_WITHOUT_NCCL();
  std::shared_ptr<ld::NcclCommunicator> c = make_nccl(60.0);
  constexpr int kUnits = 24;
  constexpr int64_t kWidth = 2048;  // 16 MiB of float32 weights per unit: the allocator's large blocks
  constexpr int64_t kUnitBytes = kWidth * kWidth * 4;
  torch::manual_seed(7);
  auto root = std::make_shared<torch::nn::Module>();
  std::vector<torch::nn::Linear> layers;
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (int u = 0; u < kUnits; ++u) {
    layers.push_back(root->register_module(
        "layer" + std::to_string(u), torch::nn::Linear(torch::nn::LinearOptions(kWidth, kWidth).bias(false))));
    layers.back()->to(device());
    units.push_back(layers.back().ptr());
  }
  std::vector<at::Tensor> params = root->parameters();
  ld::FullyShardedModule fsdp(root, units, std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3)), c);
  const at::Tensor x = at::randn({8, kWidth}, at::TensorOptions().device(device()));
  const auto step = [&](bool hold_device) {
    if (hold_device) at::cuda::sleep(int64_t(2'000'000'000));  // about a second of the caller's stream
    at::Tensor y = fsdp.forward([&] {
      at::Tensor h = x;
      for (int u = 0; u < kUnits; ++u) h = fsdp.unit(static_cast<size_t>(u), [&] { return layers[u]->forward(h); });
      return h;
    });
    y.square().mean().backward();
    fsdp.step();
    fsdp.zero_grad();
  };
  step(false);  // the first step's own allocations
  c->synchronize();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  namespace alloc = c10::cuda::CUDACachingAllocator;
  constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  alloc::emptyCache();
  const int64_t before = alloc::getDeviceStats(device().index()).reserved_bytes[kAll].current;
  alloc::resetPeakStats(device().index());
  step(true);
  c->synchronize();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t grew = alloc::getDeviceStats(device().index()).reserved_bytes[kAll].peak - before;
  EXPECT_LE(grew, 16 * kUnitBytes) << "a step reserved " << grew / kUnitBytes << " units' worth of memory anew";
  EXPECT_GE(grew, 2 * kUnitBytes) << "the step should need at least two units' buffers";
}

}  // namespace
}  // namespace lowbit_test

#endif  // LOWBIT_WITH_NCCL
