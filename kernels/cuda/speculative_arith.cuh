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
// only AdEMAMix ran faster for it (optim_step_kernels.cuh: kSpeculates).
//
// The ranges, inside those nvcc's own tests accept (tests/test_optim_cuda.cpp checks the results
// against the IEEE operations over every float of the square root's range and random pairs of the
// quotient's):
//   sqrt: x in [2^-101, FLT_MAX], nvcc's own test (bits 0x0D000000..0x7F7FFFFF).
//   div:  b in [2^-62, 2^62] (positive), and a = ±0 or |a| in [2^-62, 2^62]. The quotient is then
//         normal, and a - b q exact for q within an ulp of a / b, as the refinement needs.
// The quotient's last step is written as q0 - r1 (b q0 - a), the negation of nvcc's
// q0 + r1 (a - b q0): the same value for every a != 0 (rounding to nearest is symmetric), and the
// IEEE signed zero for a = ±0 (nvcc's form gives +0 for -0 / b, which is why its test sends zeros
// to the long routine).
// HIP: the exact operations (ok stays true).
#pragma once

#include <cstdint>

#include "../common/host_device.h"

namespace lowbit {
namespace kernels {
namespace gpu_step {

struct SpeculativeArith {
  bool ok = true;

#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
  __device__ __forceinline__ float sqrt(float x) {
    ok &= __float_as_uint(x) + 0xF3000000u <= 0x727FFFFFu;
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    const float y = __fmul_rn(x, r);
    const float half_r = __fmul_rn(r, 0.5f);
    const float e = __fmaf_rn(-y, y, x);
    return __fmaf_rn(e, half_r, y);
  }

  __device__ __forceinline__ float div(float a, float b) {
    const uint32_t abs_a = __float_as_uint(a) & 0x7FFFFFFFu;
    ok &= __float_as_uint(b) - 0x20800000u <= 0x3E000000u;
    ok &= abs_a - 0x20800000u <= 0x3E000000u || abs_a == 0u;
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(b));
    const float r1 = __fmaf_rn(r0, __fmaf_rn(-b, r0, 1.0f), r0);
    const float q0 = __fmul_rn(a, r1);
    return __fmaf_rn(-r1, __fmaf_rn(b, q0, -a), q0);
  }
#else
  __device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
  __device__ __forceinline__ float div(float a, float b) { return a / b; }
#endif
};

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
