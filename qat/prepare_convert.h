// qat::prepare and qat::convert: walk a module tree and swap modules.
//   prepare: Linear -> FakeQuantizedLinear, Embedding -> FakeQuantizedEmbedding (per QatConfig).
//   convert: FakeQuantizedLinear -> QuantizedLinear, FakeQuantizedEmbedding -> QuantizedEmbedding.
// Both return the root to use from now on: the same module with children replaced
// (Module::replace_module), or a new Sequential when the root is a Sequential (a Sequential's
// forward runs its own list, which replace_module does not update, so Sequentials are rebuilt).
//
// libtorch limit to know: a custom module whose forward calls a child through its own member
// holder (`fc1(x)` with `torch::nn::Linear fc1`) keeps calling the old child after the swap. Build
// models from Sequential, or call children through named_children() / a registered AnyModule.
#pragma once

#include <torch/torch.h>

#include <memory>

#include "fake_quant_config.h"

namespace lowbit {
namespace qat {

std::shared_ptr<torch::nn::Module> prepare(const std::shared_ptr<torch::nn::Module>& root, const QatConfig& config);
std::shared_ptr<torch::nn::Module> convert(const std::shared_ptr<torch::nn::Module>& root);

// Every FakeQuantizer under root (in FakeQuantizedLinear / FakeQuantizedEmbedding modules or standalone).
void enable_fake_quant(const std::shared_ptr<torch::nn::Module>& root, bool on = true);
void set_start_step(const std::shared_ptr<torch::nn::Module>& root, int64_t steps);

// Sequential overloads, returning a Sequential (what users of torch::nn::Sequential want).
torch::nn::Sequential prepare(const torch::nn::Sequential& root, const QatConfig& config);
torch::nn::Sequential convert(const torch::nn::Sequential& root);

}  // namespace qat
}  // namespace lowbit
