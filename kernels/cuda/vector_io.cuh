// Loading and storing 8 consecutive elements per thread as wide (16-byte) accesses when aligned
// and in range, element by element at the ragged end of a tensor.
#pragma once

#include "../common/float_convert.h"
#include "portability.cuh"

namespace lowbit {
namespace kernels {

constexpr int kElemsPerThread = 8;

template <typename T>
__device__ __forceinline__ void load8(const T* p, int64_t i, int64_t n, bool vec, float (&v)[8]) {
  if (vec && i + 8 <= n) {
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

template <typename T>
__device__ __forceinline__ void store8(T* p, int64_t i, int64_t n, bool vec, const float (&v)[8]) {
  if (vec && i + 8 <= n) {
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

}  // namespace kernels
}  // namespace lowbit
