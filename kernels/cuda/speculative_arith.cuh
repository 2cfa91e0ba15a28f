// Division and square root for the GPU step kernels (optim_rules.h: a rule's arithmetic policy),
// correctly rounded: the IEEE results, bit for bit, as ExactArith gives them.
//
// For a / b and sqrtf(x), nvcc emits a short sequence (a hardware approximation refined by fused
// multiply-adds) plus a test of the operands and a branch to a long, general routine where the
// short one may be wrong (zeros, subnormals, Inf, NaN, quotients near the ends of the range), with
// a reconvergence point around each. SpeculativeArith runs the same short sequences with no branch
// and records in `ok` whether every operand was inside a range where they are exact; a lane whose
// `ok` is false redoes its elements with ExactArith (the caller's job, once per unit of 8
// elements). In AdamW's Q8 kernel that took the update of a unit from 398 to 349 instructions, but
// only AdEMAMix ran faster for it, and only AdEMAMix with dense state takes it now (step_tuning.cuh:
// kSpeculates).
//
// The ranges, inside those nvcc's own tests accept (tests/test_optim_cuda.cpp checks the results
// against the IEEE operations over every float of the square root's range and random pairs of the
// quotient's):
//   sqrt: x in [2^-101, FLT_MAX], nvcc's own test (bits 0x0D000000..0x7F7FFFFF).
//   div:  b in [2^-62, 2^62] (positive), and a = ±0 or |a| in [2^-62, 2^62]. The quotient is then
//         normal, and a - b q exact for q within an ulp of a / b, as the refinement needs.
//   rcp:  1 / x for x > 0 with a biased exponent in [1, 252]: nvcc's own reciprocal (1.0f / x)
//         is this sequence there, and branches to its long routine only outside.
// The quotient's last step is written as q0 - r1 (b q0 - a), the negation of nvcc's
// q0 + r1 (a - b q0): the same value for every a != 0 (rounding to nearest is symmetric), and the
// IEEE signed zero for a = ±0 (nvcc's form gives +0 for -0 / b, which is why its test sends zeros
// to the long routine).
// HIP: the exact operations (ok stays true).
#pragma once

#include <cstdint>

#include "../common/host_device.h"
#include "../common/optim_rules.h"

namespace lowbit {
namespace kernels {
namespace gpu_step {

// The short sequences and the ranges where they are exact (above), one operation each.
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
__device__ __forceinline__ bool short_sqrt_exact(float x) { return __float_as_uint(x) + 0xF3000000u <= 0x727FFFFFu; }

__device__ __forceinline__ float short_sqrt(float x) {
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  const float y = __fmul_rn(x, r);
  const float half_r = __fmul_rn(r, 0.5f);
  const float e = __fmaf_rn(-y, y, x);
  return __fmaf_rn(e, half_r, y);
}

__device__ __forceinline__ bool short_div_exact(float a, float b) {
  const uint32_t abs_a = __float_as_uint(a) & 0x7FFFFFFFu;
  return __float_as_uint(b) - 0x20800000u <= 0x3E000000u && (abs_a - 0x20800000u <= 0x3E000000u || abs_a == 0u);
}

__device__ __forceinline__ bool short_rcp_exact(float x) {
  return __float_as_uint(x) - 0x00800000u < 0x7E000000u;  // 2^-126 <= x < 2^126
}

__device__ __forceinline__ float short_rcp(float x) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(x));
  return __fmaf_rn(r0, -__fmaf_rn(x, r0, -1.0f), r0);
}

__device__ __forceinline__ float short_div(float a, float b) {
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(b));
  const float r1 = __fmaf_rn(r0, __fmaf_rn(-b, r0, 1.0f), r0);
  const float q0 = __fmul_rn(a, r1);
  return __fmaf_rn(-r1, __fmaf_rn(b, q0, -a), q0);
}
#endif

struct SpeculativeArith {
  bool ok = true;

#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
  __device__ __forceinline__ float sqrt(float x) {
    ok &= short_sqrt_exact(x);
    return short_sqrt(x);
  }

  __device__ __forceinline__ float div(float a, float b) {
    ok &= short_div_exact(a, b);
    return short_div(a, b);
  }
#else
  __device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
  __device__ __forceinline__ float div(float a, float b) { return a / b; }
#endif
};

// Eight elements as one value of a rule (optim_rules.h: the rules are templates over the float
// type, as the CPU's AVX-512 loop runs them on 16): each operator is the float operation on each
// element, so the bits are the same, and a lane's 8 elements go through the rule together.
struct f32x8 {
  float v[8];
};

#define LOWBIT_F32X8_BINARY(OP)                                                                       \
  __device__ __forceinline__ f32x8 operator OP(const f32x8& a, const f32x8& b) {                   \
    f32x8 r;                                                                                        \
    _Pragma("unroll") for (int e = 0; e < 8; ++e) r.v[e] = a.v[e] OP b.v[e];                        \
    return r;                                                                                       \
  }                                                                                                 \
  __device__ __forceinline__ f32x8 operator OP(const f32x8& a, float b) {                          \
    f32x8 r;                                                                                        \
    _Pragma("unroll") for (int e = 0; e < 8; ++e) r.v[e] = a.v[e] OP b;                             \
    return r;                                                                                       \
  }                                                                                                 \
  __device__ __forceinline__ f32x8 operator OP(float a, const f32x8& b) {                          \
    f32x8 r;                                                                                        \
    _Pragma("unroll") for (int e = 0; e < 8; ++e) r.v[e] = a OP b.v[e];                             \
    return r;                                                                                       \
  }
LOWBIT_F32X8_BINARY(+)
LOWBIT_F32X8_BINARY(-)
LOWBIT_F32X8_BINARY(*)
#undef LOWBIT_F32X8_BINARY

__device__ __forceinline__ f32x8 operator-(const f32x8& a) {
  f32x8 r;
#pragma unroll
  for (int e = 0; e < 8; ++e) r.v[e] = -a.v[e];
  return r;
}

__device__ __forceinline__ f32x8 vmax(const f32x8& a, const f32x8& b) {
  f32x8 r;
#pragma unroll
  for (int e = 0; e < 8; ++e) r.v[e] = kernels::vmax(a.v[e], b.v[e]);
  return r;
}

__device__ __forceinline__ f32x8 sign_of(const f32x8& a) {
  f32x8 r;
#pragma unroll
  for (int e = 0; e < 8; ++e) r.v[e] = kernels::sign_of(a.v[e]);
  return r;
}

// Division and square root of 8 elements at once: one test of all 8 operands, then the short
// sequences for all 8, or, where one is outside their range, the IEEE operations for all 8. nvcc's
// own division and square root test and branch per element, and its scheduler does not move the
// next element's work across those branches, so a lane's 8 elements ran one after another.
struct BatchArith {
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
  __device__ __forceinline__ f32x8 sqrt(const f32x8& x) const {
    bool ok = true;
#pragma unroll
    for (int e = 0; e < 8; ++e) ok &= short_sqrt_exact(x.v[e]);
    f32x8 r;
    if (ok) {
#pragma unroll
      for (int e = 0; e < 8; ++e) r.v[e] = short_sqrt(x.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) r.v[e] = sqrtf(x.v[e]);
    }
    return r;
  }

  __device__ __forceinline__ f32x8 div(const f32x8& a, const f32x8& b) const {
    bool ok = true;
#pragma unroll
    for (int e = 0; e < 8; ++e) ok &= short_div_exact(a.v[e], b.v[e]);
    f32x8 r;
    if (ok) {
#pragma unroll
      for (int e = 0; e < 8; ++e) r.v[e] = short_div(a.v[e], b.v[e]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) r.v[e] = a.v[e] / b.v[e];
    }
    return r;
  }
#else
  __device__ __forceinline__ f32x8 sqrt(const f32x8& x) const {
    f32x8 r;
    for (int e = 0; e < 8; ++e) r.v[e] = sqrtf(x.v[e]);
    return r;
  }
  __device__ __forceinline__ f32x8 div(const f32x8& a, const f32x8& b) const {
    f32x8 r;
    for (int e = 0; e < 8; ++e) r.v[e] = a.v[e] / b.v[e];
    return r;
  }
#endif
};

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
