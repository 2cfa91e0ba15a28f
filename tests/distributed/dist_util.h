// Shared by the distributed tests (run under mpirun): the job's communicator and device, gradients
// whose sums over ranks are exact, and the model every test shards.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lowbit/distributed/distributed.h>
#include <lowbit/optim/fragment_access.h>

#include "../rule_cases.h"
#include "../test_util.h"

namespace lowbit_test {

namespace ld = lowbit::distributed;

// Set up by main.cpp: the communicator of the job (MPI, or NCCL with --cuda) and its device.
ld::Communicator& comm();
std::shared_ptr<ld::Communicator> comm_ptr();
at::Device device();

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

}  // namespace lowbit_test
