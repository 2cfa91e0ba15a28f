// Loading and storing 8 consecutive elements (values, or 8-bit / 4-bit codes) per thread as wide
// accesses when aligned and in range, element by element at the ragged end of a tensor. FULL says
// at compile time that the access is aligned and in range (the hot loops' case): no bound checks.
#pragma once

#include <type_traits>

#include "../common/float_convert.h"
#include "portability.cuh"

namespace lowbit {
namespace kernels {

constexpr int kElemsPerThread = 8;

// One 16-byte store. nvcc split `*reinterpret_cast<float4*>(p) = ...` in the step kernels into
// four 4-byte stores (each a separate L1 wavefront per 32 lanes); the intrinsic keeps it one.
__device__ __forceinline__ void store16(void* dst, uint4 v) {
#if defined(__HIPCC__)
  *reinterpret_cast<uint4*>(dst) = v;
#else
  __stwb(reinterpret_cast<uint4*>(dst), v);
#endif
}

__device__ __forceinline__ uint4 pack_f32x4(float a, float b, float c, float d) {
  return make_uint4(__float_as_uint(a), __float_as_uint(b), __float_as_uint(c), __float_as_uint(d));
}

template <bool FULL = false, typename T>
__device__ __forceinline__ void load8(const T* p, int64_t i, int64_t n, bool vec, float (&v)[8]) {
  if (FULL || (vec && i + 8 <= n)) {
    if constexpr (sizeof(T) == 4) {
      const float4 a = reinterpret_cast<const float4*>(p + i)[0];
      const float4 b = reinterpret_cast<const float4*>(p + i)[1];
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
      v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
      const uint4 a = *reinterpret_cast<const uint4*>(p + i);
      const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[2 * k] = to_f32(T{static_cast<uint16_t>(w[k] & 0xFFFFu)});
        v[2 * k + 1] = to_f32(T{static_cast<uint16_t>(w[k] >> 16)});
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = i + k < n ? to_f32(p[i + k]) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  return static_cast<uint32_t>(from_f32<T>(a).bits) | (static_cast<uint32_t>(from_f32<T>(b).bits) << 16);
}

// 8 floats as bf16, rounded to nearest even, in 16 bytes. from_f32<bf16_t> takes 6-7 integer
// operations per value; sm_80+ rounds two floats into a bf16 pair in one instruction
// (cvt.rn.bf16x2.f32), the same bits for every value but NaN (subnormals kept, overflow to Inf),
// and NaN there is the hardware's pattern, not float_convert.h's 0x7FC0: so one test for the 8
// (a max of the magnitudes' bits) picks the instruction, or from_f32 where one of them is NaN.
// (H100, AdamW Q8 with bf16 parameters, step kernel alone: the bf16 stores were 7 of its 106
// instructions per element.)
__device__ __forceinline__ uint4 pack_bf16x8(const float (&v)[8]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIPCC__)
  uint32_t most = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) most = max(most, __float_as_uint(v[k]) & 0x7FFFFFFFu);
  if (most <= 0x7F800000u) {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w[k]) : "f"(v[2 * k + 1]), "f"(v[2 * k]));
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
#endif
  return make_uint4(pack2<bf16_t>(v[0], v[1]), pack2<bf16_t>(v[2], v[3]), pack2<bf16_t>(v[4], v[5]),
                    pack2<bf16_t>(v[6], v[7]));
}

template <bool FULL = false, typename T>
__device__ __forceinline__ void store8(T* p, int64_t i, int64_t n, bool vec, const float (&v)[8]) {
  if (FULL || (vec && i + 8 <= n)) {
    if constexpr (sizeof(T) == 4) {
      store16(p + i, pack_f32x4(v[0], v[1], v[2], v[3]));
      store16(p + i + 4, pack_f32x4(v[4], v[5], v[6], v[7]));
    } else if constexpr (std::is_same<T, bf16_t>::value) {
      store16(p + i, pack_bf16x8(v));
    } else {
      store16(p + i, make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7])));
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      if (i + k < n) p[i + k] = from_f32<T>(v[k]);
  }
}

// 8 codes at element i (8-bit: 8 bytes; 4-bit: 4 bytes, even element in the low nibble).
template <int BITS, bool FULL = false>
__device__ __forceinline__ void load_codes8(const uint8_t* codes, int64_t i, int64_t n, bool vec, uint8_t (&c)[8]) {
  if (BITS == 8) {
    if (FULL || (vec && i + 8 <= n)) {
      const uint2 w = *reinterpret_cast<const uint2*>(codes + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        c[k] = static_cast<uint8_t>(w.x >> (8 * k));
        c[4 + k] = static_cast<uint8_t>(w.y >> (8 * k));
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) c[k] = i + k < n ? codes[i + k] : 0;
    }
  } else {
    uint32_t w = 0;
    if (FULL || (vec && i + 8 <= n)) {
      w = *reinterpret_cast<const uint32_t*>(codes + i / 2);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (i + 2 * k < n) w |= static_cast<uint32_t>(codes[i / 2 + k]) << (8 * k);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) c[k] = static_cast<uint8_t>((w >> (4 * k)) & 0xF);
  }
}

template <int BITS, bool FULL = false>
__device__ __forceinline__ void store_codes8(uint8_t* codes, int64_t i, int64_t n, bool vec, const uint8_t (&c)[8]) {
  if (BITS == 8) {
    if (FULL || (vec && i + 8 <= n)) {
      uint2 w;
      w.x = c[0] | (c[1] << 8) | (c[2] << 16) | (uint32_t(c[3]) << 24);
      w.y = c[4] | (c[5] << 8) | (c[6] << 16) | (uint32_t(c[7]) << 24);
      *reinterpret_cast<uint2*>(codes + i) = w;
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        if (i + k < n) codes[i + k] = c[k];
    }
  } else {
    uint8_t b[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) b[k] = c[2 * k] | ((FULL || i + 2 * k + 1 < n ? c[2 * k + 1] : 0) << 4);
    if (FULL || (vec && i + 8 <= n)) {
      *reinterpret_cast<uint32_t*>(codes + i / 2) = b[0] | (b[1] << 8) | (b[2] << 16) | (uint32_t(b[3]) << 24);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (i + 2 * k < n) codes[i / 2 + k] = b[k];
    }
  }
}

// 8 master-weight corrections at element i (BITS 16: int16, 16 bytes; 8: int8, 8 bytes) as int32,
// 0 past the end.
template <int BITS, bool FULL = false>
__device__ __forceinline__ void load_corrections8(const void* corr, int64_t i, int64_t n, bool vec, int32_t (&c)[8]) {
  if (FULL || (vec && i + 8 <= n)) {
    if (BITS == 16) {
      const uint4 w = *reinterpret_cast<const uint4*>(static_cast<const int16_t*>(corr) + i);
      const uint32_t x[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        c[2 * k] = static_cast<int16_t>(x[k] & 0xFFFFu);
        c[2 * k + 1] = static_cast<int16_t>(x[k] >> 16);
      }
    } else {
      const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const int8_t*>(corr) + i);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        c[k] = static_cast<int8_t>((w.x >> (8 * k)) & 0xFFu);
        c[4 + k] = static_cast<int8_t>((w.y >> (8 * k)) & 0xFFu);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      c[k] = i + k < n ? (BITS == 16 ? static_cast<const int16_t*>(corr)[i + k] : static_cast<const int8_t*>(corr)[i + k]) : 0;
  }
}

// 8 bf16 bit patterns and their corrections stored at element i.
template <int BITS, bool FULL = false>
__device__ __forceinline__ void store_master8(uint16_t* param, void* corr, int64_t i, int64_t n, bool vec,
                                              const uint16_t (&b)[8], const int32_t (&c)[8]) {
  if (FULL || (vec && i + 8 <= n)) {
    store16(param + i, make_uint4(b[0] | (uint32_t(b[1]) << 16), b[2] | (uint32_t(b[3]) << 16),
                                  b[4] | (uint32_t(b[5]) << 16), b[6] | (uint32_t(b[7]) << 16)));
    if (BITS == 16) {
      uint32_t x[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) x[k] = (uint32_t(c[2 * k]) & 0xFFFFu) | (uint32_t(c[2 * k + 1]) << 16);
      store16(static_cast<int16_t*>(corr) + i, make_uint4(x[0], x[1], x[2], x[3]));
    } else {
      uint32_t lo = 0, hi = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        lo |= (uint32_t(c[k]) & 0xFFu) << (8 * k);
        hi |= (uint32_t(c[4 + k]) & 0xFFu) << (8 * k);
      }
      *reinterpret_cast<uint2*>(static_cast<int8_t*>(corr) + i) = make_uint2(lo, hi);
    }
  } else {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (i + k >= n) continue;
      param[i + k] = b[k];
      if (BITS == 16) static_cast<int16_t*>(corr)[i + k] = static_cast<int16_t>(c[k]);
      else static_cast<int8_t*>(corr)[i + k] = static_cast<int8_t>(c[k]);
    }
  }
}

}  // namespace kernels
}  // namespace lowbit
