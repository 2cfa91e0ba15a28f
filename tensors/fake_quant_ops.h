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

// fake_quant_lsq_backward checked, its outputs allocated and its kernel parameters filled (any
// device): what the CPU and CUDA bindings share before calling their kernel.
struct LsqBackwardCall {
  at::Tensor grad, grad_input, grad_scale, grad_zero_point;  // grad: contiguous; outputs: allocated
  kernels::LsqBackwardParams params;
};
LsqBackwardCall prepare_lsq_backward(const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale,
                                     const at::Tensor& zero_point, int64_t group_size, int64_t bits, bool is_signed,
                                     double grad_factor, const char* op);

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
