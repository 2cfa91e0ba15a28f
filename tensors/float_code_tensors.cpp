// Small-float code tables and ATen encode / decode: see float_code_tensors.h.
#include "float_code_tensors.h"

#include "../kernels/common/float_codes.h"

#include <vector>

namespace lowbit {
namespace ops {

at::Tensor float_code_table(kernels::Float8Format f, const at::Device& device) {
  const int n = 1 << kernels::fq_float_code_bits(f);
  std::vector<float> v(n);
  for (int c = 0; c < n; ++c) v[c] = kernels::fq_float_code_value(static_cast<uint32_t>(c), f);
  return at::tensor(v, at::kFloat).to(device);
}

at::Tensor e8m0_table(const at::Device& device) {
  std::vector<float> v(256);
  for (int c = 0; c < 256; ++c) v[c] = kernels::fq_e8m0_value(static_cast<uint8_t>(c));
  return at::tensor(v, at::kFloat).to(device);
}

at::Tensor round_to_float_format(const at::Tensor& v, kernels::Float8Format f) {
  TORCH_CHECK(v.scalar_type() == at::kFloat, "lowbit::round_to_float_format: values must be float32, got ",
              v.scalar_type());
  const at::Tensor a = v.abs().contiguous();
  // The spacing of a's binade (of the smallest normal binade for subnormals), a power of two.
  at::Tensor e = at::bitwise_and(at::bitwise_right_shift(a.view(at::kInt), 23), 0xFF) - 127;
  e = at::clamp_min(e, f.min_exponent);
  const at::Tensor quantum = at::bitwise_left_shift(e - f.mantissa_bits + 127, 23).to(at::kInt).view(at::kFloat);
  const at::Tensor r = at::round(a / quantum) * quantum;
  return at::where(at::signbit(v), -r, r);
}

at::Tensor encode_float_codes(const at::Tensor& values, kernels::Float8Format f, const char* who) {
  TORCH_CHECK(values.scalar_type() == at::kFloat, who, ": values must be float32, got ", values.scalar_type());
  const int bits = kernels::fq_float_code_bits(f);
  const int64_t half = int64_t(1) << (bits - 1);
  // The non-negative codes 0 .. half-1 are ascending in value, so an exact value's code is its
  // left insertion point among them.
  const at::Tensor positive = float_code_table(f, values.device()).narrow(0, 0, half).contiguous();
  const at::Tensor a = values.abs().contiguous();
  const at::Tensor code = at::searchsorted(positive, a.view(-1), /*out_int32=*/false, /*right=*/false)
                              .clamp_max(half - 1)
                              .view(values.sizes());
  TORCH_CHECK(at::equal(positive.index({code}), a), who, ": a value is not exactly a value of the format "
              "(not rounded to it, NaN or out of range)");
  return (code + at::signbit(values).to(at::kLong) * half).to(at::kByte);
}

at::Tensor decode_float_codes(const at::Tensor& codes, kernels::Float8Format f) {
  TORCH_CHECK(codes.scalar_type() == at::kByte, "lowbit::decode_float_codes: codes must be uint8, got ",
              codes.scalar_type());
  return float_code_table(f, codes.device()).index({codes.to(at::kLong)});
}

at::Tensor encode_e8m0(const at::Tensor& pow2_scales) {
  const at::Tensor s = pow2_scales.to(at::kFloat).contiguous();
  return at::bitwise_and(at::bitwise_right_shift(s.view(at::kInt), 23), 0xFF).to(at::kByte);
}

at::Tensor decode_e8m0(const at::Tensor& codes) { return e8m0_table(codes.device()).index({codes.to(at::kLong)}); }

}  // namespace ops
}  // namespace lowbit
