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

// 4-bit codes (uint8), two per byte, low nibble first, an odd count padded with a zero nibble; and
// the first n codes back out of such bytes (the reference ops' packing).
inline at::Tensor pack_nibbles(at::Tensor codes) {
  if (codes.numel() % 2) codes = at::cat({codes, at::zeros({1}, codes.options())});
  const at::Tensor pairs = codes.view({-1, 2});
  return at::bitwise_or(pairs.select(1, 0), at::bitwise_left_shift(pairs.select(1, 1), 4)).contiguous();
}
inline at::Tensor unpack_nibbles(const at::Tensor& packed, int64_t n) {
  return at::stack({at::bitwise_and(packed, 0xF), at::bitwise_right_shift(packed, 4)}, 1).view(-1).narrow(0, 0, n);
}

// Kernel parameters for checked arguments and their outputs (any device).
kernels::QuantizeParams quantize_params(const QuantizeArgs& a, at::Tensor& codes, at::Tensor& absmax);
kernels::DequantizeParams dequantize_params(const DequantizeArgs& a, at::Tensor& out);

// The ops' bodies on a backend with its own kernels (ops_cpu.cpp, ops_cuda.cpp): checks, then
// B::Guard (the device guard, held from before the outputs are allocated) and B::run(params, op),
// which runs the kernel of that params struct.
template <typename B>
std::tuple<at::Tensor, at::Tensor> quantize_blockwise_op(const at::Tensor& input, std::string_view format,
                                                         int64_t block_size) {
  const char* op = "lowbit::quantize_blockwise";
  const QuantizeArgs a = check_quantize_args(input, std::string(format), block_size, op);
  const typename B::Guard guard(a.input.device());
  auto [codes, absmax] = allocate_quantized(a);
  B::run(quantize_params(a, codes, absmax), op);
  check_absmax_flags(absmax, a, op);
  return {codes, absmax};
}

template <typename B>
at::Tensor dequantize_blockwise_op(const at::Tensor& codes, const at::Tensor& absmax, std::string_view format,
                                   int64_t block_size, at::IntArrayRef shape, std::optional<at::ScalarType> dtype) {
  const char* op = "lowbit::dequantize_blockwise";
  const DequantizeArgs a = check_dequantize_args(codes, absmax, std::string(format), block_size, shape, dtype, op);
  check_absmax_values(a, op);
  const typename B::Guard guard(a.codes.device());
  at::Tensor out = at::empty(a.shape, a.codes.options().dtype(a.dtype));
  B::run(dequantize_params(a, out), op);
  return out;
}

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
