// The keyed standard normal behind lowbit::keyed_normal_ (tensors/keyed_random.h): element
// `index`'s value under `key`, computed from nothing else, so any split of a tensor's elements
// between calls, ranks or devices gives the same bits. Only integer arithmetic and float64 +, -,
// *, / and sqrt, which IEEE 754 rounds exactly, never contracted into a fused multiply-add (the
// library's -ffp-contract=off, nvcc's --fmad=false): log and cos are det_math.h's, not libm's,
// whose last bit differs between CPU and GPU libraries.
#pragma once

#include <cmath>
#include <cstdint>

#include "det_math.h"
#include "float_convert.h"
#include "host_device.h"

namespace lowbit {
namespace kernels {

enum class KeyedOut : int { F64 = 0, F32 = 1, BF16 = 2, F16 = 3 };

struct KeyedNormalParams {
  void* out = nullptr;  // n contiguous elements of `type`
  KeyedOut type = KeyedOut::F32;
  int64_t n = 0;
  uint64_t first = 0;  // the element index of out[0]
  uint64_t key = 0;
  double mean = 0, std = 1;
};

// A 32-bit integer finalizer (xor-shift, multiply: Wellons' "lowbias32" from hash-prospector):
// every input bit moves every output bit.
LOWBIT_HD uint32_t keyed_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  return x ^ (x >> 16);
}

// The standard normal at (key, index): Box-Muller from two 32-bit hashes of the index, the key's
// low half mixed into the index's high word and its high half into the low word's hash.
LOWBIT_HD double keyed_standard_normal(uint64_t key, uint64_t index) {
  const uint32_t k1 = static_cast<uint32_t>(key), k2 = static_cast<uint32_t>(key >> 32);
  const uint32_t high = keyed_mix32(static_cast<uint32_t>(index >> 32) ^ k1);
  const uint32_t h1 = keyed_mix32(keyed_mix32(static_cast<uint32_t>(index) ^ high) ^ k2);
  const uint32_t h2 = keyed_mix32(h1 ^ 0x9e3779b9U);
  // u1 = (h1 + 1) / 2^32 in (0, 1] (log's argument) and u2 = h2 / 2^32 in [0, 1), both exact.
  constexpr double kTwoToMinus32 = 1.0 / 4294967296.0;
  const double u1 = (static_cast<double>(h1) + 1.0) * kTwoToMinus32, u2 = static_cast<double>(h2) * kTwoToMinus32;
  return sqrt(-2.0 * det_log(u1)) * det_cos_turns(u2);
}

// out[i] = mean + std * z(key, first + i), in float64, then rounded to float32 (and from there to
// a 16-bit type).
LOWBIT_HD void keyed_normal_store(const KeyedNormalParams& p, int64_t i) {
  const double v = p.mean + p.std * keyed_standard_normal(p.key, p.first + static_cast<uint64_t>(i));
  switch (p.type) {
    case KeyedOut::F64: static_cast<double*>(p.out)[i] = v; break;
    case KeyedOut::F32: static_cast<float*>(p.out)[i] = static_cast<float>(v); break;
    case KeyedOut::BF16: static_cast<bf16_t*>(p.out)[i] = from_f32<bf16_t>(static_cast<float>(v)); break;
    case KeyedOut::F16: static_cast<f16_t*>(p.out)[i] = from_f32<f16_t>(static_cast<float>(v)); break;
  }
}

}  // namespace kernels
}  // namespace lowbit
