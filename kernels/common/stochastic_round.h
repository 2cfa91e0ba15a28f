// Stochastic rounding of fp32 to bf16 with noise from a counter-based hash of (seed, index): the
// same element gets the same noise however the work is split, so runs are reproducible and a
// resumed run (seed in the checkpoint) is bit-exact.
#pragma once

#include <cstdint>

#include "float_convert.h"
#include "host_device.h"

namespace lowbit {
namespace kernels {

// splitmix64 finalizer: a well-mixed 64-bit hash of a 64-bit counter (per parameter and step).
LOWBIT_HD uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The 16 noise bits of element `index` under a per-step `seed` (step_seed: already well mixed).
// Per element only 32-bit work, because this runs once per bf16 parameter element on every
// backend and a 64-bit multiply is several instructions on a GPU (and half the lanes of AVX-512):
// the index's and seed's halves are folded into 32 bits (for a given seed, a bijection of the
// index's low 32 bits), then the lowbias32 integer hash (Chris Wellons' hash-prospector; bias
// ~0.17) spreads them; the noise is its high half.
LOWBIT_HD uint32_t sr_noise(uint64_t seed, uint64_t index) {
  uint32_t x = (static_cast<uint32_t>(index) ^ static_cast<uint32_t>(seed)) +
               0x9E3779B9u * (static_cast<uint32_t>(index >> 32) ^ static_cast<uint32_t>(seed >> 32));
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x >> 16;
}

// Magnitudes (bits of |x|) below this one neither are Inf or NaN nor round up past the largest
// finite bf16 with any noise (< 2^16): for them bf16_stochastic is (u + noise) >> 16. A caller
// that tests a whole group at once (the GPU kernels) takes that path for the group.
constexpr uint32_t kStochasticPlainBelow = 0x7F7F0000u;

LOWBIT_HD bf16_t bf16_stochastic(float x, uint64_t seed, uint64_t index) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u) return from_f32<bf16_t>(x);  // Inf / NaN: nearest
  const uint32_t noise = sr_noise(seed, index);
  const uint32_t r = u + noise;
  // Rounding up into the exponent is correct (carries); past the largest finite value, clamp.
  if ((r & 0x7F800000u) == 0x7F800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x7F7F)};
  return bf16_t{static_cast<uint16_t>(r >> 16)};
}

}  // namespace kernels
}  // namespace lowbit
