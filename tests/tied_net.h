// A small network with a shared (tied) weight used twice, so one parameter's gradient has two
// contributions that backward() sums before its post-accumulate hook runs: the model of the tests
// of gradient release and host offload, and its loss on a fixed batch.
#pragma once

#include <torch/torch.h>

namespace lowbit_test {

struct TiedNet : torch::nn::Module {
  TiedNet() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 96));
    fc2 = register_module("fc2", torch::nn::Linear(96, 96));
    out = register_module("out", torch::nn::Linear(96, 10));
  }
  at::Tensor forward(at::Tensor x) {
    x = torch::tanh(fc1(x));
    x = torch::tanh(fc2(x));
    x = torch::tanh(fc2(x));  // fc2 twice
    return out(x);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};

// The cross-entropy of batch `batch` (drawn from its own seed), computed in the network's dtype and
// on its device, the loss in float32.
inline at::Tensor loss_of(TiedNet& net, int64_t batch) {
  torch::manual_seed(1000 + batch);
  const at::Tensor x = torch::randn({32, 64}), y = torch::randint(10, {32});
  const at::TensorOptions like = net.fc1->weight.options();
  return torch::nn::functional::cross_entropy(net.forward(x.to(like.device(), like.dtype())).to(at::kFloat),
                                              y.to(like.device()));
}

}  // namespace lowbit_test
