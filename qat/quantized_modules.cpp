// QuantizedLinear / QuantizedEmbedding: packed integer weights, dequantized per forward with the
// fake quantizer's own formula (lowbit::dequantize_codes), so outputs match the QAT model exactly.
#include "quantized_modules.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "group_layout.h"
#include "int_mm_linear.h"

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

void check_activation(const std::optional<FakeQuantConfig>& a, const std::string& who) {
  if (!a) return;
  a->validate(who);
  TORCH_CHECK(a->qparams() == QParamsMode::Dynamic, who, ": convert() supports Dynamic activation qparams only, got ",
              qparams_mode_name(a->qparams()));
}

// Registers the storage of a [rows, cols] weight under config c on m: packed codes, scale, and
// zero_point (integer) or tensor_scale (NVFP4).
struct Storage {
  at::Tensor packed, scale, zero_point, tensor_scale;
};

Storage register_storage(torch::nn::Module& m, const FakeQuantConfig& c, int64_t rows, int64_t cols, int64_t group_size) {
  Storage s;
  if (is_float_format(c)) {
    const PackedFloatWeight p = empty_float_weight(c, rows, cols, group_size);
    s.packed = m.register_buffer("packed", p.packed);
    s.scale = m.register_buffer("scale", p.scale);
    if (p.tensor_scale.defined()) s.tensor_scale = m.register_buffer("tensor_scale", p.tensor_scale);
    return s;
  }
  const int64_t ngroups = rows * cols / group_size;
  s.packed = m.register_buffer("packed", at::zeros({rows, packed_row_bytes(cols, c.bits())}, at::kByte));
  s.scale = m.register_buffer("scale", at::ones({ngroups}));
  s.zero_point = m.register_buffer("zero_point", at::zeros({ngroups}));
  return s;
}

// Fills storage s with w [rows, cols] quantized as `quantizer` does now.
void fill_storage(Storage& s, FakeQuantizerImpl& quantizer, const at::Tensor& w, int64_t group_size, const std::string& who) {
  const FakeQuantConfig& c = quantizer.config();
  if (is_float_format(c)) {
    const PackedFloatWeight p = pack_float_weight(w, c, group_size, who);
    s.packed.copy_(p.packed);
    s.scale.copy_(p.scale);
    if (s.tensor_scale.defined()) s.tensor_scale.copy_(p.tensor_scale);
    return;
  }
  auto [sc, z] = quantizer.qparams(w);
  const at::Tensor codes = quantize_codes(w, sc, z, group_size, c);
  s.packed.copy_(pack_rows(codes.view({w.size(0), w.size(1)}), c.bits()));
  s.scale.copy_(sc.view(-1));
  s.zero_point.copy_(z.view(-1));
}

// float32 [rows, cols] of the stored rows (packed, scale, zero_point / tensor_scale: those rows' parts).
at::Tensor decode_storage(const Storage& s, const FakeQuantConfig& c, int64_t cols, int64_t group_size) {
  if (is_float_format(c)) return unpack_float_weight({s.packed, s.scale, s.tensor_scale}, c, cols, group_size);
  const at::Tensor codes = unpack_rows(s.packed, c.bits(), cols).contiguous();
  return dequantize_codes(codes, s.scale, s.zero_point, group_size, c).view({s.packed.size(0), cols});
}

int64_t storage_bytes(const Storage& s) {
  int64_t n = 0;
  for (const at::Tensor& t : {s.packed, s.scale, s.zero_point, s.tensor_scale})
    if (t.defined()) n += t.nbytes();
  return n;
}

}  // namespace

// ---- QuantizedLinear ---------------------------------------------------------------------------

QuantizedLinearImpl::QuantizedLinearImpl(QuantizedLinearOptions o) : options(std::move(o)) {
  const int64_t out = options.out_features(), in = options.in_features();
  group_size = weight_group_size(options.weight(), out, in, options.name() + ".weight");
  check_activation(options.activation(), options.name() + ".input");
  const Storage st = register_storage(*this, options.weight(), out, in, group_size);
  packed = st.packed, scale = st.scale, zero_point = st.zero_point, tensor_scale = st.tensor_scale;
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
  q->to(w.device());
  Storage st{q->packed, q->scale, q->zero_point, q->tensor_scale};
  fill_storage(st, *src.weight_fake_quant, w, q->group_size, src.name + ".weight");
  if (src.bias.defined()) q->bias.copy_(src.bias.detach());
  return q;
}

at::Tensor QuantizedLinearImpl::dequantized_weight() const {
  return decode_storage({packed, scale, zero_point, tensor_scale}, options.weight(), options.in_features(), group_size);
}

void QuantizedLinearImpl::set_int8_matmul(bool on) {
  if (on) {
    const std::string why = int_mm_config_problem(options.activation(), options.weight());
    TORCH_CHECK(why.empty(), options.name(), ": the int8 x int8 matmul cannot run this layer: ", why);
    TORCH_CHECK(at::equal(zero_point, at::zeros_like(zero_point)), options.name(),
                ": the int8 x int8 matmul needs weight zero points of 0");
  }
  int8_matmul_ = on;
}

bool QuantizedLinearImpl::uses_int8_matmul(const at::Tensor& x) const {
  if (!int8_matmul_ || !activation_fake_quant->active() || x.numel() == 0) return false;
  const int64_t k = options.in_features(), gs = std::min(group_size, k);
  return !x.is_cuda() || int_mm_cuda_shape_ok(x.numel() / k, gs, options.out_features());
}

at::Tensor QuantizedLinearImpl::int8_forward(const at::Tensor& x2) {
  const FakeQuantConfig& ac = *options.activation();
  const FakeQuantConfig& wc = options.weight();
  const int64_t n = options.out_features(), k = options.in_features();
  auto [xs, xz] = activation_fake_quant->qparams(x2);
  // Activation codes q - qmin (uint8) -> q (int8): the fake quantizer's own rounding.
  const at::Tensor xq = (quantize_codes(x2, xs, xz, k, ac).to(at::kInt) + ac.qmin()).to(at::kChar);
  const at::Tensor w = (unpack_rows(packed, wc.bits(), k).to(at::kInt) + wc.qmin()).to(at::kChar);
  // Per-tensor weights: one scale for every row.
  const bool per_tensor = group_size > k;
  const at::Tensor ws = per_tensor ? scale.expand({n}).contiguous() : scale;
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat) : bias;
  return int_mm_linear(xq, xs.view(-1), xz.view(-1), w, ws, per_tensor ? k : group_size, b);
}

at::Tensor QuantizedLinearImpl::forward(const at::Tensor& x) {
  if (uses_int8_matmul(x)) {
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = options.out_features();
    return int8_forward(x.reshape({-1, options.in_features()})).to(x.scalar_type()).view(shape);
  }
  const at::Tensor xq = activation_fake_quant ? activation_fake_quant->forward(x) : x;
  return torch::nn::functional::linear(xq, dequantized_weight().to(x.scalar_type()),
                                       bias.defined() ? bias.to(x.scalar_type()) : bias);
}

int64_t QuantizedLinearImpl::weight_bytes() const { return storage_bytes({packed, scale, zero_point, tensor_scale}); }

// ---- QuantizedEmbedding ------------------------------------------------------------------------

QuantizedEmbeddingImpl::QuantizedEmbeddingImpl(QuantizedEmbeddingOptions o) : options(std::move(o)) {
  const int64_t rows = options.num_embeddings(), cols = options.embedding_dim();
  const FakeQuantConfig& c = options.weight();
  const bool row_local = c.format() == ValueFormat::MXFP4 || (c.format() != ValueFormat::NVFP4 &&
                                                              c.granularity() != Granularity::PerTensor);
  TORCH_CHECK(row_local, options.name(), ".weight: an embedding's weight must be quantized row by row (per-channel "
              "axis 0, per-token, per-group or MXFP4), got ", c.describe());
  group_size = weight_group_size(c, rows, cols, options.name() + ".weight");
  const Storage st = register_storage(*this, c, rows, cols, group_size);
  packed = st.packed, scale = st.scale, zero_point = st.zero_point, tensor_scale = st.tensor_scale;
}

std::shared_ptr<QuantizedEmbeddingImpl> QuantizedEmbeddingImpl::from_fake_quantized(FakeQuantizedEmbeddingImpl& src) {
  const FakeQuantConfig& wc = src.weight_fake_quant->config();
  auto q = std::make_shared<QuantizedEmbeddingImpl>(
      QuantizedEmbeddingOptions(src.num_embeddings, src.embedding_dim).weight(wc).name(src.name));
  torch::NoGradGuard no_grad;
  const at::Tensor w = src.weight.detach();
  q->to(w.device());
  Storage st{q->packed, q->scale, q->zero_point, q->tensor_scale};
  fill_storage(st, *src.weight_fake_quant, w, q->group_size, src.name + ".weight");
  return q;
}

at::Tensor QuantizedEmbeddingImpl::forward(const at::Tensor& indices) {
  const int64_t rows_total = options.num_embeddings(), cols = options.embedding_dim();
  auto [rows, inverse] = unique_rows(indices, rows_total, options.name());
  // Only the rows the batch looks up are decoded: every scale belongs to one row.
  const int64_t per_row = cols / group_size;
  auto select = [&](const at::Tensor& t) {
    return t.defined() ? t.view({rows_total, per_row}).index_select(0, rows).reshape(-1) : t;
  };
  const Storage st{packed.index_select(0, rows), select(scale), select(zero_point), tensor_scale};
  const at::Tensor values = decode_storage(st, options.weight(), cols, group_size);
  std::vector<int64_t> shape = indices.sizes().vec();
  shape.push_back(cols);
  return values.index_select(0, inverse).view(shape);
}

int64_t QuantizedEmbeddingImpl::weight_bytes() const { return storage_bytes({packed, scale, zero_point, tensor_scale}); }

}  // namespace qat
}  // namespace lowbit
