// The companded 8-bit formats (Pow8Signed, Pow8Unsigned): codes whose values are squares,
//   unsigned  value(c) = (c / 255)^2,              c = 0..255
//   signed    value(b) = sign(c) (c / 127)^2,      c = b - 127 in -127..127 (byte 127 is 0; 255 reads as 254)
// i.e. the square root of |x| / absmax quantized linearly: square-root companding, as FlashOptim
// does for Adam's second moment (arXiv 2602.23349), here for both moments. Against the dynamic
// tree map: the same 8 bits, no table. Encode and decode are a few arithmetic operations, so the
// GPU step needs no shared-memory lookups (the table walks bounded the Dyn8 step: bench/RESULTS.md).
//
// Encode rounds in the companded domain: code = rint(sqrt(|y|) * cmax), y the normalized value,
// with one exception for the unsigned format: a positive y never encodes to 0 (code >= 1), so a
// second moment that is small but not zero never decodes to 0 and never divides an update by eps
// alone. Every operation is IEEE-exact on every backend (sqrt and products correctly rounded, no
// contraction possible), so the codes are the same bits everywhere.
//
// The table-driven paths (CPU encode, quantize ops, the ATen reference) need no branch for these
// formats: the encode is monotone in y (sqrt, a product by a positive constant and rint are), so
// it equals "number of thresholds below y" for thresholds found from it (code_tables.h:
// make_encode_table), and the codebook holds exactly decode's values.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace lowbit {
namespace kernels {

constexpr float kPow8SignedMax = 127.0f;
constexpr float kPow8UnsignedMax = 255.0f;
// The reciprocals as floats: decode multiplies by them (one rounding), the same on every backend.
constexpr float kPow8SignedInvSq = static_cast<float>(1.0 / 16129.0);
constexpr float kPow8UnsignedInvSq = static_cast<float>(1.0 / 65025.0);

LOWBIT_HD float pow8_decode_unsigned(uint32_t code) {
  return static_cast<float>(code * code) * kPow8UnsignedInvSq;
}

LOWBIT_HD float pow8_decode_signed(uint32_t code) {
  const int32_t c = static_cast<int32_t>(code < 254u ? code : 254u) - 127;
  return static_cast<float>(c * (c < 0 ? -c : c)) * kPow8SignedInvSq;
}

LOWBIT_HD float pow8_decode(uint32_t code, bool is_signed) {
  return is_signed ? pow8_decode_signed(code) : pow8_decode_unsigned(code);
}

// y: a normalized value (encode.h: normalize); NaN encodes to 0, the code every table encode gives it.
LOWBIT_HD uint8_t pow8_encode_unsigned(float y) {
  float r = rintf(sqrtf(y) * kPow8UnsignedMax);   // NaN for NaN and for y < 0
  r = r >= 1.0f ? r : (y > 0.0f ? 1.0f : 0.0f);  // NaN fails both compares: 0
  return static_cast<uint8_t>(r < kPow8UnsignedMax ? r : kPow8UnsignedMax);
}

LOWBIT_HD uint8_t pow8_encode_signed(float y) {
  const float a = y < 0.0f ? -y : y;
  float r = rintf(sqrtf(a) * kPow8SignedMax);
  r = r < kPow8SignedMax ? r : kPow8SignedMax;
  if (!(y == y)) return 0;
  return static_cast<uint8_t>(y < 0.0f ? 127.0f - r : 127.0f + r);
}

LOWBIT_HD uint8_t pow8_encode(float y, bool is_signed) {
  return is_signed ? pow8_encode_signed(y) : pow8_encode_unsigned(y);
}

}  // namespace kernels
}  // namespace lowbit
