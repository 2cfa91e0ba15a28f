// The companded 8-bit formats (Pow8Signed, Pow8Unsigned): codes whose values are squares,
//   unsigned  value(c) = (c / 255)^2,              c = 0..255
//   signed    value(b) = sign(c) (c / 127)^2,      c = b - 127 in -127..127 (byte 127 is 0; 255 reads as 254)
// i.e. the square root of |x| / absmax quantized linearly: square-root companding, as FlashOptim
// does for Adam's second moment (arXiv 2602.23349), here for both moments. Against the dynamic
// tree map: the same 8 bits, and a rule simple enough to encode and decode by arithmetic (the GPU
// quantize kernels do). The GPU step kernels use the tables built from it (code_tables.h): with
// the window-bucket encode (encode.h) they ran faster there (kernels/cuda/step_args.cuh: Family).
//
// Encode rounds in the companded domain: |y| gets the grid step c whose square-root interval holds
// it, the boundary between steps c and c+1 being the threshold
//   T(c) = ((c + 1/2)^2 * fl(1/m^2))   (m = 127 or 255; (c + 1/2)^2 is exact, one rounding),
// so code(|y|) = #{c : T(c) < |y|}, clamped to m; T(0) is 0 instead: a nonzero y never encodes to 0
// (the rule of every format, code_tables.h: keep_nonzero_off_zero), so a second moment that is
// small but not zero never decodes to 0 and never divides an update by eps alone. NaN encodes to code 0 (byte 0). (The table-encoded formats
// send a positive NaN above every threshold and a negative one below: a NaN only arises in a block
// whose absmax is already non-finite, reported as overflow, which decodes to NaN whatever its codes;
// such a block's codes can differ between the CPU and the GPU, whose NaNs carry other signs.)
//
// Kernels find c from any estimate of sqrt|y| * m within one step (the GPU's one-instruction
// reciprocal square root; the CPU's sqrtf) and correct it with the two thresholds around it: the
// result depends only on T, so it is the same bits on every backend, branch-free (IEEE sqrt has a
// slow path whose call broke the step kernel's instruction overlap: 15 % slower on an H100).
//
// The table-driven paths (CPU encode, quantize ops, the ATen reference) need no branch for these
// formats: the encode is monotone in y, so it equals "number of thresholds below y" for thresholds
// found from it (code_tables.h: make_encode_table), and the codebook holds exactly decode's values.
#pragma once

#include <cmath>
#include <cstdint>

#include "float_convert.h"
#include "host_device.h"

namespace lowbit {
namespace kernels {

constexpr float kPow8SignedMax = 127.0f;
constexpr float kPow8UnsignedMax = 255.0f;
// The reciprocals as floats: decode multiplies by them (one rounding), the same on every backend.
constexpr float kPow8SignedInvSq = static_cast<float>(1.0 / 16129.0);
constexpr float kPow8UnsignedInvSq = static_cast<float>(1.0 / 65025.0);

// Small integers to and from float by the 2^23 trick (the integer in the low mantissa bits of
// 2^23 + n): float adds and bit operations instead of conversion instructions, which run at an
// eighth of the float rate on GPUs and bounded the step kernel. Exact for 0 <= n < 2^22.
LOWBIT_HD float small_uint_to_float(uint32_t n) { return f32_from_bits(0x4B000000u | n) - 8388608.0f; }
LOWBIT_HD uint32_t small_float_to_uint(float x) { return f32_bits(x + 8388608.0f) & 0x7FFFFFu; }
// Round half to even for |x| < 2^22, as rintf: two adds.
LOWBIT_HD float round_even_small(float x) { return (x + 12582912.0f) - 12582912.0f; }

LOWBIT_HD float pow8_decode_unsigned(uint32_t code) {
  const float c = small_uint_to_float(code);
  return (c * c) * kPow8UnsignedInvSq;  // c * c is exact
}

LOWBIT_HD float pow8_decode_signed(uint32_t code) {
  const float c = small_uint_to_float(code < 254u ? code : 254u) - 127.0f;
  return (c * (c < 0.0f ? -c : c)) * kPow8SignedInvSq;
}

LOWBIT_HD float pow8_decode(uint32_t code, bool is_signed) {
  return is_signed ? pow8_decode_signed(code) : pow8_decode_unsigned(code);
}

LOWBIT_HD float pow8_threshold(float c, float inv_sq) {
  const float h = c + 0.5f;
  return (h * h) * inv_sq;
}

// An estimate of sqrt(a) for a in [2^-40, 1]. pow8_step needs it within a relative 2^-11: then
// sqrt(a) * m (m <= 255) is off by less than 1/8 of a step, the rounded estimate is within one
// step of the answer, and the compares on each side find the answer itself. The host's scalar path
// takes sqrtf, CUDA rsqrtf, the AVX2 loop vrsqrtps (relative error <= 1.5 * 2^-12 on every x86).
LOWBIT_HD float pow8_sqrt_estimate(float a) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return a * rsqrtf(a);
#else
  return sqrtf(a);
#endif
}

// The grid step of a in [0, 1]: the estimate (of a raised to 2^-40, far below T(0), so that it is
// finite), then one threshold compare on each side.
LOWBIT_HD float pow8_step(float a, float m, float inv_sq) {
  float c = round_even_small(pow8_sqrt_estimate(a > 0x1p-40f ? a : 0x1p-40f) * m);
  c = c < m ? c : m;
  c += (a > pow8_threshold(c, inv_sq) ? 1.0f : 0.0f) - (a <= pow8_threshold(c - 1.0f, inv_sq) ? 1.0f : 0.0f);
  return c > 0.0f ? (c < m ? c : m) : 0.0f;
}

// y: a normalized value (encode.h: normalize).
LOWBIT_HD uint8_t pow8_encode_unsigned(float y) {
  const float a = y > 0.0f ? (y < 1.0f ? y : 1.0f) : 0.0f;  // 1 and above: the top code; NaN, y <= 0: 0
  const float c = pow8_step(a, kPow8UnsignedMax, kPow8UnsignedInvSq);
  return static_cast<uint8_t>(small_float_to_uint(c >= 1.0f ? c : (y > 0.0f ? 1.0f : 0.0f)));
}

LOWBIT_HD uint8_t pow8_encode_signed(float y) {
  const float abs_y = y < 0.0f ? -y : y;
  float c = pow8_step(abs_y < 1.0f ? abs_y : 1.0f, kPow8SignedMax, kPow8SignedInvSq);
  c = c >= 1.0f ? c : (abs_y > 0.0f ? 1.0f : 0.0f);  // a nonzero y keeps its sign (code_tables.h)
  const float b = y < 0.0f ? 127.0f - c : 127.0f + c;
  return static_cast<uint8_t>(small_float_to_uint(y == y ? b : 0.0f));
}

LOWBIT_HD uint8_t pow8_encode(float y, bool is_signed) {
  return is_signed ? pow8_encode_signed(y) : pow8_encode_unsigned(y);
}

}  // namespace kernels
}  // namespace lowbit
