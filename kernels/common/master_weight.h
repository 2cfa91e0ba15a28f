// Master weights without an fp32 copy (DESIGN.md, memory floor): a bf16 parameter plus a
// correction in slot kCorrectionSlot of the state descriptor. The step rebuilds the master value
// from (parameter, correction), updates it in fp32, and splits the result back into both.
//
// Both modes work on the fp32 bit pattern u of the master value x (sign and magnitude, so adding
// to u rounds the magnitude):
//   32-bit (int16 correction): bf16 bits b = (u + 0x8000) >> 16, the nearest bf16 with ties away
//     from zero, and c = u - (b << 16) in [-32768, 32767]. (b << 16) + c gives u back exactly, so
//     the step is bit for bit the one over fp32 master weights. Ties to even would need 0x8000
//     itself, one value more than int16 holds.
//   24-bit (int8 correction): x is first rounded to 24 bits, q = (u + 0x80) >> 8 (1 sign, 8
//     exponent and 15 fraction bits), then b = (q + 0x80) >> 8 and c = q - (b << 8) in [-128, 127];
//     the master value is (b << 16) + 256 c. Rounding to 24 bits moves x by at most 128 units in
//     the last place of fp32: |x24 - x| <= 2^-16 |x| for normal x, <= 2^-142 for subnormal x. The
//     update itself is computed in fp32 from x24, so after t steps the 24-bit master differs from
//     an fp32 master stepped with the same updates by at most the sum of the t roundings, where
//     the update does not depend on the master (tests/test_master_weight.cpp checks this bound).
// The bf16 parameter is always the nearest bf16 (ties away) of the master value; a master value at
// or past the top of bf16's range (bits 0x7F7F8000 and up, as for ordinary bf16 rounding) gives an
// infinite parameter whose correction still holds the master (24-bit: a master of bits 0x7F7FFF80
// and up rounds to infinity itself, as any rounding past the largest value does). NaN masters
// store the canonical NaN 0x7FC0 (sign kept) with correction 0.
#pragma once

#include <cstdint>

#include "float_convert.h"
#include "host_device.h"

namespace lowbit {
namespace kernels {

LOWBIT_HD bool master_is_nan(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

LOWBIT_HD float master_from16(uint16_t b, int16_t c) {
  return f32_from_bits((static_cast<uint32_t>(b) << 16) + static_cast<uint32_t>(static_cast<int32_t>(c)));
}

// master_to16 of a master value that is not NaN (bits u): a caller that tests a whole group for
// NaN at once (the GPU kernels) calls it directly.
LOWBIT_HD void master_split16(uint32_t u, uint16_t* b, int16_t* c) {
  const uint32_t hi = (u + 0x8000u) >> 16;
  *b = static_cast<uint16_t>(hi);
  *c = static_cast<int16_t>(static_cast<int32_t>(u - (hi << 16)));
}

LOWBIT_HD void master_to16(float x, uint16_t* b, int16_t* c) {
  const uint32_t u = f32_bits(x);
  if (master_is_nan(u)) {
    *b = static_cast<uint16_t>((u >> 16) & 0x8000u) | 0x7FC0u;
    *c = 0;
    return;
  }
  master_split16(u, b, c);
}

LOWBIT_HD float master_from8(uint16_t b, int8_t c) {
  return f32_from_bits((static_cast<uint32_t>(b) << 16) + static_cast<uint32_t>(static_cast<int32_t>(c) * 256));
}

// master_to8 of a master value that is not NaN (bits u).
LOWBIT_HD void master_split8(uint32_t u, uint16_t* b, int8_t* c) {
  // The 24-bit value q and its top 16 bits, each rounded half up on the magnitude. q of a value
  // at the top of fp32's range rounds into the infinity pattern (0x7F8000xx >> 8): b is then Inf.
  // (q + 0x80) >> 8 is (u + 0x8080) >> 16 (floor((floor(y) + k) / m) = floor((y + k) / m) for
  // integers k, m), which does not wait for q.
  const uint32_t q = (u + 0x80u) >> 8;
  const uint32_t hi = (u + 0x8080u) >> 16;
  *b = static_cast<uint16_t>(hi);
  *c = static_cast<int8_t>(static_cast<int32_t>(q - (hi << 8)));
}

LOWBIT_HD void master_to8(float x, uint16_t* b, int8_t* c) {
  const uint32_t u = f32_bits(x);
  if (master_is_nan(u)) {
    *b = static_cast<uint16_t>((u >> 16) & 0x8000u) | 0x7FC0u;
    *c = 0;
    return;
  }
  master_split8(u, b, c);
}

// The same three operations chosen by the correction's type, for code templated on its width.
LOWBIT_HD float master_from(uint16_t b, int16_t c) { return master_from16(b, c); }
LOWBIT_HD float master_from(uint16_t b, int8_t c) { return master_from8(b, c); }
LOWBIT_HD void master_split(uint32_t u, uint16_t* b, int16_t* c) { master_split16(u, b, c); }
LOWBIT_HD void master_split(uint32_t u, uint16_t* b, int8_t* c) { master_split8(u, b, c); }
LOWBIT_HD void master_to(float x, uint16_t* b, int16_t* c) { master_to16(x, b, c); }
LOWBIT_HD void master_to(float x, uint16_t* b, int8_t* c) { master_to8(x, b, c); }

}  // namespace kernels
}  // namespace lowbit
