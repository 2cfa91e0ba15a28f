// The step kernels' shared-memory copy of a launch's formats (gpu_tables.cuh), and the encode and
// block normalizer that read it.
#pragma once

#include "../common/encode.h"
#include "speculative_arith.cuh"
#include "step_args.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

// Shared memory holds a DeviceFormat (gpu_tables.cuh), copied from the device's.
using SharedFormat = DeviceFormat;

__device__ __forceinline__ void stage_format(SharedFormat& sh, const DeviceFormat* d) {
  stage(reinterpret_cast<uint4*>(&sh), reinterpret_cast<const uint4*>(d), static_cast<int>(sizeof(DeviceFormat) / 16));
}

// Every distinct format of the launch, then a barrier.
__device__ __forceinline__ void stage_formats(SharedFormat* sh, const Args& a) {
  for (int d = 0; d < a.num_distinct; ++d) stage_format(sh[d], a.distinct[d]);
  __syncthreads();
}

// The code of x: its window bucket's start j (encode.h: window_bucket), then one compare with
// threshold j, whose pair entry holds the codes below and above it (gpu_tables.cuh). t < x exactly
// when t - x has its sign bit set: t - x is 0 only for t == x (subnormals are kept), no threshold
// is -0 (gpu_tables.cuh stores +0), and a NaN x gives the canonical NaN (sign 0), like a false
// compare. A subtract and a shift, where a compare and a select cost more.
__device__ __forceinline__ uint8_t encode_value(const SharedFormat& sh, float x) {
  const uint2 e = sh.pairs[sh.starts[window_bucket(__float_as_uint(x))]];
  const uint32_t above = __float_as_uint(__uint_as_float(e.x) - x) >> 31;
  return static_cast<uint8_t>(e.y >> (8 * above));
}

// encode_value for the blocks of every valid absmax (a number >= 0): their normalized values are
// finite and at most about 1 in magnitude, so none lies past the window's top, and a max with the
// window's bottom value (2^-62, key kWindowLowKey) gives the smaller magnitudes bucket 0 of their
// sign: 4 integer operations for the bucket where encode_value takes 7. The code is byte `above`
// of the pair's word (one byte permute for encode_value's shift of 8 * above). The same codes as
// encode_value for every such x.
__device__ __forceinline__ uint8_t encode_valid(const SharedFormat& sh, float x) {
  const uint32_t key = __float_as_uint(fmaxf(fabsf(x), __uint_as_float(kWindowLowKey << 16))) >> 16;
  const uint32_t sign = static_cast<uint32_t>(static_cast<int32_t>(__float_as_uint(x)) >> 31);
  const uint2 e = sh.pairs[sh.starts[(kWindowTop + 1u) + ((key - kWindowLowKey) ^ sign)]];
  return static_cast<uint8_t>(__byte_perm(e.y, 0u, __float_as_uint(__uint_as_float(e.x) - x) >> 31));
}

// make_normalizer (encode.h) without its branches, the same values: a valid absmax is finite, so
// absmax * pre lies in [2^-85, 2^64], where short_rcp is 1.0f / x (speculative_arith.cuh); NaN,
// negative and zero absmax take make_normalizer's {1, 0} by selects. nvcc's branches for the absmax
// test and for its reciprocal's long routine, with their reconvergence points, were about half of
// the instructions per slot and block. Which kernels take it: step_tuning.cuh.
__device__ __forceinline__ Normalizer step_normalizer(float amax) {
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__)
  const float pre = amax < 0x1p-64f ? 0x1p64f : (amax > 0x1p64f ? 0x1p-64f : 1.0f);
  const float inv = short_rcp(amax * pre);
  const bool positive = amax > 0.0f;
  return {positive ? pre : 1.0f, positive ? inv : 0.0f};
#else
  return make_normalizer(amax);
#endif
}
}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
