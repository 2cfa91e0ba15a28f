// Stochastic rounding of fp32 to bf16 with noise from a counter-based hash of (seed, index): the
// same element gets the same noise however the work is split, so runs are reproducible and a
// resumed run (seed in the checkpoint) is bit-exact.
#pragma once

#include <cstdint>

#include "float_convert.h"
#include "host_device.h"

namespace lowbit {
namespace kernels {

// splitmix64 finalizer: a well-mixed 64-bit hash of a 64-bit counter.
LOWBIT_HD uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

LOWBIT_HD bf16_t bf16_stochastic(float x, uint64_t seed, uint64_t index) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u) return from_f32<bf16_t>(x);  // Inf / NaN: nearest
  const uint32_t noise = static_cast<uint32_t>(mix64(seed ^ mix64(index))) & 0xFFFFu;
  const uint32_t r = u + noise;
  // Rounding up into the exponent is correct (carries); past the largest finite value, clamp.
  if ((r & 0x7F800000u) == 0x7F800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x7F7F)};
  return bf16_t{static_cast<uint16_t>(r >> 16)};
}

}  // namespace kernels
}  // namespace lowbit
