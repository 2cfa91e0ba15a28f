// The fake-quant dispatcher ops (QAT): shared argument checks and the entry points each backend
// registers (fake_quant_op_cpu.cpp, fake_quant_op_cuda.cpp, fake_quant_reference.cpp).
//
// Schema (TORCH_LIBRARY_FRAGMENT(lowbit), tensors/fake_quant_schema.cpp):
//   fake_quant_dynamic(Tensor input, int group_size, int bits, bool is_signed, bool symmetric, float eps)
//       -> (Tensor output, Tensor mask, Tensor scale, Tensor zero_point)      qparams from the input
//   fake_quant_static(Tensor input, Tensor scale, Tensor zero_point, int group_size, int bits, bool is_signed)
//       -> (Tensor output, Tensor mask)                                       qparams given
//   fake_quant_float8(Tensor input, int group_size, str format, float eps)
//       -> (Tensor output, Tensor mask, Tensor scale)       format "e4m3" (float8_e4m3fn) or "e5m2"
//   fake_quant_block_float(Tensor input, str format, float eps) -> (Tensor output, Tensor mask, Tensor scale)
//       format "mxfp4", "mxfp8_e4m3", "mxfp8_e5m2" (blocks of 32, power-of-two scales) or "nvfp4"
//       (blocks of 16, e4m3 scales times a float32 tensor scale); scale: each block's (total) scale
//   fake_quant_backward(Tensor grad, Tensor mask) -> Tensor                  clipped STE
//   fake_quant_lsq_backward(Tensor grad, Tensor input, Tensor scale, Tensor zero_point, int group_size,
//       int bits, bool is_signed, float grad_factor) -> (Tensor grad_input, Tensor grad_scale, Tensor grad_zero_point)
//   fake_quant_qparams(Tensor min, Tensor max, int bits, bool is_signed, bool symmetric, float eps)
//       -> (Tensor scale, Tensor zero_point)                                  for observers (static qparams)
//   quantize_codes / dequantize_codes / pack_codes / unpack_codes: the integer codes of convert().
//   *_reference: the ATen-only oracle of each op under its own name.
//
// Input rules: float32, bfloat16 or float16, any shape and strides (read as if contiguous), split
// into contiguous groups of group_size elements (group_size >= 1 divides numel); scale and
// zero_point are float32 with numel / group_size elements on the input's device; output has the
// input's shape and dtype; mask is uint8, (numel + 7) / 8 bytes (kernels/common/fake_quant_params.h).
// The math and its torchao / torch.ao conventions: kernels/common/fake_quant_math.h.
#pragma once

#include <ATen/ATen.h>

#include <string_view>
#include <tuple>

#include "../kernels/common/fake_quant_params.h"

#include "blockwise_ops.h"  // elem_type

namespace lowbit {
namespace ops {

struct FakeQuantArgs {
  at::Tensor input;  // contiguous, original shape
  int64_t group_size;
  int64_t ngroups;
  int bits;
  bool is_signed;
};

// Checks shared by every op; `op` names the op in each message.
FakeQuantArgs check_fake_quant_args(const at::Tensor& input, int64_t group_size, int64_t bits, bool is_signed,
                                    const char* op);
void check_eps(double eps, const char* op);
// "e4m3" -> true, "e5m2" -> false; anything else is refused naming the value.
bool parse_float8_format(std::string_view format, const char* op);

struct BlockFloatFormat {
  int64_t block;
  int mantissa_bits, min_exponent;
  float max;
  bool nvfp4;
  int mx_emax;
};
BlockFloatFormat parse_block_float_format(std::string_view format, const char* op);
// Checks for fake_quant_block_float; numel must be a multiple of the format's block.
FakeQuantArgs check_block_float_args(const at::Tensor& input, const BlockFloatFormat& f, double eps, const char* op);
kernels::BlockFloatParams block_float_params(const FakeQuantArgs& a, const BlockFloatFormat& f, double eps,
                                             const at::Tensor& tensor_amax, at::Tensor& out, at::Tensor& mask,
                                             at::Tensor& scale);
// scale / zero_point of a static call: float32, ngroups elements, input's device.
// scale (float32, > 0 and finite) and zero_point (float32, an integer of the (bits, is_signed)
// format) value by value where both are on the CPU; elsewhere nothing (no wait for a device).
void check_qparam_values(const at::Tensor& scale, const at::Tensor& zero_point, int bits, bool is_signed,
                         const char* op);
std::tuple<at::Tensor, at::Tensor> check_qparams(const FakeQuantArgs& a, const at::Tensor& scale,
                                                 const at::Tensor& zero_point, const char* op);
at::Tensor check_mask(const at::Tensor& grad, const at::Tensor& mask, const char* op);
int64_t mask_bytes(int64_t n);

// Kernel parameters for checked arguments and allocated outputs (any device).
kernels::FakeQuantParams fake_quant_params(const FakeQuantArgs& a, at::Tensor& out, at::Tensor& mask,
                                           at::Tensor& scale, at::Tensor& zero_point);
// Empty outputs for checked arguments: the bit-packed mask, one float32 per group.
inline at::Tensor empty_mask(const FakeQuantArgs& a) {
  return at::empty({mask_bytes(a.input.numel())}, a.input.options().dtype(at::kByte));
}
inline at::Tensor empty_per_group(const FakeQuantArgs& a) {
  return at::empty({a.ngroups}, a.input.options().dtype(at::kFloat));
}

// fake_quant_lsq_backward checked, its outputs allocated and its kernel parameters filled (any
// device): what the CPU and CUDA bindings share before calling their kernel.
struct LsqBackwardCall {
  at::Tensor grad, grad_input, grad_scale, grad_zero_point;  // grad: contiguous; outputs: allocated
  kernels::LsqBackwardParams params;
};
LsqBackwardCall prepare_lsq_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale,
                                     const at::Tensor& zero_point, int64_t group_size, int64_t bits, bool is_signed,
                                     double grad_factor, const char* op);

// The ops' bodies on a backend with its own kernels (fake_quant_op_cpu.cpp, fake_quant_op_cuda.cpp):
// checks, then B::Guard (the device guard, held from before the outputs are allocated) and
// B::run(params, op), which runs the kernel of that params struct.
template <typename B>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fake_quant_dynamic_op(
    const at::Tensor& input, int64_t group_size, int64_t bits, bool is_signed, bool symmetric, double eps) {
  const char* op = "lowbit::fake_quant_dynamic";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  check_eps(eps, op);
  const typename B::Guard guard(a.input.device());
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = empty_mask(a);
  at::Tensor scale = empty_per_group(a);
  at::Tensor zp = empty_per_group(a);
  kernels::FakeQuantParams p = fake_quant_params(a, out, mask, scale, zp);
  p.dynamic = true;
  p.symmetric = symmetric;
  p.eps = static_cast<float>(eps);
  B::run(p, op);
  return {out, mask, scale, zp};
}

template <typename B>
std::tuple<at::Tensor, at::Tensor> fake_quant_static_op(const at::Tensor& input, const at::Tensor& scale,
                                                        const at::Tensor& zero_point, int64_t group_size,
                                                        int64_t bits, bool is_signed) {
  const char* op = "lowbit::fake_quant_static";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  auto [s, z] = check_qparams(a, scale, zero_point, op);
  const typename B::Guard guard(a.input.device());
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = empty_mask(a);
  kernels::FakeQuantParams p = fake_quant_params(a, out, mask, s, z);
  p.dynamic = false;  // the kernel only reads scale / zero_point
  B::run(p, op);
  return {out, mask};
}

template <typename B>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_float8_op(const at::Tensor& input, int64_t group_size,
                                                                    std::string_view format, double eps) {
  const char* op = "lowbit::fake_quant_float8";
  const bool e4m3 = parse_float8_format(format, op);
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, 8, true, op);
  check_eps(eps, op);
  const typename B::Guard guard(a.input.device());
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = empty_mask(a);
  at::Tensor scale = empty_per_group(a);
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
  B::run(p, op);
  return {out, mask, scale};
}

template <typename B>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_block_float_op(const at::Tensor& input,
                                                                         std::string_view format, double eps) {
  const char* op = "lowbit::fake_quant_block_float";
  const BlockFloatFormat f = parse_block_float_format(format, op);
  const FakeQuantArgs a = check_block_float_args(input, f, eps, op);
  const typename B::Guard guard(a.input.device());
  at::Tensor out = at::empty_like(a.input);
  at::Tensor mask = empty_mask(a);
  at::Tensor scale = empty_per_group(a);
  // NVFP4's tensor amax: ATen's amax (exact, and NaN-propagating like the block scan); it stays on
  // the input's device (no host sync), where the kernel reads it.
  const at::Tensor tamax = f.nvfp4 && a.ngroups > 0 ? a.input.abs().amax().to(at::kFloat).contiguous() : at::Tensor();
  kernels::BlockFloatParams p = block_float_params(a, f, eps, tamax, out, mask, scale);
  B::run(p, op);
  return {out, mask, scale};
}

template <typename B>
at::Tensor fake_quant_backward_op(const at::Tensor& grad, const at::Tensor& mask) {
  const char* op = "lowbit::fake_quant_backward";
  const at::Tensor m = check_mask(grad, mask, op);
  const typename B::Guard guard(grad.device());
  const at::Tensor g = grad.contiguous();
  at::Tensor dx = at::empty_like(g);
  kernels::FakeQuantBackwardParams p;
  p.grad = g.data_ptr();
  p.type = elem_type(g.scalar_type());
  p.n = g.numel();
  p.mask = m.data_ptr<uint8_t>();
  p.grad_input = dx.data_ptr();
  B::run(p, op);
  return dx;
}

template <typename B>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_lsq_backward_op(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
    int64_t group_size, int64_t bits, bool is_signed, double grad_factor) {
  const char* op = "lowbit::fake_quant_lsq_backward";
  // prepare_lsq_backward allocates the outputs: the guard comes first.
  const typename B::Guard guard(input.device());
  LsqBackwardCall c =
      prepare_lsq_backward(grad, input, scale, zero_point, group_size, bits, is_signed, grad_factor, op);
  B::run(c.params, op);
  return {c.grad_input, c.grad_scale, c.grad_zero_point};
}

// ATen-only reference (also the CompositeExplicitAutograd kernel).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fake_quant_dynamic_reference(
    const at::Tensor& input, int64_t group_size, int64_t bits, bool is_signed, bool symmetric, double eps);
std::tuple<at::Tensor, at::Tensor> fake_quant_static_reference(const at::Tensor& input, const at::Tensor& scale,
                                                               const at::Tensor& zero_point, int64_t group_size,
                                                               int64_t bits, bool is_signed);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_float8_reference(const at::Tensor& input, int64_t group_size,
                                                                          std::string_view format, double eps);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_block_float_reference(const at::Tensor& input,
                                                                               std::string_view format, double eps);
at::Tensor fake_quant_backward_reference(const at::Tensor& grad, const at::Tensor& mask);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_lsq_backward_reference(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
    int64_t group_size, int64_t bits, bool is_signed, double grad_factor);
std::tuple<at::Tensor, at::Tensor> fake_quant_qparams_reference(const at::Tensor& min, const at::Tensor& max,
                                                                int64_t bits, bool is_signed, bool symmetric,
                                                                double eps);
// Integer codes q - qmin (uint8, input's shape) and back to floats (bit-identical to fake_quant's output).
at::Tensor quantize_codes_reference(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                    int64_t group_size, int64_t bits, bool is_signed);
at::Tensor dequantize_codes_reference(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& zero_point,
                                      int64_t group_size, int64_t bits, bool is_signed, at::ScalarType dtype);
// bits <= 4: two codes per byte (low nibble first), else one; the tail nibble is 0.
at::Tensor pack_codes_reference(const at::Tensor& codes, int64_t bits);
at::Tensor unpack_codes_reference(const at::Tensor& packed, int64_t bits, int64_t numel);

}  // namespace ops
}  // namespace lowbit
