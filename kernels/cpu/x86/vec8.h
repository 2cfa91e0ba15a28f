// 8 floats as one GCC/Clang vector, and the element-wise helpers of the rules (optim_rules.h) for
// it: the AVX2 loops run the rules' own source 8 lanes at a time. Include it before optim_rules.h
// (vec16.h says why).
#pragma once

#if !defined(__AVX2__) || !defined(__F16C__)
#error "kernels/cpu/x86 AVX2 headers are for the files compiled with the AVX2 flags (CMakeLists.txt)"
#endif

#include <immintrin.h>

namespace lowbit {
namespace kernels {
// Internal linkage: a copy that is not inlined stays in the AVX2 object that made it.
namespace {

typedef float f32x8 __attribute__((vector_size(32)));

#define LOWBIT_VEC_INLINE inline __attribute__((always_inline))
// vsqrtps is correctly rounded, as sqrtf is.
LOWBIT_VEC_INLINE f32x8 vsqrt(f32x8 x) { return (f32x8)_mm256_sqrt_ps((__m256)x); }
// maxps(a, b) is a > b ? a : b, NaN and signed zeros included.
LOWBIT_VEC_INLINE f32x8 vmax(f32x8 a, f32x8 b) { return (f32x8)_mm256_max_ps((__m256)a, (__m256)b); }
LOWBIT_VEC_INLINE f32x8 sign_of(f32x8 x) {
  const f32x8 one = f32x8{} + 1.0f, zero = f32x8{};
  return x > zero ? one : (x < zero ? -one : zero);
}
#undef LOWBIT_VEC_INLINE

}  // namespace
}  // namespace kernels
}  // namespace lowbit
