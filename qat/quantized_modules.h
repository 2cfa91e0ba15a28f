// QuantizedLinear and QuantizedEmbedding: what qat::convert turns the fake-quantized modules into.
// Integer weights are stored as packed codes (bits <= 4: two per byte; else one) plus a float32
// scale and zero point per group; float8 / MXFP4 / NVFP4 weights as their codes and scales
// (qat/packed_weight.h). Forward dequantizes them with the same formula the fake quantizer applied,
// so in float32 the outputs equal the fake-quantized model's bit for bit.
// Save and load with torch::save / torch::load into a module of the same options (for example the
// result of prepare + convert on a freshly built model).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "fake_quantized_modules.h"
#include "packed_weight.h"

namespace lowbit {
namespace qat {

struct QuantizedLinearOptions {
  QuantizedLinearOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  TORCH_ARG(FakeQuantConfig, weight) = FakeQuantConfig::int4_per_group_symmetric();
  // Dynamic activation fake quantization applied to the input (for example int8 per token).
  TORCH_ARG(std::optional<FakeQuantConfig>, activation) = std::nullopt;
  TORCH_ARG(std::string, name) = "QuantizedLinear";
};

class QuantizedLinearImpl : public torch::nn::Module {
 public:
  // Empty codes of the right sizes (to load into).
  explicit QuantizedLinearImpl(QuantizedLinearOptions options);
  // Quantizes `source`'s weight with the qparams its weight quantizer uses now.
  static std::shared_ptr<QuantizedLinearImpl> from_fake_quantized(FakeQuantizedLinearImpl& source);

  at::Tensor forward(const at::Tensor& x);
  // The weight as float32 [out, in], dequantized from the codes.
  at::Tensor dequantized_weight() const;
  // Bytes the weight takes (codes + scales + zero points), the bias excluded.
  int64_t weight_bytes() const;
  // Opt-in: forward through an int8 x int8 matmul (qat/int_mm_linear.h: exact integer sums, scales
  // applied after, so within a proven bound of the fake-quantized model, not bit for bit), where
  // the shapes allow it (CPU: always; CUDA: at::_int_mm's constraints), else the default path.
  // Refuses configs it cannot run, naming the module and why.
  void set_int8_matmul(bool on);
  bool int8_matmul() const { return int8_matmul_; }
  // Whether the next forward of x takes the int8 path.
  bool uses_int8_matmul(const at::Tensor& x) const;

  QuantizedLinearOptions options;
  int64_t group_size;       // elements per (scale, zero point), along each row
  at::Tensor packed;        // uint8 [out, packed bytes per row]
  at::Tensor scale, zero_point;  // integer: float32 [out * in / group_size]; float formats: packed_weight.h
  at::Tensor tensor_scale;  // NVFP4 only
  at::Tensor bias;
  FakeQuantizer activation_fake_quant{nullptr};

 private:
  at::Tensor int8_forward(const at::Tensor& x2);
  bool int8_matmul_ = false;
};
TORCH_MODULE(QuantizedLinear);

struct QuantizedEmbeddingOptions {
  QuantizedEmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  TORCH_ARG(int64_t, num_embeddings);
  TORCH_ARG(int64_t, embedding_dim);
  TORCH_ARG(FakeQuantConfig, weight) = FakeQuantConfig::int4_per_group_symmetric();
  TORCH_ARG(std::string, name) = "QuantizedEmbedding";
};

class QuantizedEmbeddingImpl : public torch::nn::Module {
 public:
  explicit QuantizedEmbeddingImpl(QuantizedEmbeddingOptions options);
  static std::shared_ptr<QuantizedEmbeddingImpl> from_fake_quantized(FakeQuantizedEmbeddingImpl& source);

  // Dequantizes only the rows the batch looks up.
  at::Tensor forward(const at::Tensor& indices);
  int64_t weight_bytes() const;

  QuantizedEmbeddingOptions options;
  int64_t group_size;
  at::Tensor packed, scale, zero_point, tensor_scale;  // as in QuantizedLinear
};
TORCH_MODULE(QuantizedEmbedding);

}  // namespace qat
}  // namespace lowbit
