// Loading and storing 8 consecutive elements (values, or 8-bit / 4-bit codes) per thread as wide
// accesses when aligned and in range, element by element at the ragged end of a tensor. FULL says
// at compile time that the access is aligned and in range (the hot loops' case): no bound checks.
#pragma once

#include "../common/float_convert.h"
#include "portability.cuh"

namespace lowbit {
namespace kernels {

constexpr int kElemsPerThread = 8;

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

template <bool FULL = false, typename T>
__device__ __forceinline__ void store8(T* p, int64_t i, int64_t n, bool vec, const float (&v)[8]) {
  if (FULL || (vec && i + 8 <= n)) {
    if constexpr (sizeof(T) == 4) {
      reinterpret_cast<float4*>(p + i)[0] = make_float4(v[0], v[1], v[2], v[3]);
      reinterpret_cast<float4*>(p + i)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      *reinterpret_cast<uint4*>(p + i) =
          make_uint4(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]), pack2<T>(v[4], v[5]), pack2<T>(v[6], v[7]));
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

}  // namespace kernels
}  // namespace lowbit
