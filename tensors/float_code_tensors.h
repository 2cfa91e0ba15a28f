// Small-float codes as ATen tensors (any device): the decode tables built from
// kernels/common/float_codes.h, the rounding the fake-quant reference applies, and encode / decode
// of rounded values. qat::convert stores what the fake-quant kernels rounded to with these.
#pragma once

#include <ATen/ATen.h>

#include "../kernels/common/fake_quant_math.h"  // Float8Format

namespace lowbit {
namespace ops {

// float32 [2^bits]: the value of every code (codes whose value exceeds max_value are never made).
at::Tensor float_code_table(kernels::Float8Format f, const at::Device& device);
// float32 [256]: 2^(code - 127) (2^-127 for code 0; 255 is never made).
at::Tensor e8m0_table(const at::Device& device);

// Nearest value of the format (ties to even) of float32 v with |v| <= max_value, element by
// element: fq_float8_round written with ATen ops.
at::Tensor round_to_float_format(const at::Tensor& v, kernels::Float8Format f);
// uint8 codes of float32 values that are exactly values of the format (round_to_float_format's
// output); the sign bit follows signbit, so -0.0 keeps its code. Refuses anything else.
at::Tensor encode_float_codes(const at::Tensor& values, kernels::Float8Format f, const char* who);
// float32 values of uint8 codes (same shape).
at::Tensor decode_float_codes(const at::Tensor& codes, kernels::Float8Format f);
// e8m0 bytes of power-of-two float32 scales (fq_e8m0_code) and back.
at::Tensor encode_e8m0(const at::Tensor& pow2_scales);
at::Tensor decode_e8m0(const at::Tensor& codes);

}  // namespace ops
}  // namespace lowbit
