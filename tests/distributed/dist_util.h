// Shared by the distributed tests (run under mpirun): the job's communicator and device, gradients
// whose sums over ranks are exact, and the model every test shards.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lowbit/build_config.h>
#include <lowbit/distributed/distributed.h>
#include <lowbit/optim/fragment_access.h>
#if LOWBIT_WITH_NCCL
#include <lowbit/distributed/mpi_communicator.h>
#include <lowbit/distributed/nccl_communicator.h>
#endif

#include "../rule_cases.h"
#include "../test_util.h"

namespace lowbit_test {

namespace ld = lowbit::distributed;

// Set up by main.cpp: the communicator of the job (MPI, or NCCL with --cuda) and its device.
ld::Communicator& comm();
std::shared_ptr<ld::Communicator> comm_ptr();
at::Device device();

// The tests of NcclCommunicator itself: over NCCL only (--cuda).
#define SKIP_WITHOUT_NCCL() \
  if (!device().is_cuda()) GTEST_SKIP() << "NcclCommunicator only (--cuda)"

#if LOWBIT_WITH_NCCL
// A NCCL communicator of the job's ranks of its own (collective: every rank makes it) with `options`,
// bootstrapped by an MPI communicator of its own.
inline std::unique_ptr<ld::NcclCommunicator> nccl_of_the_job(const ld::NcclOptions& options) {
  ld::MpiOptions mo;
  mo.timeout_s = 120;
  auto bootstrap = std::make_shared<ld::MpiCommunicator>(MPI_COMM_WORLD, mo);
  return std::make_unique<ld::NcclCommunicator>(bootstrap, device().index(), options);
}
#endif

// Rank r's gradient of parameter k at step s: small integers / 64, so the ranks' sum is exact in
// float32 whatever order the collective adds them in, and sum / N is one rounding everywhere.
inline at::Tensor rank_grad(int rank, int step, int k, at::IntArrayRef shape, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000003ull * step + 7919ull * k + 31ull * rank + 17);
  return (at::randint(-8, 9, shape, gen, at::kFloat) / 64.0).to(dtype);
}

// What one process sees: the average of every rank's gradient, summed in rank order then / N.
inline at::Tensor mean_grad(int world, int step, int k, at::IntArrayRef shape, at::ScalarType dtype) {
  at::Tensor s = at::zeros(shape, at::kFloat);
  for (int r = 0; r < world; ++r) s += rank_grad(r, step, k, shape, dtype).to(at::kFloat);
  return (s / world).to(dtype);
}

// Parameter shapes: quantized ones (>= 4096 elements) and small FP32-state ones, sized so the
// ranks' ranges cut through parameters at 1, 2 and 3 ranks.
inline std::vector<std::vector<int64_t>> model_shapes() {
  return {{5000}, {64, 100}, {300}, {3, 4097}, {7}, {2048}};
}

inline std::vector<at::Tensor> make_params(at::ScalarType dtype, at::Device dev) {
  std::vector<at::Tensor> ps;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  for (const auto& s : model_shapes())
    ps.push_back(at::randn(s, gen, at::kFloat).to(dtype).to(dev).set_requires_grad(true));
  return ps;
}

// Shared checks, run on the job's communicator and on the others the tests build (a c10d one).
// test_communicator.cpp: every collective against values each rank computes itself; bad arguments
// are errors naming the collective and the argument, and leave the communicator usable.
void expect_expected_values(ld::Communicator& c);
// A communicator over the job's ranks (a c10d one): its backend's name, the job's rank and size,
// and expect_expected_values.
void expect_a_communicator_of_the_job(ld::Communicator& c, const char* backend);
void expect_bad_arguments_named(ld::Communicator& c);
// Every collective of `c` against the job's communicator on the same inputs (on device()), bit for
// bit, for each dtype in `types`, sum and average, 1 to 4099 elements (the c10d communicators' test).
void expect_collectives_equal_the_jobs(ld::Communicator& c, const std::vector<at::ScalarType>& types);

// test_sharded_equality.cpp: a ShardedOptimizer over `c` (null: the job's) against one unsharded
// process fed the averaged gradients, parameters and every fragment's state bit for bit.
using Factory = std::function<std::unique_ptr<lo::LowbitOptimizer>(std::vector<at::Tensor>&)>;
// Rank r's gradient of parameter k at step s (CPU); the reference gets the mean over ranks of it.
using GradFn = std::function<at::Tensor(int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype)>;
at::Tensor default_grad(int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype);
struct Outcome {
  int64_t sharded_state_bytes = 0, unsharded_state_bytes = 0;
};
// With so.overlap the gradients come through backward() (backward_with), and a GradFn may return an
// undefined tensor: that parameter is unused on that rank (the reference: the mean of the others
// with zeros for it, no gradient where no rank has one).
Outcome expect_same_as_one_process(const Factory& make, at::ScalarType dtype, ld::ShardedOptions so, int steps,
                                   const GradFn& grad = default_grad, std::shared_ptr<ld::Communicator> c = nullptr);

// The ShardedOptimizer over `c` against one process: every rule with Q8, Q4 and FP32 state; bf16
// parameters with stochastic rounding; ZeRO-1; overlap with small buckets (every rule, Q4).
void expect_sharded_over_matches_one_process(const std::shared_ptr<ld::Communicator>& c);
// The sharded parameters and every fragment's state against one process's, bit for bit, and the
// skipped steps (the sharded side's `extra_skipped` more: steps it skipped only in part).
void expect_same_as(const ld::ShardedOptimizer& sharded, const std::vector<at::Tensor>& params,
                    const lo::LowbitOptimizer& ref, const std::vector<at::Tensor>& ref_params,
                    int64_t extra_skipped = 0);
// One backward() whose gradient of params[k] is grads[k] exactly (undefined: params[k] unused).
void backward_with(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads);

// Clipping and the non-finite skip with `so`: one gradient on every rank (the mean and the squares
// clipping adds are exact, so one process's norm is reached in any order), and at step 2 an Inf
// from the last rank only, which every rank must skip; AdamW and LAMB, Q8 and FP32.
void expect_clipping_and_skip_like_one_process(const ld::ShardedOptions& so);

// The owner's sum over the low-bit gradient wire, replayed in one process: chunk c of the result is
// the float32 sum in rank order of every rank's decoded chunk c, rank c's own exact (exact[c]),
// divided once by the world size and rounded once to `dtype`. exact / decoded: each rank's flat
// buffer of world chunks of `chunk` elements.
inline at::Tensor wire_chunk_mean(const std::vector<at::Tensor>& exact, const std::vector<at::Tensor>& decoded,
                                  int64_t chunk, at::ScalarType dtype) {
  const int world = static_cast<int>(exact.size());
  at::Tensor mean = at::empty({world * chunk}, at::TensorOptions().dtype(dtype));
  for (int c = 0; c < world; ++c) {
    at::Tensor sum = at::empty({chunk}, at::kFloat);
    for (int r = 0; r < world; ++r) {
      const at::Tensor row = r == c ? exact[r].narrow(0, c * chunk, chunk).to(at::kFloat) : decoded[r].narrow(0, c * chunk, chunk);
      if (r == 0) sum.copy_(row); else sum.add_(row);
    }
    mean.narrow(0, c * chunk, chunk).copy_(sum.div_(world));
  }
  return mean;
}

// Another communicator's collectives passed through; a test overrides the one it breaks.
class ForwardingCommunicator : public ld::Communicator {
 public:
  explicit ForwardingCommunicator(std::shared_ptr<ld::Communicator> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  const char* backend() const override { return c_->backend(); }
  void all_reduce(at::Tensor& t, ld::ReduceOp op) override { c_->all_reduce(t, op); }
  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ld::ReduceOp op) override { c_->reduce_scatter(in, out, op); }
  void all_gather(const at::Tensor& in, at::Tensor& out) override { c_->all_gather(in, out); }
  void all_to_all(const at::Tensor& in, at::Tensor& out) override { c_->all_to_all(in, out); }
  void broadcast(at::Tensor& t, int root) override { c_->broadcast(t, root); }
  void barrier() override { c_->barrier(); }

 private:
  std::shared_ptr<ld::Communicator> c_;
};

}  // namespace lowbit_test
