// QuantizedLinear and QuantizedEmbedding: what qat::convert turns the fake-quantized modules into.
// Weights are stored as packed integer codes (bits <= 4: two per byte; else one) plus a float32
// scale and zero point per group; forward dequantizes them with the same formula the fake quantizer
// applied, so in float32 the outputs equal the fake-quantized model's bit for bit.
// Save and load with torch::save / torch::load into a module of the same options (for example the
// result of prepare + convert on a freshly built model).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "fake_quantized_modules.h"

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

  QuantizedLinearOptions options;
  int64_t group_size;       // elements per (scale, zero point), along each row
  at::Tensor packed;        // uint8 [out, packed bytes per row]
  at::Tensor scale, zero_point;  // float32 [out * in / group_size]
  at::Tensor bias;
  FakeQuantizer activation_fake_quant{nullptr};
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
  at::Tensor packed, scale, zero_point;
};
TORCH_MODULE(QuantizedEmbedding);

// Row-wise packing of uint8 codes [rows, cols]: each row packs on its own (a 4-bit row of odd
// length gets a zero tail nibble), so rows can be selected from the packed tensor.
at::Tensor pack_rows(const at::Tensor& codes, int64_t bits);
at::Tensor unpack_rows(const at::Tensor& packed, int64_t bits, int64_t cols);
int64_t packed_row_bytes(int64_t cols, int64_t bits);

}  // namespace qat
}  // namespace lowbit
