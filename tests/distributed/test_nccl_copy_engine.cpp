// NcclOptions::copy_engine_gathers: gather_buffer() memory is NCCL symmetric memory, and an
// all-gather within it runs on the copy-engine communicator (with copy_engine_reductions a
// reduce-scatter from it too). The values are NCCL's kernels', bit for bit; buffers dropped are
// given to the next request of their size; the sharded optimizer over such a communicator matches
// one process as over the plain one; unset, the options follow whether NCCL has copy engines. Over
// NCCL only (--cuda).
#include "dist_util.h"

#include <lowbit/build_config.h>

#if LOWBIT_WITH_NCCL

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

namespace lowbit_test {
namespace {

std::shared_ptr<ld::NcclCommunicator> make_copy_engine_nccl(bool reductions = false) {
  ld::NcclOptions no;
  no.timeout_s = 120;
  no.copy_engine_gathers = true;
  no.copy_engine_reductions = reductions;
  return nccl_of_the_job(no);
}


TEST(NcclCopyEngine, GathersIntoItsBuffersWhatThePlainCommunicatorGathers) {
  SKIP_WITHOUT_NCCL();
  auto c = make_copy_engine_nccl();
  const int r = c->rank(), n = c->size();
  const auto opts = at::TensorOptions().device(device());
  for (const int64_t chunk : {int64_t{1}, int64_t{4097}, int64_t{1} << 20}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor mine = (at::arange(chunk, opts.dtype(at::kFloat)) * 3 + r * 1000003).to(dtype);
      // In place, as the sharded optimizer gathers: the input is the buffer's own chunk.
      at::Tensor buf = c->gather_buffer(chunk * n, opts.dtype(dtype));
      buf.narrow(0, r * chunk, chunk).copy_(mine);
      c->all_gather(buf.narrow(0, r * chunk, chunk), buf);
      at::Tensor want = at::empty({chunk * n}, opts.dtype(dtype));
      comm().all_gather(mine, want);
      EXPECT_TRUE(bitwise_equal(buf.cpu(), want.cpu())) << "chunk " << chunk << " " << dtype;
      // A group of two, one of them out of place; and one output outside the buffers (the plain path).
      at::Tensor other = c->gather_buffer(chunk * n, opts.dtype(dtype));
      at::Tensor plain = at::empty({chunk * n}, opts.dtype(dtype));
      c->all_gather_many({buf.narrow(0, r * chunk, chunk), mine}, {other, plain});
      EXPECT_TRUE(bitwise_equal(other.cpu(), want.cpu())) << "chunk " << chunk << " " << dtype;
      EXPECT_TRUE(bitwise_equal(plain.cpu(), want.cpu())) << "chunk " << chunk << " " << dtype;
    }
  }
  c->synchronize();
}

TEST(NcclCopyEngine, ADroppedBufferIsGivenToTheNextRequestOfItsSize) {
  SKIP_WITHOUT_NCCL();
  auto c = make_copy_engine_nccl();
  const auto opts = at::TensorOptions().device(device());
  at::Tensor a = c->gather_buffer(1000 * c->size(), opts);
  const void* first = a.data_ptr();
  a = at::Tensor();
  at::Tensor b = c->gather_buffer(1000 * c->size(), opts);
  EXPECT_EQ(b.data_ptr(), first);
  at::Tensor d = c->gather_buffer(1000 * c->size(), opts);  // b still held: a new one
  EXPECT_NE(d.data_ptr(), first);
  at::Tensor e = c->gather_buffer(999 * c->size(), opts);  // another size
  EXPECT_NE(e.data_ptr(), first);
  EXPECT_NE(e.data_ptr(), d.data_ptr());
  // Held past the communicator: still usable memory, freed when dropped.
  c->synchronize();
  c.reset();
  b.fill_(1.0f);
  EXPECT_EQ(b.sum().item<double>(), static_cast<double>(b.numel()));
  b = d = e = at::Tensor();
}

TEST(NcclCopyEngine, BadBufferRequestsAreClearErrors) {
  SKIP_WITHOUT_NCCL();
  auto c = make_copy_engine_nccl();
  // (numel < 0: every communicator's, in expect_bad_arguments_named)
  const std::string cpu = error_of([&] { c->gather_buffer(4, at::TensorOptions()); });
  EXPECT_NE(cpu.find("gather_buffer: the buffer must be on this communicator's device"), std::string::npos) << cpu;
}

TEST(NcclCopyEngine, TheShardedOptimizerOverItMatchesOneProcess) {
  SKIP_WITHOUT_NCCL();
  expect_sharded_over_matches_one_process(make_copy_engine_nccl());
  expect_sharded_over_matches_one_process(make_copy_engine_nccl(/*reductions=*/true));
}

// copy_engine_reductions: a float32 reduce-scatter from a gather_buffer() exchanges its chunks on
// the copy engines and sums them in rank order; integers in float32 sum exactly in any order, so
// the plain communicator's result is the bits to get. Others (bfloat16, inputs outside the
// buffers) take NCCL's kernels.
TEST(NcclCopyEngine, ReducesFromItsBuffersWhatThePlainCommunicatorReduces) {
  SKIP_WITHOUT_NCCL();
  auto c = make_copy_engine_nccl(/*reductions=*/true);
  const int r = c->rank(), n = c->size();
  const auto opts = at::TensorOptions().device(device());
  for (const int64_t chunk : {int64_t{1}, int64_t{4097}, int64_t{1} << 20}) {
    for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (const ld::ReduceOp op : {ld::ReduceOp::Sum, ld::ReduceOp::Avg}) {
        SCOPED_TRACE(c10::str("chunk ", chunk, " ", dtype, op == ld::ReduceOp::Avg ? " avg" : " sum"));
        const at::Tensor values = (at::arange(chunk * n, opts.dtype(at::kFloat)).remainder(251) + r * 7).to(dtype);
        at::Tensor buf = c->gather_buffer(chunk * n, opts.dtype(dtype));
        buf.copy_(values);
        at::Tensor got = at::full({chunk}, -1.0, opts.dtype(dtype)), want = at::empty({chunk}, opts.dtype(dtype));
        c->reduce_scatter(buf, got, op);
        comm().reduce_scatter(values, want, op);
        EXPECT_TRUE(bitwise_equal(got.cpu(), want.cpu()));
        EXPECT_TRUE(bitwise_equal(buf.cpu(), values.cpu())) << "the input is left as it was";
        // Again (the scratch buffer of this size reused), and from plain memory (NCCL's kernels).
        at::Tensor again = at::empty({chunk}, opts.dtype(dtype)), plain = at::empty({chunk}, opts.dtype(dtype));
        c->reduce_scatter(buf, again, op);
        c->reduce_scatter(values, plain, op);
        EXPECT_TRUE(bitwise_equal(again.cpu(), want.cpu()));
        EXPECT_TRUE(bitwise_equal(plain.cpu(), want.cpu()));
      }
    }
  }
  c->synchronize();
}

// Unset, the options follow NCCL's own verdict, the same on every rank. The test's verdict comes
// from CUDA instead: the jobs run one node, so NCCL has copy engines exactly where every pair of the
// ranks' GPUs can reach the other directly, unless NCCL_P2P_DISABLE says otherwise (the driver and
// NCCL of the GPU machines are new enough).
TEST(NcclCopyEngine, UnsetOptionsFollowWhetherNcclHasCopyEngines) {
  SKIP_WITHOUT_NCCL();
  ld::NcclOptions no;
  no.timeout_s = 120;
  auto c = nccl_of_the_job(no);
  const ld::CopyEngineUse& use = c->copy_engines();
  EXPECT_TRUE(use.automatic);
  EXPECT_EQ(use.gathers, use.reductions);
  const int n = c->size();
  const char* p2p = std::getenv("NCCL_P2P_DISABLE");
  bool expected = n > 1 && !(p2p && std::atoi(p2p) != 0);
  int devices = 0;
  cudaGetDeviceCount(&devices);
  ASSERT_GE(devices, n) << "one GPU per rank on this node";
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      int can = 1;
      if (a != b) cudaDeviceCanAccessPeer(&can, a, b);
      expected = expected && can;
    }
  EXPECT_EQ(use.gathers, expected) << use.why_not;
  EXPECT_EQ(use.why_not.empty(), expected) << use.why_not;
  if (n == 1) {
    EXPECT_EQ(use.why_not, "one rank");
  } else if (p2p && std::atoi(p2p) != 0) {
    EXPECT_NE(use.why_not.find("NCCL_P2P_DISABLE=" + std::string(p2p) + " on rank 0"), std::string::npos) << use.why_not;
  }
  // The same on every rank.
  at::Tensor mine = at::full({1}, use.gathers ? 1 : 0, at::TensorOptions().dtype(at::kInt).device(device()));
  at::Tensor all = at::empty({n}, mine.options());
  comm().all_gather(mine, all);
  EXPECT_EQ(all.sum().item<int>(), use.gathers ? n : 0);
  // Either way the sharded optimizer over it matches one process.
  expect_sharded_over_matches_one_process(std::move(c));
  // Forced, nothing is decided: reductions forced on force the gathers; gathers forced off leave
  // the reductions off.
  no.copy_engine_reductions = true;
  auto forced = nccl_of_the_job(no);
  EXPECT_FALSE(forced->copy_engines().automatic);
  EXPECT_TRUE(forced->copy_engines().gathers && forced->copy_engines().reductions);
  forced.reset();
  no.copy_engine_reductions.reset();
  no.copy_engine_gathers = false;
  forced = nccl_of_the_job(no);
  EXPECT_FALSE(forced->copy_engines().automatic);
  EXPECT_FALSE(forced->copy_engines().gathers || forced->copy_engines().reductions);
}

TEST(NcclCopyEngine, ReductionsWithoutGathersAreRefused) {
  SKIP_WITHOUT_NCCL();
  ld::NcclOptions no;
  no.copy_engine_gathers = false;
  no.copy_engine_reductions = true;
  const std::string e = error_of([&] { nccl_of_the_job(no); });
  EXPECT_NE(e.find("NcclOptions::copy_engine_reductions reduces from the buffers copy_engine_gathers makes"),
            std::string::npos) << e;
}

// Ranks that ask for different copy-engine options would run different collectives (one an
// all-to-all, the other a reduce-scatter; a split the other never joins): every rank is refused at
// construction, naming the option and the rank.
TEST(NcclCopyEngine, RanksWithDifferentOptionsAreRefused) {
  SKIP_WITHOUT_NCCL();
  if (comm().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool last = comm().rank() == comm().size() - 1;
  ld::NcclOptions gathers;
  gathers.timeout_s = 120;
  if (!last) gathers.copy_engine_gathers = true;  // the last rank's unset
  std::string e = error_of([&] { nccl_of_the_job(gathers); });
  const std::string r = std::to_string(comm().size() - 1);
  EXPECT_NE(e.find("NcclCommunicator: the ranks disagree on NcclOptions::copy_engine_gathers: rank 0 has true, rank " +
                   r + " has unset (automatic); every rank must construct its NcclCommunicator with the same NcclOptions"),
            std::string::npos)
      << e;
  ld::NcclOptions reductions = gathers;
  reductions.copy_engine_gathers = true;
  reductions.copy_engine_reductions = !last;
  e = error_of([&] { nccl_of_the_job(reductions); });
  EXPECT_NE(e.find("the ranks disagree on NcclOptions::copy_engine_reductions: rank 0 has true, rank " + r +
                   " has false"),
            std::string::npos)
      << e;
  // The job's communicator is untouched and works.
  at::Tensor t = at::ones({3}, at::TensorOptions().device(device()));
  comm().all_reduce(t);
  EXPECT_EQ(t.sum().item<float>(), 3.0f * comm().size());
}

}  // namespace
}  // namespace lowbit_test

#endif  // LOWBIT_WITH_NCCL
