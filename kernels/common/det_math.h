// Deterministic double-precision pow (integer exponent), exp, log and cos from IEEE +, -, *, / and bit
// operations only. Library exp/log/pow differ between glibc, CUDA and ROCm in the last bit; these
// give the same bits on every backend (the build turns off contraction), so per-step values derived
// on a GPU equal the CPU's. Accuracy: a few ulps of double, far below the float they are rounded to.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace lowbit {
namespace kernels {

LOWBIT_HD uint64_t f64_bits(double x) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return static_cast<uint64_t>(__double_as_longlong(x));
#else
  uint64_t u;
  std::memcpy(&u, &x, 8);
  return u;
#endif
}

LOWBIT_HD double f64_from_bits(uint64_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __longlong_as_double(static_cast<long long>(u));
#else
  double x;
  std::memcpy(&x, &u, 8);
  return x;
#endif
}

// x^n for n >= 0 by repeated squaring (x^0 = 1).
LOWBIT_HD double det_pow_int(double x, int64_t n) {
  double result = 1.0, base = x;
  while (n > 0) {
    if (n & 1) result = result * base;
    base = base * base;
    n >>= 1;
  }
  return result;
}

// 2^k for an integer k in the normal range [-1022, 1023].
LOWBIT_HD double det_exp2i(int64_t k) { return f64_from_bits(static_cast<uint64_t>(k + 1023) << 52); }

// Natural logarithm of a finite x > 0 (normal or subnormal); NaN otherwise.
LOWBIT_HD double det_log(double x) {
  if (!(x > 0.0) || x - x != 0.0) return x - x + (x > 0.0 ? 0.0 : __builtin_nan(""));
  int64_t e = 0;
  if (x < 2.2250738585072014e-308) {  // subnormal: scale into the normal range first
    x = x * 18014398509481984.0;       // 2^54
    e = -54;
  }
  const uint64_t u = f64_bits(x);
  e += static_cast<int64_t>((u >> 52) & 0x7FF) - 1023;
  double m = f64_from_bits((u & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);  // [1, 2)
  if (m > 1.4142135623730951) {  // m in [sqrt(1/2), sqrt(2)): |s| below 0.172
    m = m * 0.5;
    e += 1;
  }
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1): 2 (s + s^3/3 + s^5/5 + ...), s^2 < 0.0295.
  const double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  double term = s, sum = 0.0;
  for (int k = 1; k <= 27; k += 2) {
    sum = sum + term / static_cast<double>(k);
    term = term * s2;
  }
  // e * ln 2 with ln 2 split in two (Cody and Waite) so the product is exact in its high part.
  const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  const double ed = static_cast<double>(e);
  return (ed * ln2_hi + 2.0 * sum) + ed * ln2_lo;
}

// e^x for finite x; 0 below the smallest normal's exponent, +Inf above the largest double.
LOWBIT_HD double det_exp(double x) {
  if (x != x) return x;
  if (x > 709.7) return __builtin_inf();
  if (x < -708.3) return 0.0;
  const double ln2_hi = 6.93147180369123816490e-01, ln2_lo = 1.90821492927058770002e-10;
  const double inv_ln2 = 1.44269504088896338700e+00;
  const double kd = x * inv_ln2;
  const int64_t k = static_cast<int64_t>(kd < 0.0 ? kd - 0.5 : kd + 0.5);  // nearest integer
  const double r = (x - static_cast<double>(k) * ln2_hi) - static_cast<double>(k) * ln2_lo;  // |r| <= 0.35
  // Taylor series of e^r to r^18 / 18!: the first omitted term is below 1e-17.
  double term = 1.0, sum = 1.0;
  for (int n = 1; n <= 18; ++n) {
    term = term * r / static_cast<double>(n);
    sum = sum + term;
  }
  if (k < -1022) return sum * det_exp2i(k + 54) * 5.551115123125783e-17;  // 2^-54
  return sum * det_exp2i(k);
}

// cos(2 pi u) for u in [0, 1). With a = |u - 1/2| and b = min(a, 1/2 - a) in [0, 1/4] (exact for
// any u a multiple of 2^-53 or coarser), cos(2 pi u) = -cos(2 pi a), which is cos(2 pi b) where
// a > 1/4 and -cos(2 pi b) where not; cos's Taylor series at x = 2 pi b <= pi / 2 through x^20 errs
// by less than 1e-16.
LOWBIT_HD double det_cos_turns(double u) {
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

}  // namespace kernels
}  // namespace lowbit
