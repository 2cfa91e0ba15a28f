// CUDA (and ROCm: libtorch's HIP build uses the CUDA key) kernels of the fake-quant ops: checks,
// device guard, current stream, then the launchers of kernels/cuda.
#include <torch/library.h>

#include "../kernels/cuda/fake_quant_cuda.h"

#include "blockwise_ops.h"  // elem_type
#include "fake_quant_ops.h"
#include "gpu_runtime.h"

namespace lowbit {
namespace ops {
namespace {

void check_launch(const char* err, const char* op) { TORCH_CHECK(err == nullptr, op, ": CUDA launch failed: ", err); }

void* current_stream() { return current_gpu_stream(); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dynamic_cuda(const at::Tensor& input, int64_t group_size,
                                                                        int64_t bits, bool is_signed, bool symmetric,
                                                                        double eps) {
  const char* op = "lowbit::fake_quant_dynamic";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  check_eps(eps, op);
  const GpuGuard guard(a.input.device());
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
  at::Tensor scale = at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
  at::Tensor zp = at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
  kernels::FakeQuantParams p = fake_quant_params(a, out, mask, scale, zp);
  p.dynamic = true;
  p.symmetric = symmetric;
  p.eps = static_cast<float>(eps);
  check_launch(kernels::fake_quant_gpu(p, current_stream()), op);
  return {out, mask, scale, zp};
}

std::tuple<at::Tensor, at::Tensor> static_cuda(const at::Tensor& input, const at::Tensor& scale,
                                               const at::Tensor& zero_point, int64_t group_size, int64_t bits,
                                               bool is_signed) {
  const char* op = "lowbit::fake_quant_static";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  auto [s, z] = check_qparams(a, scale, zero_point, op);
  const GpuGuard guard(a.input.device());
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
  kernels::FakeQuantParams p = fake_quant_params(a, out, mask, s, z);
  p.dynamic = false;
  check_launch(kernels::fake_quant_gpu(p, current_stream()), op);
  return {out, mask};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> float8_cuda(const at::Tensor& input, int64_t group_size,
                                                           std::string_view format, double eps) {
  const char* op = "lowbit::fake_quant_float8";
  const bool e4m3 = parse_float8_format(format, op);
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, 8, true, op);
  check_eps(eps, op);
  const GpuGuard guard(a.input.device());
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
  check_launch(kernels::fake_quant_float8_gpu(p, current_stream()), op);
  return {out, mask, scale};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_float_cuda(const at::Tensor& input, std::string_view format,
                                                                double eps) {
  const char* op = "lowbit::fake_quant_block_float";
  const BlockFloatFormat f = parse_block_float_format(format, op);
  const FakeQuantArgs a = check_block_float_args(input, f, eps, op);
  const GpuGuard guard(a.input.device());
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
  at::Tensor scale = at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
  // NVFP4's tensor amax stays on the device (no host sync); the kernel reads it.
  const at::Tensor tamax = f.nvfp4 && a.ngroups > 0 ? a.input.abs().amax().to(at::kFloat).contiguous() : at::Tensor();
  kernels::BlockFloatParams p = block_float_params(a, f, eps, tamax, out, mask, scale);
  check_launch(kernels::fake_quant_block_float_gpu(p, current_stream()), op);
  return {out, mask, scale};
}

at::Tensor backward_cuda(const at::Tensor& grad, const at::Tensor& mask) {
  const char* op = "lowbit::fake_quant_backward";
  const at::Tensor m = check_mask(grad, mask, op);
  const GpuGuard guard(grad.device());
  const at::Tensor g = grad.contiguous();
  at::Tensor dx = at::empty_like(g);
  kernels::FakeQuantBackwardParams p;
  p.grad = g.data_ptr();
  p.type = elem_type(g.scalar_type());
  p.n = g.numel();
  p.mask = m.data_ptr<uint8_t>();
  p.grad_input = dx.data_ptr();
  check_launch(kernels::fake_quant_backward_gpu(p, current_stream()), op);
  return dx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lsq_backward_cuda(const at::Tensor& grad, const at::Tensor& input,
                                                                 const at::Tensor& scale, const at::Tensor& zero_point,
                                                                 int64_t group_size, int64_t bits, bool is_signed,
                                                                 double grad_factor) {
  const char* op = "lowbit::fake_quant_lsq_backward";
  const GpuGuard guard(input.device());
  LsqBackwardCall c =
      prepare_lsq_backward(grad, input, scale, zero_point, group_size, bits, is_signed, grad_factor, op);
  check_launch(kernels::fake_quant_lsq_backward_gpu(c.params, current_stream()), op);
  return {c.grad_input, c.grad_scale, c.grad_zero_point};
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CUDA, m) {
  m.impl("fake_quant_dynamic", &lowbit::ops::dynamic_cuda);
  m.impl("fake_quant_static", &lowbit::ops::static_cuda);
  m.impl("fake_quant_float8", &lowbit::ops::float8_cuda);
  m.impl("fake_quant_block_float", &lowbit::ops::block_float_cuda);
  m.impl("fake_quant_backward", &lowbit::ops::backward_cuda);
  m.impl("fake_quant_lsq_backward", &lowbit::ops::lsq_backward_cuda);
}
