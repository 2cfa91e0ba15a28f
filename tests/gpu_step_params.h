// The parameters the GPU step tests step (test_optim_cuda.cpp, test_step_graphs.cpp), and copies on
// the GPU.
#pragma once

#include <torch/torch.h>

#include <vector>

namespace lowbit_test {

// Sizes: below min_quant_numel (FP32 state), empty, a few blocks and a ragged end, 2-D, one past a
// power of two.
inline std::vector<at::Tensor> make_params(at::ScalarType dt) {
  return {at::randn({3000}).to(dt), at::randn({0}).to(dt), at::randn({70001}).to(dt), at::randn({129, 65}).to(dt),
          at::randn({4097}).to(dt)};
}

inline std::vector<at::Tensor> to_cuda(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.cuda());
  return out;
}

}  // namespace lowbit_test
