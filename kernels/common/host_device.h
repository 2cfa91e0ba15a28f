// Portability macros for code shared by host compilers, nvcc and hipcc.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>  // defines __host__, __device__, __forceinline__ for hipcc
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define LOWBIT_HD __host__ __device__ __forceinline__
#else
#define LOWBIT_HD inline
#endif

// LOWBIT_HD, and inlined by host compilers too (where `inline` alone is a hint): for the
// per-element rules (optim_rules.h), which every loop must compile for its own target (scalar, 16
// AVX-512 lanes, a GPU), leaving no out-of-line copy that loops of another target could end up
// calling.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define LOWBIT_RULE LOWBIT_HD
#else
#define LOWBIT_RULE inline __attribute__((always_inline))
#endif

// Unrolls a loop with a compile-time trip count on every compiler.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define LOWBIT_UNROLL _Pragma("unroll")
#else
#define LOWBIT_UNROLL _Pragma("GCC unroll 16")
#endif
