// Packed storage of converted weights: see packed_weight.h.
#include "packed_weight.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include "../kernels/common/fake_quant_math.h"
#include "../tensors/float_code_tensors.h"

namespace lowbit {
namespace qat {
namespace {

using T3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

kernels::Float8Format element_format(const FakeQuantConfig& c) {
  switch (c.format()) {
    case ValueFormat::Float8E4M3: return kernels::fq_float8_format(true);
    case ValueFormat::Float8E5M2: return kernels::fq_float8_format(false);
    default: return kernels::fq_e2m1_format();
  }
}

// (fake-quantized weight, per-group scale) from the same ops the fake quantizer calls.
at::Tensor fake_quant_scale(const at::Tensor& w, const FakeQuantConfig& c, int64_t group_size) {
  if (c.format() == ValueFormat::Float8E4M3 || c.format() == ValueFormat::Float8E5M2) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("lowbit::fake_quant_float8", "")
                         .typed<T3(const at::Tensor&, int64_t, c10::string_view, double)>();
    return std::get<2>(op.call(w, group_size, c.format() == ValueFormat::Float8E4M3 ? "e4m3" : "e5m2", c.eps()));
  }
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_block_float", "")
                       .typed<T3(const at::Tensor&, c10::string_view, double)>();
  return std::get<2>(op.call(w, c.format() == ValueFormat::MXFP4 ? "mxfp4" : "nvfp4", c.eps()));
}

// A float32 tensor like t filled with v (a tensor divisor keeps a true division on every device).
at::Tensor full_as(const at::Tensor& t, double v) { return at::full_like(t, v, t.options().dtype(at::kFloat)); }

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

bool is_float_format(const FakeQuantConfig& c) { return c.format() != ValueFormat::Integer; }

int64_t float_code_bits(const FakeQuantConfig& c) {
  return c.format() == ValueFormat::MXFP4 || c.format() == ValueFormat::NVFP4 ? 4 : 8;
}

int64_t weight_group_size(const FakeQuantConfig& c, int64_t rows, int64_t cols, const std::string& who) {
  c.validate(who);
  if (c.format() == ValueFormat::MXFP4 || c.format() == ValueFormat::NVFP4) {
    const int64_t block = c.format() == ValueFormat::MXFP4 ? 32 : 16;
    TORCH_CHECK(cols % block == 0, who, ": ", c.describe(), " needs the row length to be a multiple of ", block,
                ", got ", cols);
    return block;
  }
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

PackedFloatWeight empty_float_weight(const FakeQuantConfig& c, int64_t rows, int64_t cols, int64_t group_size) {
  PackedFloatWeight p;
  const int64_t ngroups = rows * cols / group_size;
  p.packed = at::zeros({rows, packed_row_bytes(cols, float_code_bits(c))}, at::kByte);
  const bool byte_scales = c.format() == ValueFormat::MXFP4 || c.format() == ValueFormat::NVFP4;
  p.scale = byte_scales ? at::zeros({ngroups}, at::kByte) : at::ones({ngroups}, at::kFloat);
  if (c.format() == ValueFormat::NVFP4) p.tensor_scale = at::ones({1}, at::kFloat);
  return p;
}

PackedFloatWeight pack_float_weight(const at::Tensor& w, const FakeQuantConfig& c, int64_t group_size,
                                    const std::string& who) {
  TORCH_CHECK(w.dim() == 2 && w.numel() % group_size == 0, who, ": expected a 2-d weight, got shape ", w.sizes());
  TORCH_CHECK(at::isfinite(w).all().item<bool>(), who, ": the weight holds NaN or Inf; codes cannot represent them");
  const int64_t rows = w.size(0), cols = w.size(1), ngroups = w.numel() / group_size;
  const kernels::Float8Format elem = element_format(c);
  PackedFloatWeight p;
  // Each group's scale exactly as the fake quantizer computed it (NVFP4: tensor * block scale).
  const at::Tensor scale = fake_quant_scale(w, c, group_size);
  const at::Tensor wf = w.to(at::kFloat).reshape({ngroups, group_size});
  if (c.format() == ValueFormat::MXFP4) {
    p.scale = ops::encode_e8m0(scale);
  } else if (c.format() == ValueFormat::NVFP4) {
    // The tensor scale and the e4m3 block scales, as fq_nvfp4_tensor_scale / fq_nvfp4_total_scale.
    const at::Tensor tamax = wf.abs().amax().reshape({1});
    const at::Tensor ts = at::maximum(tamax / full_as(tamax, 448.0 * 6.0), full_as(tamax, c.eps()));
    const at::Tensor amax = wf.abs().amax(1);
    const at::Tensor b = at::clamp((amax / full_as(amax, 6.0)) / ts, 0.015625, 448.0);
    const kernels::Float8Format e4m3 = kernels::fq_float8_format(true);
    p.scale = ops::encode_float_codes(ops::round_to_float_format(b, e4m3), e4m3, who.c_str());
    p.tensor_scale = ts;
    TORCH_CHECK(at::equal(ts * ops::decode_float_codes(p.scale, e4m3), scale), who,
                ": lowbit internal error: NVFP4 block scales disagree with the fake-quant kernel's");
  } else {
    p.scale = scale;
  }
  // The values the kernels rounded to: round(clamp(x / scale, +-max)) (fake_quant_math.h).
  const at::Tensor xs = at::clamp(wf / scale.unsqueeze(1), -elem.max_value, elem.max_value);
  const at::Tensor codes = ops::encode_float_codes(ops::round_to_float_format(xs, elem), elem, who.c_str());
  p.packed = pack_rows(codes.view({rows, cols}), float_code_bits(c));
  return p;
}

at::Tensor unpack_float_weight(const PackedFloatWeight& p, const FakeQuantConfig& c, int64_t cols, int64_t group_size) {
  const int64_t rows = p.packed.size(0), ngroups = rows * cols / group_size;
  const at::Tensor codes = unpack_rows(p.packed, float_code_bits(c), cols).contiguous();
  const at::Tensor values = ops::decode_float_codes(codes, element_format(c)).view({ngroups, group_size});
  at::Tensor scale;
  if (c.format() == ValueFormat::MXFP4) {
    scale = ops::decode_e8m0(p.scale);
  } else if (c.format() == ValueFormat::NVFP4) {
    scale = p.tensor_scale * ops::decode_float_codes(p.scale, kernels::fq_float8_format(true));
  } else {
    scale = p.scale;
  }
  // The same float32 product as the kernel's round(...) * scale.
  return (values * scale.view({ngroups, 1})).view({rows, cols});
}

int64_t float_weight_bytes(const FakeQuantConfig& c, int64_t rows, int64_t cols, int64_t group_size) {
  const int64_t ngroups = rows * cols / group_size;
  const int64_t codes = rows * packed_row_bytes(cols, float_code_bits(c));
  if (c.format() == ValueFormat::MXFP4) return codes + ngroups;       // e8m0 byte per 32
  if (c.format() == ValueFormat::NVFP4) return codes + ngroups + 4;   // e4m3 byte per 16 + tensor scale
  return codes + 4 * ngroups;                                         // float32 scale per group
}

}  // namespace qat
}  // namespace lowbit
