// Bit patterns of the small float formats the fake-quant kernels round to (float8 e4m3fn / e5m2,
// float4 e2m1, the e8m0 power-of-two scale): what qat::convert stores. A format is the same
// Float8Format the rounding uses (fake_quant_math.h), so codes and rounding cannot disagree.
//   code = sign << (bits - 1) | exponent field << mantissa_bits | mantissa field
//   bias = 1 - min_exponent (e4m3: 7, e5m2: 15, e2m1: 1); exponent field 0 = subnormal.
#pragma once

#include <cstdint>

#include "fake_quant_math.h"  // Float8Format, f32_bits, f32_from_bits

namespace lowbit {
namespace kernels {

LOWBIT_HD int fq_float_bias(Float8Format f) { return 1 - f.min_exponent; }

// Exponent bits: the smallest field whose all-ones pattern exceeds the bias (4, 5, 2).
LOWBIT_HD int fq_float_exponent_bits(Float8Format f) {
  int e = 1;
  while ((1 << e) - 1 <= fq_float_bias(f)) ++e;
  return e;
}

// 8 for float8, 4 for e2m1.
LOWBIT_HD int fq_float_code_bits(Float8Format f) { return 1 + fq_float_exponent_bits(f) + f.mantissa_bits; }

// The value of a code, for the codes of finite values of magnitude <= f.max_value (the only ones
// the rounding produces); -0.0 keeps its sign. Exact: a float8 / float4 value is a float32.
LOWBIT_HD float fq_float_code_value(uint32_t code, Float8Format f) {
  const int mb = f.mantissa_bits, bits = fq_float_code_bits(f);
  const uint32_t sign = (code >> (bits - 1)) & 1u;
  const int e = static_cast<int>((code >> mb) & ((1u << (bits - 1 - mb)) - 1u));
  const uint32_t m = code & ((1u << mb) - 1u);
  // Subnormal: m * 2^(min_exponent - mb); normal: (2^mb + m) * 2^(e - bias - mb). Both exact.
  const int exp2 = (e == 0 ? f.min_exponent : e - fq_float_bias(f)) - mb;
  const float mant = static_cast<float>(e == 0 ? m : ((1u << mb) | m));
  const float v = mant * f32_from_bits(static_cast<uint32_t>(exp2 + 127) << 23);
  return sign ? -v : v;
}

// The e8m0 byte of an MX scale 2^e (fq_mx_scale: e in [-127, 127], 2^-127 a float32 subnormal):
// e + 127, i.e. the float32 exponent field, 0 for 2^-127.
LOWBIT_HD uint8_t fq_e8m0_code(float pow2_scale) { return static_cast<uint8_t>((f32_bits(pow2_scale) >> 23) & 0xFFu); }

LOWBIT_HD float fq_e8m0_value(uint8_t code) {
  return code == 0 ? f32_from_bits(0x00400000u) : f32_from_bits(static_cast<uint32_t>(code) << 23);
}

}  // namespace kernels
}  // namespace lowbit
