// FakeQuantizedLinear / FakeQuantizedEmbedding: fake-quantize the input and weight, then the plain op.
#include "fake_quantized_modules.h"

#include "group_layout.h"

namespace lowbit {
namespace qat {
namespace {

void check_linear_weight_config(const FakeQuantConfig& c, const std::string& who) {
  // Every row-local granularity works; PerChannel on axis 1 (per input column) too.
  c.validate(who);
}

void check_embedding_weight_config(const FakeQuantConfig& c, const std::string& who) {
  c.validate(who);
  const bool row_local = c.granularity() == Granularity::PerToken || c.granularity() == Granularity::PerGroup ||
                         (c.granularity() == Granularity::PerChannel && (c.axis() == 0 || c.axis() == -2));
  TORCH_CHECK(row_local, who, ": an embedding's weight config must quantize each row on its own (per-channel axis 0, "
              "per-token or per-group), got ", c.describe(), "; a batch fake-quantizes only the rows it looks up");
  TORCH_CHECK(c.qparams() == QParamsMode::Dynamic, who, ": an embedding's weight config must use Dynamic qparams, got ",
              qparams_mode_name(c.qparams()));
  TORCH_CHECK(c.format() != ValueFormat::NVFP4, who, ": NVFP4's tensor scale depends on the whole table, so an "
              "embedding cannot fake-quantize only the rows a batch looks up; use MXFP4 or an integer format");
}

}  // namespace

FakeQuantizedLinearImpl::FakeQuantizedLinearImpl(const torch::nn::Linear& linear,
                                                 std::optional<FakeQuantConfig> activation,
                                                 std::optional<FakeQuantConfig> weight_config, const std::string& name_)
    : in_features(linear->options.in_features()), out_features(linear->options.out_features()), name(name_) {
  weight = register_parameter("weight", linear->weight);
  if (linear->bias.defined()) bias = register_parameter("bias", linear->bias);
  if (activation) {
    activation->validate(name + ".input");
    to_groups(at::empty({1, in_features}), *activation, name + ".input");  // a group size must divide in_features
    activation_fake_quant = register_module("activation_fake_quant", FakeQuantizer(*activation, name + ".input"));
  }
  if (weight_config) {
    check_linear_weight_config(*weight_config, name + ".weight");
    to_groups(weight, *weight_config, name + ".weight");  // refuses a config that does not fit, now
    weight_fake_quant = register_module("weight_fake_quant", FakeQuantizer(*weight_config, name + ".weight"));
    if (weight_config->qparams() == QParamsMode::Learnable) weight_fake_quant->init_learnable(weight.detach());
  }
}

at::Tensor FakeQuantizedLinearImpl::fake_quantized_weight() {
  return weight_fake_quant ? weight_fake_quant->forward(weight) : weight;
}

at::Tensor FakeQuantizedLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor xq = activation_fake_quant ? activation_fake_quant->forward(x) : x;
  return torch::nn::functional::linear(xq, fake_quantized_weight(), bias);
}

std::tuple<at::Tensor, at::Tensor> unique_rows(const at::Tensor& indices, int64_t num_rows, const std::string& who) {
  TORCH_CHECK(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, who,
              ": indices must be int64 or int32, got ", indices.scalar_type());
  const at::Tensor flat = indices.reshape(-1).to(at::kLong);
  if (flat.numel() > 0) {
    const int64_t lo = flat.min().item<int64_t>(), hi = flat.max().item<int64_t>();
    TORCH_CHECK(lo >= 0 && hi < num_rows, who, ": index out of range [0, ", num_rows, "): found ", lo < 0 ? lo : hi);
  }
  auto [rows, inverse, counts] = at::_unique2(flat, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
  return {rows, inverse};
}

FakeQuantizedEmbeddingImpl::FakeQuantizedEmbeddingImpl(const torch::nn::Embedding& embedding,
                                                       FakeQuantConfig weight_config, const std::string& name_)
    : num_embeddings(embedding->options.num_embeddings()),
      embedding_dim(embedding->options.embedding_dim()),
      name(name_) {
  TORCH_CHECK(!embedding->options.max_norm().has_value(), name, ": max_norm embeddings are not supported by QAT");
  TORCH_CHECK(!embedding->options.padding_idx().has_value(), name,
              ": padding_idx embeddings are not supported by QAT yet (the padding row would receive gradient)");
  check_embedding_weight_config(weight_config, name + ".weight");
  weight = register_parameter("weight", embedding->weight);
  weight_fake_quant = register_module("weight_fake_quant", FakeQuantizer(weight_config, name + ".weight"));
}

at::Tensor FakeQuantizedEmbeddingImpl::forward(const at::Tensor& indices) {
  auto [rows, inverse] = unique_rows(indices, num_embeddings, name);
  // Only the touched rows are fake-quantized; each row's qparams are its own, so the result equals
  // fake-quantizing the whole table and then looking up.
  const at::Tensor q = weight_fake_quant->forward(weight.index_select(0, rows));
  std::vector<int64_t> shape = indices.sizes().vec();
  shape.push_back(embedding_dim);
  return q.index_select(0, inverse).view(shape);
}

}  // namespace qat
}  // namespace lowbit
