// 16 floats as one GCC/Clang vector, and the element-wise helpers of the rules (optim_rules.h) for
// it: the AVX-512 loops run the rules' own source 16 lanes at a time. Include it before
// optim_rules.h: a vector type has no namespace for argument lookup to search, so the rules' calls
// find these overloads only where they are declared first (otherwise the build fails: no silent
// fallback).
#pragma once

#if !defined(__AVX512F__)
#error "kernels/cpu/x86 headers are for the files compiled with the AVX-512 flags (CMakeLists.txt)"
#endif

namespace lowbit {
namespace kernels {
// Internal linkage: a copy that is not inlined stays in the AVX-512 object that made it.
namespace {

typedef float f32x16 __attribute__((vector_size(64)));

// Inlined into the loops, each of these is one or two instructions.
#define LOWBIT_VEC_INLINE inline __attribute__((always_inline))
LOWBIT_VEC_INLINE f32x16 vsqrt(f32x16 x) {
  f32x16 r;
  for (int i = 0; i < 16; ++i) r[i] = __builtin_sqrtf(x[i]);
  return r;
}
LOWBIT_VEC_INLINE f32x16 vmax(f32x16 a, f32x16 b) { return a > b ? a : b; }
LOWBIT_VEC_INLINE f32x16 sign_of(f32x16 x) {
  const f32x16 one = f32x16{} + 1.0f, zero = f32x16{};
  return x > zero ? one : (x < zero ? -one : zero);
}
#undef LOWBIT_VEC_INLINE

}  // namespace
}  // namespace kernels
}  // namespace lowbit
