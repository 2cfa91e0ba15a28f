// Argument checks shared by every backend of the fake-quant ops, so all of them refuse the same
// inputs with the same messages, and the kernel parameters built from checked arguments.
#include "fake_quant_ops.h"

#include <cmath>

#include "../kernels/common/fake_quant_math.h"

#include "blockwise_ops.h"  // elem_type

namespace lowbit {
namespace ops {

int64_t mask_bytes(int64_t n) { return (n + 7) / 8; }

FakeQuantArgs check_fake_quant_args(const at::Tensor& input, int64_t group_size, int64_t bits, bool is_signed,
                                    const char* op) {
  TORCH_CHECK(input.defined(), op, ": input is an undefined tensor");
  const auto t = input.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, op,
              ": input must be float32, bfloat16 or float16, got ", t);
  TORCH_CHECK(input.layout() == at::kStrided, op, ": input must be a dense (strided) tensor, got layout ",
              input.layout());
  TORCH_CHECK(bits >= 2 && bits <= 8, op, ": bits must be in [2, 8], got ", bits);
  TORCH_CHECK(group_size >= 1, op, ": group_size must be >= 1, got ", group_size);
  const int64_t n = input.numel();
  TORCH_CHECK(n % group_size == 0, op, ": group_size ", group_size, " does not divide the input's ", n,
              " elements (shape ", input.sizes(), ")");
  FakeQuantArgs a;
  a.input = input.contiguous();
  a.group_size = group_size;
  a.ngroups = n / group_size;
  a.bits = static_cast<int>(bits);
  a.is_signed = is_signed;
  return a;
}

void check_eps(double eps, const char* op) {
  // eps > 0 keeps an all-zero group finite (scale = eps, output 0); eps = 0 would divide by zero.
  TORCH_CHECK(std::isfinite(eps) && eps > 0, op, ": eps must be finite and > 0, got ", eps);
}

bool parse_float8_format(std::string_view format, const char* op) {
  if (format == "e4m3") return true;
  if (format == "e5m2") return false;
  TORCH_CHECK(false, op, ": format must be \"e4m3\" (float8_e4m3fn) or \"e5m2\", got \"", std::string(format), "\"");
}

BlockFloatFormat parse_block_float_format(std::string_view format, const char* op) {
  if (format == "mxfp4") return {32, 1, 0, 6.0f, false, 2};
  if (format == "mxfp8_e4m3") return {32, 3, -6, 448.0f, false, 8};
  if (format == "mxfp8_e5m2") return {32, 2, -14, 57344.0f, false, 15};
  if (format == "nvfp4") return {16, 1, 0, 6.0f, true, 0};
  TORCH_CHECK(false, op, ": format must be \"mxfp4\", \"mxfp8_e4m3\", \"mxfp8_e5m2\" or \"nvfp4\", got \"",
              std::string(format), "\"");
}

FakeQuantArgs check_block_float_args(const at::Tensor& input, const BlockFloatFormat& f, double eps, const char* op) {
  TORCH_CHECK(input.defined(), op, ": input is an undefined tensor");
  TORCH_CHECK(input.numel() % f.block == 0, op, ": the format's blocks of ", f.block, " do not divide the input's ",
              input.numel(), " elements (shape ", input.sizes(), ")");
  check_eps(eps, op);
  return check_fake_quant_args(input, f.block, 8, true, op);
}

kernels::BlockFloatParams block_float_params(const FakeQuantArgs& a, const BlockFloatFormat& f, double eps,
                                             const at::Tensor& tensor_amax, at::Tensor& out, at::Tensor& mask,
                                             at::Tensor& scale) {
  kernels::BlockFloatParams p;
  p.input = a.input.data_ptr();
  p.type = elem_type(a.input.scalar_type());
  p.n = a.input.numel();
  p.block = f.block;
  p.elem_mantissa_bits = f.mantissa_bits;
  p.elem_min_exponent = f.min_exponent;
  p.elem_max = f.max;
  p.nvfp4 = f.nvfp4;
  p.mx_emax = f.mx_emax;
  p.eps = static_cast<float>(eps);
  p.tensor_amax = f.nvfp4 ? tensor_amax.data_ptr<float>() : nullptr;
  p.scale = scale.data_ptr<float>();
  p.output = out.data_ptr();
  p.mask = mask.data_ptr<uint8_t>();
  return p;
}

void check_qparam_values(const at::Tensor& scale, const at::Tensor& zero_point, int bits, bool is_signed,
                         const char* op) {
  // Where the host holds them (a QAT module's forward on a GPU never waits for it): a scale that is
  // not finite and positive and a zero point off the format's integer grid stand for no quantized
  // value.
  if (!scale.is_cpu() || !zero_point.is_cpu()) return;
  const at::Tensor s = scale.contiguous(), z = zero_point.contiguous();
  const kernels::FakeQuantRange r = kernels::fq_range(bits, is_signed);
  const float* sv = s.const_data_ptr<float>();
  const float* zv = z.const_data_ptr<float>();
  for (int64_t g = 0; g < s.numel(); ++g) {
    TORCH_CHECK(std::isfinite(sv[g]) && sv[g] > 0, op, ": scale[", g, "] must be finite and > 0, got ", sv[g]);
    TORCH_CHECK(zv[g] >= r.qmin && zv[g] <= r.qmax && zv[g] == std::nearbyint(zv[g]), op, ": zero_point[", g,
                "] must be an integer in [", r.qmin, ", ", r.qmax, "] (", is_signed ? "int" : "uint", bits, "), got ",
                zv[g]);
  }
}

std::tuple<at::Tensor, at::Tensor> check_qparams(const FakeQuantArgs& a, const at::Tensor& scale,
                                                 const at::Tensor& zero_point, const char* op) {
  for (const auto& [name, t] : {std::pair<const char*, const at::Tensor&>{"scale", scale}, {"zero_point", zero_point}}) {
    TORCH_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
    TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t.scalar_type());
    TORCH_CHECK(t.numel() == a.ngroups, op, ": ", name, " must have one value per group (", a.ngroups, " groups of ",
                a.group_size, "), got ", t.numel());
    TORCH_CHECK(t.device() == a.input.device(), op, ": ", name, " is on ", t.device(), " but input is on ",
                a.input.device());
  }
  at::Tensor s = scale.contiguous().view(-1), z = zero_point.contiguous().view(-1);
  check_qparam_values(s, z, a.bits, a.is_signed, op);
  return {s, z};
}

at::Tensor check_mask(const at::Tensor& grad, const at::Tensor& mask, const char* op) {
  TORCH_CHECK(grad.defined() && mask.defined(), op, ": grad and mask must be defined tensors");
  const auto t = grad.scalar_type();
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, op,
              ": grad must be float32, bfloat16 or float16, got ", t);
  TORCH_CHECK(mask.scalar_type() == at::kByte, op, ": mask must be uint8 (bit-packed), got ", mask.scalar_type());
  TORCH_CHECK(mask.numel() == mask_bytes(grad.numel()), op, ": mask of ", grad.numel(), " elements needs ",
              mask_bytes(grad.numel()), " bytes, got ", mask.numel());
  TORCH_CHECK(mask.device() == grad.device(), op, ": mask is on ", mask.device(), " but grad is on ", grad.device());
  return mask.contiguous();
}

kernels::FakeQuantParams fake_quant_params(const FakeQuantArgs& a, at::Tensor& out, at::Tensor& mask,
                                           at::Tensor& scale, at::Tensor& zero_point) {
  kernels::FakeQuantParams p;
  p.input = a.input.data_ptr();
  p.type = elem_type(a.input.scalar_type());
  p.n = a.input.numel();
  p.group_size = a.group_size;
  p.bits = a.bits;
  p.is_signed = a.is_signed;
  p.scale = scale.data_ptr<float>();
  p.zero_point = zero_point.data_ptr<float>();
  p.output = out.data_ptr();
  p.mask = mask.data_ptr<uint8_t>();
  return p;
}

LsqBackwardCall prepare_lsq_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale,
                                     const at::Tensor& zero_point, int64_t group_size, int64_t bits, bool is_signed,
                                     double grad_factor, const char* op) {
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  auto [s, z] = check_qparams(a, scale, zero_point, op);
  TORCH_CHECK(grad.sizes() == input.sizes() && grad.scalar_type() == input.scalar_type() &&
                  grad.device() == input.device(),
              op, ": grad (", grad.sizes(), ", ", grad.scalar_type(), ", ", grad.device(), ") must match input (",
              input.sizes(), ", ", input.scalar_type(), ", ", input.device(), ")");
  LsqBackwardCall c;
  c.grad = grad.contiguous();
  c.grad_input = at::empty_like(a.input);
  c.grad_scale = at::empty({a.ngroups}, s.options());
  c.grad_zero_point = at::empty({a.ngroups}, s.options());
  kernels::LsqBackwardParams& p = c.params;
  p.grad = c.grad.data_ptr();
  p.input = a.input.data_ptr();
  p.type = elem_type(a.input.scalar_type());
  p.n = a.input.numel();
  p.group_size = a.group_size;
  p.bits = a.bits;
  p.is_signed = a.is_signed;
  p.scale = s.data_ptr<float>();
  p.zero_point = z.data_ptr<float>();
  p.grad_factor = static_cast<float>(grad_factor);
  p.grad_input = c.grad_input.data_ptr();
  p.grad_scale = c.grad_scale.data_ptr<float>();
  p.grad_zero_point = c.grad_zero_point.data_ptr<float>();
  return c;
}

}  // namespace ops
}  // namespace lowbit
