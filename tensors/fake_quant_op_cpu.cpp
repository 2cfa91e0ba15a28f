// CPU kernels of the fake-quant ops: argument checks, then the OpenMP loops of kernels/cpu.
#include <torch/library.h>

#include "../kernels/cpu/fake_quant_cpu.h"

#include "blockwise_ops.h"  // elem_type
#include "fake_quant_ops.h"

namespace lowbit {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dynamic_cpu(const at::Tensor& input, int64_t group_size,
                                                                       int64_t bits, bool is_signed, bool symmetric,
                                                                       double eps) {
  const char* op = "lowbit::fake_quant_dynamic";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  check_eps(eps, op);
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
  at::Tensor scale = at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
  at::Tensor zp = at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
  kernels::FakeQuantParams p = fake_quant_params(a, out, mask, scale, zp);
  p.dynamic = true;
  p.symmetric = symmetric;
  p.eps = static_cast<float>(eps);
  kernels::fake_quant_cpu(p);
  return {out, mask, scale, zp};
}

std::tuple<at::Tensor, at::Tensor> static_cpu(const at::Tensor& input, const at::Tensor& scale,
                                              const at::Tensor& zero_point, int64_t group_size, int64_t bits,
                                              bool is_signed) {
  const char* op = "lowbit::fake_quant_static";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  auto [s, z] = check_qparams(a, scale, zero_point, op);
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
  kernels::FakeQuantParams p = fake_quant_params(a, out, mask, s, z);
  p.dynamic = false;  // the kernel only reads scale / zero_point
  kernels::fake_quant_cpu(p);
  return {out, mask};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> float8_cpu(const at::Tensor& input, int64_t group_size,
                                                          std::string_view format, double eps) {
  const char* op = "lowbit::fake_quant_float8";
  const bool e4m3 = parse_float8_format(format, op);
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, 8, true, op);
  check_eps(eps, op);
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
  at::Tensor scale = at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
  kernels::Float8FakeQuantParams p;
  p.input = a.input.data_ptr();
  p.type = elem_type(a.input.scalar_type());
  p.n = a.input.numel();
  p.group_size = a.group_size;
  p.e4m3 = e4m3;
  p.eps = static_cast<float>(eps);
  p.scale = scale.data_ptr<float>();
  p.output = out.data_ptr();
  p.mask = mask.data_ptr<uint8_t>();
  kernels::fake_quant_float8_cpu(p);
  return {out, mask, scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_float_cpu(const at::Tensor& input, std::string_view format,
                                                               double eps) {
  const char* op = "lowbit::fake_quant_block_float";
  const BlockFloatFormat f = parse_block_float_format(format, op);
  const FakeQuantArgs a = check_block_float_args(input, f, eps, op);
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
  at::Tensor scale = at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
  // NVFP4's tensor amax: ATen's amax (exact, and NaN-propagating like the block scan).
  const at::Tensor tamax = f.nvfp4 && a.ngroups > 0 ? a.input.abs().amax().to(at::kFloat).contiguous() : at::Tensor();
  kernels::BlockFloatParams p = block_float_params(a, f, eps, tamax, out, mask, scale);
  kernels::fake_quant_block_float_cpu(p);
  return {out, mask, scale};
}

at::Tensor backward_cpu(const at::Tensor& grad, const at::Tensor& mask) {
  const at::Tensor m = check_mask(grad, mask, "lowbit::fake_quant_backward");
  const at::Tensor g = grad.contiguous();
  at::Tensor dx = at::empty_like(g);
  kernels::FakeQuantBackwardParams p;
  p.grad = g.data_ptr();
  p.type = elem_type(g.scalar_type());
  p.n = g.numel();
  p.mask = m.data_ptr<uint8_t>();
  p.grad_input = dx.data_ptr();
  kernels::fake_quant_backward_cpu(p);
  return dx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lsq_backward_cpu(const at::Tensor& grad, const at::Tensor& input,
                                                                const at::Tensor& scale, const at::Tensor& zero_point,
                                                                int64_t group_size, int64_t bits, bool is_signed,
                                                                double grad_factor) {
  const char* op = "lowbit::fake_quant_lsq_backward";
  LsqBackwardCall c =
      prepare_lsq_backward(grad, input, scale, zero_point, group_size, bits, is_signed, grad_factor, op);
  kernels::fake_quant_lsq_backward_cpu(c.params);
  return {c.grad_input, c.grad_scale, c.grad_zero_point};
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CPU, m) {
  m.impl("fake_quant_dynamic", &lowbit::ops::dynamic_cpu);
  m.impl("fake_quant_static", &lowbit::ops::static_cpu);
  m.impl("fake_quant_float8", &lowbit::ops::float8_cpu);
  m.impl("fake_quant_block_float", &lowbit::ops::block_float_cpu);
  m.impl("fake_quant_backward", &lowbit::ops::backward_cpu);
  m.impl("fake_quant_lsq_backward", &lowbit::ops::lsq_backward_cpu);
}
