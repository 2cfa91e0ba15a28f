// The Fashion-MNIST pieces the examples share: the data (normalized), the small CNN, and a lowbit
// optimizer by name. Used by examples/fashion_mnist and examples/distributed.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <lowbit/lowbit.h>

#include "../idx_reader.h"

namespace lowbit_examples {

struct FashionMnist {
  at::Tensor train_x, train_y, test_x, test_y;  // images [N, 28, 28] float (normalized), labels [N] int64
};

inline FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDir) {
  auto images = [&](const char* f) { return (read_idx_gz(dir + "/" + f).to(at::kFloat) / 255 - 0.286) / 0.353; };
  auto labels = [&](const char* f) { return read_idx_gz(dir + "/" + f).to(at::kLong); };
  return {images("train-images-idx3-ubyte.gz"), labels("train-labels-idx1-ubyte.gz"),
          images("t10k-images-idx3-ubyte.gz"), labels("t10k-labels-idx1-ubyte.gz")};
}

struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 7 * 7, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  at::Tensor forward(at::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

inline std::unique_ptr<lowbit::optim::LowbitOptimizer> make_optimizer(const std::string& name,
                                                                      std::vector<at::Tensor> params,
                                                                      lowbit::StateFormat f, double lr) {
  namespace lo = lowbit::optim;
  if (name == "adamw") return std::make_unique<lo::AdamW>(params, lo::AdamWOptions(lr).state_format(f));
  if (name == "adam") return std::make_unique<lo::Adam>(params, lo::AdamOptions(lr).state_format(f));
  if (name == "sgd") return std::make_unique<lo::SGD>(params, lo::SGDOptions(lr).momentum(0.9).state_format(f));
  if (name == "lion") return std::make_unique<lo::Lion>(params, lo::LionOptions(lr).state_format(f));
  if (name == "rmsprop") return std::make_unique<lo::RMSprop>(params, lo::RMSpropOptions(lr).state_format(f));
  if (name == "adagrad") return std::make_unique<lo::Adagrad>(params, lo::AdagradOptions(lr).state_format(f));
  if (name == "ademamix") return std::make_unique<lo::AdEMAMix>(params, lo::AdEMAMixOptions(lr).state_format(f));
  if (name == "lamb") return std::make_unique<lo::LAMB>(params, lo::LAMBOptions(lr).state_format(f));
  throw std::runtime_error("unknown optimizer '" + name + "'; use adamw, adam, sgd, lion, rmsprop, adagrad, ademamix or lamb");
}

inline double default_lr(const std::string& name) {
  if (name == "sgd") return 0.05;
  if (name == "lion") return 1e-4;
  if (name == "adagrad") return 0.02;
  return 1e-3;
}

// Percent of the test images `net` classifies right.
inline double test_accuracy(Net& net, const FashionMnist& d, const at::Device& dev) {
  torch::NoGradGuard ng;
  net->eval();
  int64_t correct = 0;
  for (int64_t s = 0; s < d.test_x.size(0); s += 1000) {
    const int64_t len = std::min<int64_t>(1000, d.test_x.size(0) - s);
    const at::Tensor pred = net->forward(d.test_x.narrow(0, s, len).unsqueeze(1).to(dev)).argmax(1).cpu();
    correct += pred.eq(d.test_y.narrow(0, s, len)).sum().item<int64_t>();
  }
  net->train();
  return 100.0 * correct / d.test_x.size(0);
}

}  // namespace lowbit_examples
