// The dispatcher ops lowbit::quantize_blockwise / dequantize_blockwise: shared argument checks and
// the per-backend entry points registered in ops_*.cpp.
//
// Schema (TORCH_LIBRARY(lowbit)):
//   quantize_blockwise(Tensor input, str format, int block_size=0) -> (Tensor codes, Tensor absmax)
//   dequantize_blockwise(Tensor codes, Tensor absmax, str format, int block_size, int[] shape,
//                        ScalarType? dtype=None) -> Tensor
//   quantize_blockwise_reference / dequantize_blockwise_reference: the same, ATen ops only (oracle).
//
// Input rules: float32, bfloat16 or float16, any shape and strides (read as if contiguous). NaN or
// Inf anywhere, or a negative value for an unsigned format, is refused with an error naming the
// block: lowbit never encodes a value it cannot represent.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "../kernels/common/quantize_params.h"

#include "quant_format.h"

namespace lowbit {
namespace ops {

struct QuantizeArgs {
  at::Tensor input;  // contiguous, flat
  QuantFormat format;
  int64_t block_size;
};

struct DequantizeArgs {
  at::Tensor codes;   // contiguous
  at::Tensor absmax;  // contiguous
  QuantFormat format;
  int64_t block_size;
  std::vector<int64_t> shape;
  int64_t numel;
  at::ScalarType dtype;
};

QuantizeArgs check_quantize_args(const at::Tensor& input, const std::string& format, int64_t block_size,
                                 const char* op);
DequantizeArgs check_dequantize_args(const at::Tensor& codes, const at::Tensor& absmax, const std::string& format,
                                     int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype,
                                     const char* op);
// The values of a.absmax (one wait for a device): NaN, negative or infinite is refused naming the
// block. Only the dequantize ops read them; a QTensor may hold flagged blocks (a state that overflowed).
void check_absmax_values(const DequantizeArgs& a, const char* op);

// Empty outputs of the right sizes for a quantize of `a`.
std::tuple<at::Tensor, at::Tensor> allocate_quantized(const QuantizeArgs& a);

// Raises if a block's absmax carries the in-band invalid-input flag (kernels/common/encode.h).
void check_absmax_flags(const at::Tensor& absmax, const QuantizeArgs& a, const char* op);
// The flat index of the first element of `bad` (bool) that is true, or -1 where none is: how a check
// over a whole tensor names the element it refuses (one wait for a device).
int64_t first_true(const at::Tensor& bad);

kernels::ElemType elem_type(at::ScalarType t);

// Kernel parameters for checked arguments and their outputs (any device).
kernels::QuantizeParams quantize_params(const QuantizeArgs& a, at::Tensor& codes, at::Tensor& absmax);
kernels::DequantizeParams dequantize_params(const DequantizeArgs& a, at::Tensor& out);

// The ATen-only reference (also registered as the CompositeExplicitAutograd kernel).
// quantize_reference_flagged returns invalid blocks flagged in absmax (encode.h) instead of raising.
std::tuple<at::Tensor, at::Tensor> quantize_reference_flagged(const at::Tensor& input, std::string_view format,
                                                              int64_t block_size);
std::tuple<at::Tensor, at::Tensor> quantize_reference(const at::Tensor& input, std::string_view format,
                                                      int64_t block_size);
at::Tensor dequantize_reference(const at::Tensor& codes, const at::Tensor& absmax, std::string_view format,
                                int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype);

}  // namespace ops
}  // namespace lowbit
