// FakeQuantizedLinear and FakeQuantizedEmbedding: what qat::prepare swaps Linear and Embedding for.
// They share the original module's weight and bias tensors, so an optimizer built before prepare()
// keeps stepping the same parameters.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "fake_quantizer.h"

namespace lowbit {
namespace qat {

class FakeQuantizedLinearImpl : public torch::nn::Module {
 public:
  // activation: the input's fake quantization (none: inputs stay in float); weight: the weight's.
  FakeQuantizedLinearImpl(const torch::nn::Linear& linear, std::optional<FakeQuantConfig> activation,
                          std::optional<FakeQuantConfig> weight, const std::string& name = "FakeQuantizedLinear");
  at::Tensor forward(const at::Tensor& x);
  // The weight as forward uses it now (fake-quantized when the weight quantizer is active).
  at::Tensor fake_quantized_weight();

  int64_t in_features, out_features;
  at::Tensor weight, bias;  // bias undefined when the Linear had none
  FakeQuantizer activation_fake_quant{nullptr}, weight_fake_quant{nullptr};
  std::string name;
};
TORCH_MODULE(FakeQuantizedLinear);

class FakeQuantizedEmbeddingImpl : public torch::nn::Module {
 public:
  // weight: PerChannel (axis 0), PerToken or PerGroup with Dynamic qparams, so that each row is
  // quantized on its own and a batch fake-quantizes only the rows it looks up.
  FakeQuantizedEmbeddingImpl(const torch::nn::Embedding& embedding, FakeQuantConfig weight,
                             const std::string& name = "FakeQuantizedEmbedding");
  at::Tensor forward(const at::Tensor& indices);

  int64_t num_embeddings, embedding_dim;
  at::Tensor weight;
  FakeQuantizer weight_fake_quant{nullptr};
  std::string name;
};
TORCH_MODULE(FakeQuantizedEmbedding);

// The unique rows of `indices` (sorted) and where each index finds its row among them.
std::tuple<at::Tensor, at::Tensor> unique_rows(const at::Tensor& indices, int64_t num_rows, const std::string& who);

}  // namespace qat
}  // namespace lowbit
