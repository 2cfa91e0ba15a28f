// Bit-exact conversions between float32 and the 16-bit float types (round to nearest even), the
// same results as ATen's casts, usable on host and device without any framework type.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace lowbit {
namespace kernels {

struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

LOWBIT_HD uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

LOWBIT_HD float f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

LOWBIT_HD float to_f32(float x) { return x; }
LOWBIT_HD float to_f32(bf16_t x) { return f32_from_bits(static_cast<uint32_t>(x.bits) << 16); }

LOWBIT_HD float to_f32(f16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1Fu;
  uint32_t man = h.bits & 0x3FFu;
  if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    if (man == 0) return f32_from_bits(sign);
    // Subnormal half: value = man * 2^-24, exact in float32.
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

template <typename T> LOWBIT_HD T from_f32(float x);

template <> LOWBIT_HD float from_f32<float>(float x) { return x; }

template <> LOWBIT_HD bf16_t from_f32<bf16_t>(float x) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return bf16_t{0x7FC0};  // NaN
  const uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(rounded >> 16)};
}

template <> LOWBIT_HD f16_t from_f32<f16_t>(float x) {
  const uint32_t u = f32_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t ax = u & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return f16_t{static_cast<uint16_t>(sign | 0x7E00u)};  // NaN
  if (ax >= 0x477FF000u) return f16_t{static_cast<uint16_t>(sign | 0x7C00u)};  // rounds to Inf
  if (ax < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to nearest even, computed exactly by
    // adding a magic float whose ulp is 2^-24 (the add rounds to nearest even).
    const float magic = f32_from_bits(0x3F000000u);  // 0.5: ulp 2^-24
    const float r = f32_from_bits(ax) + magic;
    return f16_t{static_cast<uint16_t>(sign | (f32_bits(r) - 0x3F000000u))};
  }
  const uint32_t rounded = ax + 0xFFFu + ((ax >> 13) & 1u);
  return f16_t{static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13))};
}

}  // namespace kernels
}  // namespace lowbit
