// Loads and stores of 8 consecutive elements per lane: parameters, gradients, master-weight
// corrections, state codes; a block's absmax across the lanes that own it; a whole aligned unit's
// raw bytes loaded together (UnitBytes).
#pragma once

#include <type_traits>

#include "../common/encode.h"
#include "../common/master_weight.h"
#include "../common/stochastic_round.h"
#include "step_args.cuh"
#include "vector_io.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

__device__ __forceinline__ void load_grad8(const void* g, ElemType t, int64_t i, int64_t n, bool vec, float (&v)[8]) {
  switch (t) {
    case ElemType::F32: load8(static_cast<const float*>(g), i, n, vec, v); return;
    case ElemType::BF16: load8(static_cast<const bf16_t*>(g), i, n, vec, v); return;
    case ElemType::F16: load8(static_cast<const f16_t*>(g), i, n, vec, v); return;
  }
}

// The parameter's new values, stored with the CPU kernel's conversions (bf16: nearest even or
// stochastic with the hash of (seed, offset + index)). FULL as in store8: no run-time test in the
// hot loop.
template <bool FULL, typename T>
__device__ __forceinline__ void store_param8(T* p, int64_t i, int64_t n, bool vec, const float (&v)[8], bool sr,
                                             uint64_t seed, int64_t offset) {
  if constexpr (sizeof(T) == 2 && std::is_same<T, bf16_t>::value) {
    if (sr) {
      uint16_t b[8];
      uint32_t most = 0;  // one test for the 8 (stochastic_round.h: kStochasticPlainBelow)
#pragma unroll
      for (int k = 0; k < 8; ++k) most = max(most, f32_bits(v[k]) & 0x7FFFFFFFu);
      if (most < kStochasticPlainBelow) {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          b[k] = static_cast<uint16_t>((f32_bits(v[k]) + sr_noise(seed, static_cast<uint64_t>(offset + i + k))) >> 16);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) b[k] = bf16_stochastic(v[k], seed, static_cast<uint64_t>(offset + i + k)).bits;
      }
      if (FULL || (vec && i + 8 <= n)) {
        store16(p + i, make_uint4(b[0] | (uint32_t(b[1]) << 16), b[2] | (uint32_t(b[3]) << 16),
                                  b[4] | (uint32_t(b[5]) << 16), b[6] | (uint32_t(b[7]) << 16)));
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k)
          if (i + k < n) p[i + k] = bf16_t{b[k]};
      }
      return;
    }
  }
  store8<FULL>(p, i, n, vec, v);
}

// The correction type of a correction width (master_weight.h).
template <int BITS>
using CorrectionType = typename std::conditional<BITS == 16, int16_t, int8_t>::type;

// Master weights (kernels/common/master_weight.h): p holds 8 bf16 parameters as fp32 (their bits
// shifted up); with a correction slot of BITS bits they become the master values.
template <int BITS, bool FULL>
__device__ __forceinline__ void add_corrections_of(const StepParamRef& P, int64_t i, int64_t n, bool vec,
                                                   float (&p)[8]) {
  int32_t c[8];
  load_corrections8<BITS, FULL>(P.correction, i, n, vec, c);
#pragma unroll
  for (int e = 0; e < 8; ++e)
    p[e] = master_from(static_cast<uint16_t>(f32_bits(p[e]) >> 16), static_cast<CorrectionType<BITS>>(c[e]));
}

template <bool FULL>
__device__ __forceinline__ void add_corrections(const StepParamRef& P, int bits, int64_t i, int64_t n, bool vec,
                                                float (&p)[8]) {
  if (bits == 16) add_corrections_of<16, FULL>(P, i, n, vec, p);
  else add_corrections_of<8, FULL>(P, i, n, vec, p);
}

// The 8 new master values split into bf16 parameters and BITS-bit corrections, stored; no_nan
// says none of the 8 is NaN (then the split needs no NaN test of its own).
template <int BITS, bool FULL>
__device__ __forceinline__ void store_corrected_of(const StepParamRef& P, int64_t i, int64_t n, bool vec,
                                                   const float (&p)[8], bool no_nan) {
  uint16_t b[8];
  CorrectionType<BITS> k[8];
  if (no_nan) {
#pragma unroll
    for (int e = 0; e < 8; ++e) master_split(f32_bits(p[e]), &b[e], &k[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) master_to(p[e], &b[e], &k[e]);
  }
  int32_t c[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) c[e] = k[e];
  store_master8<BITS, FULL>(static_cast<uint16_t*>(P.param), P.correction, i, n, vec, b, c);
}

template <bool FULL>
__device__ __forceinline__ void store_corrected(const StepParamRef& P, int bits, int64_t i, int64_t n, bool vec,
                                                const float (&p)[8]) {
  // One NaN test for the 8 (a max of the magnitudes' bits), not one per element.
  uint32_t most = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) most = max(most, f32_bits(p[e]) & 0x7FFFFFFFu);
  const bool no_nan = most <= 0x7F800000u;
  if (bits == 16) store_corrected_of<16, FULL>(P, i, n, vec, p, no_nan);
  else store_corrected_of<8, FULL>(P, i, n, vec, p, no_nan);
}

// A block's scan as bit patterns (encode.h: block_absmax_from_bits): the largest |x| bits and the
// largest raw bits (above 0x80000000 exactly when some value is negative).
struct BitScan {
  uint32_t max_abs = 0, max_raw = 0;
};

__device__ __forceinline__ void merge(BitScan& a, const BitScan& b) {
  a.max_abs = a.max_abs > b.max_abs ? a.max_abs : b.max_abs;
  a.max_raw = a.max_raw > b.max_raw ? a.max_raw : b.max_raw;
}

// Butterfly shuffles over `width` lanes, unrolled with a uniform test per level.
template <int WARP>
__device__ __forceinline__ uint32_t shuffle_max(uint32_t v, int width) {
#pragma unroll
  for (int off = 1; off < WARP; off *= 2) {
    if (off < width) {
      const uint32_t o = LOWBIT_SHFL_XOR(v, off, WARP);
      v = o > v ? o : v;
    }
  }
  return v;
}

// The maximum of v over `width` lanes (a power of two, aligned groups of the warp): shuffles, or
// REDUX (sm_80+: one instruction, the group's lanes as its mask). Which is faster depends on the
// family: REDUX for 8-bit codes, shuffles for 4-bit codes (bench/HISTORY.md: step kernel tuning).
template <int WARP, bool REDUX>
__device__ __forceinline__ uint32_t group_max(uint32_t v, int width, int lane) {
  (void)lane;  // REDUX's mask only
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIPCC__)
  if constexpr (REDUX) {
    const uint32_t mask = width >= 32 ? 0xffffffffu : ((1u << width) - 1u) << (lane & ~(width - 1));
    return __reduce_max_sync(mask, v);
  } else {
    return shuffle_max<WARP>(v, width);
  }
#else
  return shuffle_max<WARP>(v, width);
#endif
}

// The block's absmax over `width` lanes; the raw bits only where a negative value is possible and
// matters: not for a signed format (it takes negative values), nor where `no_negative` (the same
// for every lane of the group).
template <int WARP, bool REDUX>
__device__ __forceinline__ float group_absmax(const BitScan& s, int width, bool is_signed, bool no_negative,
                                              int lane) {
  const uint32_t max_abs = group_max<WARP, REDUX>(s.max_abs, width, lane);
  const uint32_t max_raw = is_signed || no_negative ? 0u : group_max<WARP, REDUX>(s.max_raw, width, lane);
  return block_absmax_from_bits(max_abs, max_raw > 0x80000000u ? 1u : 0u, is_signed);
}

// ---- a whole unit's loads, issued together ------------------------------------------------------

__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint2 load8b(const void* p) { return *reinterpret_cast<const uint2*>(p); }

// 8 floats from 16 bytes of 16-bit values (T: bf16_t or f16_t), or from 32 bytes of floats.
template <typename T>
__device__ __forceinline__ void convert8(const uint4* w, float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    const uint32_t x[8] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __uint_as_float(x[k]);
  } else {
    const uint32_t x[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[2 * k] = to_f32(T{static_cast<uint16_t>(x[k] & 0xFFFFu)});
      v[2 * k + 1] = to_f32(T{static_cast<uint16_t>(x[k] >> 16)});
    }
  }
}

// The raw bytes of a whole, aligned unit of 8 elements: parameter, gradient, master-weight
// correction, every used state slot and its block scale. The loads are made first and together,
// conditions only as predicates, so a warp has all of a unit's requests in flight at once: with a
// load in each branch (the gradient's dtype, the correction's width, each used slot) nvcc issued
// them one after another, each waiting for the one before (ncu: a stall of a memory latency at the
// first use of each), about five round trips per unit with bf16 parameters and a 24-bit master.
template <typename T, int FAMILY, int NS, int C = kAnyCompanions>
struct UnitBytes {
  using K = Known<T, C>;
  static constexpr int kSlotWords = FAMILY == kF32 ? 2 : 1;  // 16-byte words per slot
  uint4 p[sizeof(T) == 4 ? 2 : 1];
  uint4 g[2];      // fp32 gradients: both; 16-bit: g[0]
  uint4 corr;      // int16 corrections: all; int8: .x .y
  uint4 slot[NS][kSlotWords];  // F32: 32 bytes, BF16: 16, 8-bit codes: .x .y, 4-bit codes: .x
  float amax[NS];

  __device__ __forceinline__ void load(const StepParamRef& P, const Args& a, int64_t i) {
    const T* param = static_cast<const T*>(P.param) + i;
    p[0] = load16(param);
    if (sizeof(T) == 4) p[sizeof(T) == 4 ? 1 : 0] = load16(param + 4);
    const bool g32 = K::grad_type(P) == ElemType::F32;
    const char* grad = static_cast<const char*>(P.grad) + i * (g32 ? 4 : 2);
    g[0] = load16(grad);
    g[1] = g32 ? load16(grad + 16) : make_uint4(0, 0, 0, 0);
    corr = make_uint4(0, 0, 0, 0);
    if (sizeof(T) == 2) {
      if (K::correction_bits(a) == 16) corr = load16(static_cast<const int16_t*>(P.correction) + i);
      if (K::correction_bits(a) == 8) {
        const uint2 c = load8b(static_cast<const int8_t*>(P.correction) + i);
        corr.x = c.x;
        corr.y = c.y;
      }
    }
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      amax[k] = 0.0f;
#pragma unroll
      for (int w = 0; w < kSlotWords; ++w) slot[k][w] = make_uint4(0, 0, 0, 0);
      if (!(a.used_mask & (1 << k))) continue;
      if (FAMILY == kF32) {
        slot[k][0] = load16(static_cast<const float*>(P.slot[k]) + i);
        slot[k][kSlotWords - 1] = load16(static_cast<const float*>(P.slot[k]) + i + 4);
      } else if (FAMILY == kBF16) {
        slot[k][0] = load16(static_cast<const bf16_t*>(P.slot[k]) + i);
      } else {
        if (code_bits(FAMILY) == 8) {
          const uint2 c = load8b(static_cast<const uint8_t*>(P.slot[k]) + i);
          slot[k][0].x = c.x;
          slot[k][0].y = c.y;
        } else {
          slot[k][0].x = *reinterpret_cast<const uint32_t*>(static_cast<const uint8_t*>(P.slot[k]) + i / 2);
        }
        amax[k] = P.absmax[k][i >> a.block_shift];
      }
    }
  }

  // The parameter (with a correction slot: the master values) and the gradient as floats.
  __device__ __forceinline__ void param_grad(const Args& a, ElemType grad_type, float (&pv)[8], float (&gv)[8]) const {
    convert8<T>(p, pv);
    if constexpr (std::is_same<T, bf16_t>::value) {
      if (K::correction_bits(a) == 16) {
        const uint32_t w[4] = {corr.x, corr.y, corr.z, corr.w};
#pragma unroll
        for (int e = 0; e < 8; ++e)
          pv[e] = master_from16(static_cast<uint16_t>(f32_bits(pv[e]) >> 16),
                                static_cast<int16_t>((w[e / 2] >> (16 * (e % 2))) & 0xFFFFu));
      } else if (K::correction_bits(a) == 8) {
        const uint32_t w[2] = {corr.x, corr.y};
#pragma unroll
        for (int e = 0; e < 8; ++e)
          pv[e] = master_from8(static_cast<uint16_t>(f32_bits(pv[e]) >> 16),
                               static_cast<int8_t>((w[e / 4] >> (8 * (e % 4))) & 0xFFu));
      }
    }
    switch (grad_type) {
      case ElemType::F32: convert8<float>(g, gv); break;
      case ElemType::BF16: convert8<bf16_t>(g, gv); break;
      case ElemType::F16: convert8<f16_t>(g, gv); break;
    }
  }

  // The 8 codes of quantized slot k.
  __device__ __forceinline__ void codes(int k, uint8_t (&c)[8]) const {
    const uint32_t w0 = slot[k][0].x, w1 = slot[k][0].y;
#pragma unroll
    for (int e = 0; e < 8; ++e)
      c[e] = code_bits(FAMILY) == 8 ? static_cast<uint8_t>((e < 4 ? w0 : w1) >> (8 * (e % 4)))
                                    : static_cast<uint8_t>((w0 >> (4 * e)) & 0xFu);
  }
};

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
