// The keyed standard normal behind lowbit::keyed_normal_ (tensors/keyed_random.h): element
// `index`'s value under `key`, computed from nothing else, so any split of a tensor's elements
// between calls, ranks or devices gives the same bits. Only integer arithmetic and float64 +, -,
// *, / and sqrt, which IEEE 754 rounds exactly, never contracted into a fused multiply-add (the
// library's -ffp-contract=off, nvcc's --fmad=false): no libm log or cos, whose last bit differs
// between CPU and GPU libraries.
#pragma once

#include <cmath>
#include <cstdint>

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

// log(n / 2^32) for n in [1, 2^32]: n / 2^32 = m 2^e exactly with m = n / 2^k in [0.5, 1) (k the
// bit length of n) and e = k - 32; log m = 2 atanh(t), t = (m - 1) / (m + 1) in [-1/3, 0), whose odd
// series through t^23 errs by less than 1e-13.
LOWBIT_HD double keyed_log_unit(uint64_t n) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  const int k = 64 - __clzll(static_cast<long long>(n));
#else
  const int k = 64 - __builtin_clzll(n);
#endif
  const double m = static_cast<double>(n) / static_cast<double>(uint64_t{1} << k);
  const double t = (m - 1.0) / (m + 1.0), t2 = t * t;
  constexpr double c[12] = {1.0,        1.0 / 3,  1.0 / 5,  1.0 / 7,  1.0 / 9,  1.0 / 11,
                            1.0 / 13,   1.0 / 15, 1.0 / 17, 1.0 / 19, 1.0 / 21, 1.0 / 23};
  double s = c[11];
  for (int j = 10; j >= 0; --j) s = s * t2 + c[j];
  return s * t * 2.0 + static_cast<double>(k - 32) * 0.69314718055994530942;
}

// cos(2 pi u) for u = h / 2^32 in [0, 1): with a = |u - 1/2| and b = min(a, 1/2 - a) in [0, 1/4]
// (all exact), cos(2 pi u) = -cos(2 pi a), which is cos(2 pi b) where a > 1/4 and -cos(2 pi b)
// where not; cos's Taylor series at x = 2 pi b <= pi / 2 through x^20 errs by less than 1e-16.
LOWBIT_HD double keyed_cos_turns(uint32_t h) {
  const double u = static_cast<double>(h) * (1.0 / 4294967296.0);
  const double a = u < 0.5 ? 0.5 - u : u - 0.5;
  const double b = a < 0.5 - a ? a : 0.5 - a;
  const double x = b * 6.28318530717958647692, x2 = x * x;
  constexpr double c[11] = {1.0,
                            -1.0 / 2,
                            1.0 / 24,
                            -1.0 / 720,
                            1.0 / 40320,
                            -1.0 / 3628800,
                            1.0 / 479001600,
                            -1.0 / 87178291200.0,
                            1.0 / 20922789888000.0,
                            -1.0 / 6402373705728000.0,
                            1.0 / 2432902008176640000.0};
  double s = c[10];
  for (int j = 9; j >= 0; --j) s = s * x2 + c[j];
  return a > 0.25 ? s : -s;
}

// The standard normal at (key, index): Box-Muller from two 32-bit hashes of the index, the key's
// low half mixed into the index's high word and its high half into the low word's hash.
LOWBIT_HD double keyed_standard_normal(uint64_t key, uint64_t index) {
  const uint32_t k1 = static_cast<uint32_t>(key), k2 = static_cast<uint32_t>(key >> 32);
  const uint32_t high = keyed_mix32(static_cast<uint32_t>(index >> 32) ^ k1);
  const uint32_t h1 = keyed_mix32(keyed_mix32(static_cast<uint32_t>(index) ^ high) ^ k2);
  const uint32_t h2 = keyed_mix32(h1 ^ 0x9e3779b9U);
  // u1 = (h1 + 1) / 2^32 in (0, 1]: log(1) may come out a hair above 0, so the radius clamps at 0.
  const double r2 = -2.0 * keyed_log_unit(static_cast<uint64_t>(h1) + 1);
  return sqrt(r2 > 0.0 ? r2 : 0.0) * keyed_cos_turns(h2);
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
