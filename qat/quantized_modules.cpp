// QuantizedLinear / QuantizedEmbedding: packed integer weights, dequantized per forward with the
// fake quantizer's own formula (lowbit::dequantize_codes), so outputs match the QAT model exactly.
#include "quantized_modules.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "group_layout.h"

namespace lowbit {
namespace qat {
namespace {

c10::OperatorHandle op(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

at::Tensor quantize_codes(const at::Tensor& x, const at::Tensor& s, const at::Tensor& z, int64_t g, const FakeQuantConfig& c) {
  static auto f = op("lowbit::quantize_codes")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool)>();
  return f.call(x, s, z, g, c.bits(), c.is_signed());
}

at::Tensor dequantize_codes(const at::Tensor& codes, const at::Tensor& s, const at::Tensor& z, int64_t g,
                            const FakeQuantConfig& c) {
  static auto f = op("lowbit::dequantize_codes")
                      .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool,
                                        at::ScalarType)>();
  return f.call(codes, s, z, g, c.bits(), c.is_signed(), at::kFloat);
}

// Elements per (scale, zero point) of a [rows, cols] weight, refusing layouts that are not row-major groups.
int64_t weight_group_size(const FakeQuantConfig& c, int64_t rows, int64_t cols, const std::string& who) {
  c.validate(who);
  TORCH_CHECK(c.format() == ValueFormat::Integer, who, ": convert() stores integer codes only; ", c.describe(),
              " weights are not converted yet (keep the fake-quantized module)");
  switch (c.granularity()) {
    case Granularity::PerTensor: return std::max<int64_t>(rows * cols, 1);
    case Granularity::PerToken: return std::max<int64_t>(cols, 1);
    case Granularity::PerGroup:
      TORCH_CHECK(cols % c.group_size() == 0, who, ": group_size ", c.group_size(), " does not divide the row length ",
                  cols);
      return c.group_size();
    case Granularity::PerChannel:
      TORCH_CHECK(c.axis() == 0 || c.axis() == -2, who, ": convert() stores per-channel weights along axis 0 (rows) "
                  "only, got axis ", c.axis());
      return std::max<int64_t>(cols, 1);
  }
  TORCH_CHECK(false, who, ": unknown granularity");
}

void check_activation(const std::optional<FakeQuantConfig>& a, const std::string& who) {
  if (!a) return;
  a->validate(who);
  TORCH_CHECK(a->qparams() == QParamsMode::Dynamic, who, ": convert() supports Dynamic activation qparams only, got ",
              qparams_mode_name(a->qparams()));
}

}  // namespace

int64_t packed_row_bytes(int64_t cols, int64_t bits) { return bits <= 4 ? (cols + 1) / 2 : cols; }

at::Tensor pack_rows(const at::Tensor& codes, int64_t bits) {
  const int64_t rows = codes.size(0), cols = codes.size(1);
  if (bits > 4) return codes.contiguous();
  at::Tensor c = codes;
  if (cols % 2) c = at::cat({c, at::zeros({rows, 1}, c.options())}, 1);
  const at::Tensor pairs = c.reshape({rows, -1, 2});
  return at::bitwise_or(pairs.select(2, 0), at::bitwise_left_shift(pairs.select(2, 1), 4)).contiguous();
}

at::Tensor unpack_rows(const at::Tensor& packed, int64_t bits, int64_t cols) {
  if (bits > 4) return packed;
  const at::Tensor lo = at::bitwise_and(packed, 0xF);
  const at::Tensor hi = at::bitwise_right_shift(packed, 4);
  return at::stack({lo, hi}, 2).reshape({packed.size(0), -1}).narrow(1, 0, cols);
}

// ---- QuantizedLinear ---------------------------------------------------------------------------

QuantizedLinearImpl::QuantizedLinearImpl(QuantizedLinearOptions o) : options(std::move(o)) {
  const int64_t out = options.out_features(), in = options.in_features();
  group_size = weight_group_size(options.weight(), out, in, options.name() + ".weight");
  check_activation(options.activation(), options.name() + ".input");
  const int64_t ngroups = out * in / group_size;
  packed = register_buffer("packed", at::zeros({out, packed_row_bytes(in, options.weight().bits())}, at::kByte));
  scale = register_buffer("scale", at::ones({ngroups}));
  zero_point = register_buffer("zero_point", at::zeros({ngroups}));
  if (options.bias()) bias = register_buffer("bias", at::zeros({out}));
  if (options.activation()) {
    activation_fake_quant =
        register_module("activation_fake_quant", FakeQuantizer(*options.activation(), options.name() + ".input"));
  }
}

std::shared_ptr<QuantizedLinearImpl> QuantizedLinearImpl::from_fake_quantized(FakeQuantizedLinearImpl& src) {
  TORCH_CHECK(src.weight_fake_quant, src.name, ": convert() needs a weight fake-quant config to know the format");
  const FakeQuantConfig& wc = src.weight_fake_quant->config();
  auto q = std::make_shared<QuantizedLinearImpl>(QuantizedLinearOptions(src.in_features, src.out_features)
                                                     .bias(src.bias.defined())
                                                     .weight(wc)
                                                     .activation(src.activation_fake_quant
                                                                     ? std::optional<FakeQuantConfig>(
                                                                           src.activation_fake_quant->config())
                                                                     : std::nullopt)
                                                     .name(src.name));
  torch::NoGradGuard no_grad;
  const at::Tensor w = src.weight.detach();
  auto [s, z] = src.weight_fake_quant->qparams(w);
  const at::Tensor codes = quantize_codes(w, s, z, q->group_size, wc);
  q->to(w.device());
  q->packed.copy_(pack_rows(codes.view({src.out_features, src.in_features}), wc.bits()));
  q->scale.copy_(s.view(-1));
  q->zero_point.copy_(z.view(-1));
  if (src.bias.defined()) q->bias.copy_(src.bias.detach());
  return q;
}

at::Tensor QuantizedLinearImpl::dequantized_weight() const {
  const int64_t out = options.out_features(), in = options.in_features();
  const at::Tensor codes = unpack_rows(packed, options.weight().bits(), in);
  return dequantize_codes(codes.contiguous(), scale, zero_point, group_size, options.weight()).view({out, in});
}

at::Tensor QuantizedLinearImpl::forward(const at::Tensor& x) {
  const at::Tensor xq = activation_fake_quant ? activation_fake_quant->forward(x) : x;
  return torch::nn::functional::linear(xq, dequantized_weight().to(x.scalar_type()),
                                       bias.defined() ? bias.to(x.scalar_type()) : bias);
}

int64_t QuantizedLinearImpl::weight_bytes() const { return packed.nbytes() + scale.nbytes() + zero_point.nbytes(); }

// ---- QuantizedEmbedding ------------------------------------------------------------------------

QuantizedEmbeddingImpl::QuantizedEmbeddingImpl(QuantizedEmbeddingOptions o) : options(std::move(o)) {
  const int64_t rows = options.num_embeddings(), cols = options.embedding_dim();
  TORCH_CHECK(options.weight().granularity() != Granularity::PerTensor, options.name(),
              ".weight: an embedding's weight must be quantized row by row (per-channel axis 0, per-token or per-group)");
  group_size = weight_group_size(options.weight(), rows, cols, options.name() + ".weight");
  packed = register_buffer("packed", at::zeros({rows, packed_row_bytes(cols, options.weight().bits())}, at::kByte));
  scale = register_buffer("scale", at::ones({rows * cols / group_size}));
  zero_point = register_buffer("zero_point", at::zeros({rows * cols / group_size}));
}

std::shared_ptr<QuantizedEmbeddingImpl> QuantizedEmbeddingImpl::from_fake_quantized(FakeQuantizedEmbeddingImpl& src) {
  const FakeQuantConfig& wc = src.weight_fake_quant->config();
  auto q = std::make_shared<QuantizedEmbeddingImpl>(
      QuantizedEmbeddingOptions(src.num_embeddings, src.embedding_dim).weight(wc).name(src.name));
  torch::NoGradGuard no_grad;
  const at::Tensor w = src.weight.detach();
  auto [s, z] = src.weight_fake_quant->qparams(w);
  const at::Tensor codes = quantize_codes(w, s, z, q->group_size, wc);
  q->to(w.device());
  q->packed.copy_(pack_rows(codes.view({src.num_embeddings, src.embedding_dim}), wc.bits()));
  q->scale.copy_(s.view(-1));
  q->zero_point.copy_(z.view(-1));
  return q;
}

at::Tensor QuantizedEmbeddingImpl::forward(const at::Tensor& indices) {
  const int64_t rows_total = options.num_embeddings(), cols = options.embedding_dim();
  auto [rows, inverse] = unique_rows(indices, rows_total, options.name());
  const int64_t per_row = cols / group_size;
  const at::Tensor codes = unpack_rows(packed.index_select(0, rows), options.weight().bits(), cols).contiguous();
  const at::Tensor s = scale.view({rows_total, per_row}).index_select(0, rows).reshape(-1);
  const at::Tensor z = zero_point.view({rows_total, per_row}).index_select(0, rows).reshape(-1);
  const at::Tensor values = dequantize_codes(codes, s, z, group_size, options.weight());
  std::vector<int64_t> shape = indices.sizes().vec();
  shape.push_back(cols);
  return values.view({-1, cols}).index_select(0, inverse).view(shape);
}

int64_t QuantizedEmbeddingImpl::weight_bytes() const { return packed.nbytes() + scale.nbytes() + zero_point.nbytes(); }

}  // namespace qat
}  // namespace lowbit
