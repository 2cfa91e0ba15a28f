// The fused optimizer step on GPUs: kernels and their per-rule launch (optim_step_cuda.h is the API;
// optim_step_cuda.cu drives a step; optim_step_<rule>.cu instantiate one rule each, so no file
// compiles for long). CUDA, and HIP through portability.cuh.
//
// Multi-tensor apply: the parameters of a launch travel by value as kernel parameters (a chunk of
// up to kChunk descriptors; a CUDA graph captures them with the launch), each cut into units, and
// each warp takes one contiguous run of the launch's units. The step's per-parameter values
// (kernels/common/step_config.h: Hyper, the rounding seed, the gradient multiplier) are derived by
// a prologue kernel from the counters and lr on the device, into scratch memory.
//
// One pass per quantization block: a block of B elements is owned by B/8 lanes, 8 consecutive
// elements each: decode with the old absmax, update with the rule of optim_rules.h, the block's new
// absmax by shuffles within the group (no atomics, no second kernel), encode, store. Blocks larger
// than 8 lanes' worth of a warp are owned by the whole warp, in two passes (the second recomputes
// the update: bit for bit the same). Dense (FP32 / BF16) state has no blocks. The arithmetic is the
// CPU kernel's, operation for operation (no contraction: --fmad=false; IEEE division and sqrt, or
// the short sequences of speculative_arith.cuh where they give the same bits), so the bits are the
// CPU's.
#pragma once

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "../common/encode.h"
#include "../common/master_weight.h"
#include "../common/optim_rules.h"
#include "../common/stochastic_round.h"
#include "gpu_tables.cuh"
#include "optim_step_cuda.h"
#include "speculative_arith.cuh"
#include "vector_io.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

constexpr int kThreads = 256;
constexpr int kChunk = kDescriptorsPerLaunch;

// How a launch's state is stored: every used slot the same way. kCodes8 / kCodes4: 8-bit and 4-bit
// codes, encoded and decoded through shared-memory tables. The companded formats (compand.h) are
// 8-bit codes too: their tables give the bits of their arithmetic (code_tables.h), and ran faster
// than it (bench/step_kernel_probe, H100, 1.07B parameters, kernels alone, arithmetic -> tables:
// AdEMAMix C8 10.36 -> 8.70 ms, AdamW C8 6.82 -> 6.61, with bf16 + 24-bit master 7.00 -> 5.53).
enum Family : int { kF32 = 0, kBF16 = 1, kCodes8 = 2, kCodes4 = 3 };

// Quantized state; every quantized family is table-coded (its formats staged in shared memory).
LOWBIT_HD constexpr bool is_quant_family(int f) { return f == kCodes8 || f == kCodes4; }
LOWBIT_HD constexpr int code_bits(int f) { return f == kCodes4 ? 4 : 8; }

// Which kernels divide and take square roots by SpeculativeArith (speculative_arith.cuh) rather
// than the IEEE operations alone. Measured with bench/step_kernel_probe (H100, 1.07B parameters,
// kernel alone, AdamW unless named; exact -> speculative): AdEMAMix Q8 7.99 -> 7.76 ms; but AdamW Q8
// 6.59 -> 6.71, Q4 6.16 -> 6.33, Q8 with bf16 parameters 5.72 -> 5.99, LAMB Q8 13.12 -> 13.48
// (its extra instructions and registers cost more than nvcc's branches there). AdEMAMix with
// quantized state then ran faster still with BatchArith (kBatches: speculative -> batched, two
// rounds, session 20): Q4 6.82 -> 6.66 ms, C8 8.52 -> 8.38, Q8 7.69 -> 7.58, FP8 6.64 -> 6.54. So
// AdEMAMix with dense state only; -DLOWBIT_STEP_SPECULATE=0 or 1 sets every kernel (and LAMB's
// first pass) for an A/B build.
#ifdef LOWBIT_STEP_SPECULATE
template <Rule R, int FAMILY>
constexpr bool kSpeculates = LOWBIT_STEP_SPECULATE != 0;
constexpr bool kLambSumsSpeculate = LOWBIT_STEP_SPECULATE != 0;
#else
template <Rule R, int FAMILY>
constexpr bool kSpeculates = R == Rule::AdEMAMix && !is_quant_family(FAMILY);
constexpr bool kLambSumsSpeculate = false;
#endif

// Slots a rule's update reads and writes with every option on.
template <Rule R>
struct RuleMaxSlots {
  static constexpr int value = (R == Rule::SGD || R == Rule::Lion || R == Rule::Adagrad) ? 1 : (R == Rule::LAMB ? 2 : 3);
};

// Slots a launch's kernel carries in registers: the highest used slot + 1, rounded up to one
// compiled variant. Adam without amsgrad and RMSprop with only its square average carry fewer
// (eight registers per slot a lane does not spend).
template <Rule R>
constexpr bool rule_has_variant(int ns) {
  return ns == RuleMaxSlots<R>::value || ((R == Rule::Adam || R == Rule::AdamW) && ns == 2) ||
         (R == Rule::RMSprop && ns == 1);
}
inline int carried_slots(Rule r, int used_mask) {
  const int highest = used_mask >= 4 ? 3 : (used_mask >= 2 ? 2 : 1);
  switch (r) {
    case Rule::Adam:
    case Rule::AdamW: return highest <= 2 ? 2 : 3;
    case Rule::RMSprop: return highest == 1 ? 1 : 3;
    case Rule::LAMB: return 2;
    case Rule::AdEMAMix: return 3;
    default: return 1;
  }
}

// The per-step values of one parameter, written by the prologue.
struct ParamScalars {
  Hyper hyper;
  uint64_t seed;
  float grad_mult;
  int32_t pad;
};

struct Chunk {
  GpuStepParam p[kChunk];
  int64_t first_unit[kChunk + 1];   // units of the step kernel, prefix over the chunk
  int64_t first_block[kChunk + 1];  // LAMB norm blocks, prefix over the chunk
  int64_t first_param;              // index of p[0] in the whole launch group (scratch)
  int count;
};

struct Args {
  StepConfig config;
  int64_t block_size;
  int block_shift;                    // log2(block_size) for quantized state
  int64_t unit;                       // elements per unit
  int used_mask;                      // bit k: slot k is stored
  int slot_signed_mask;               // bit k: slot k's format is signed
  int nonneg_mask;                    // bit k: state_slots.h's nonneg_update_slots
  int format_of_slot[kMomentSlots];   // 0 or 1: which staged table a slot uses
  const DeviceFormat* distinct[2];    // at most two formats per state layout
  int num_distinct;
  const float* found_inf;
  ParamScalars* scalars;              // scratch: one per parameter of the group
  double* block_sums;                 // scratch: LAMB
  bool stochastic_round;
  int correction_bits;                // 16 / 8: bf16 parameters carry a master-weight correction; 0: none
};

// What a step kernel fixes at compile time about its parameters' companions: the gradient's
// dtype, the master-weight correction's width, stochastic rounding. kAnyCompanions reads all three
// at run time (every case, one kernel). The others are bf16 parameters with bf16 gradients, each
// with one way to store the new value, so the kernel carries that one path: with every path in one
// kernel nvcc spilled the bf16 kernels' registers (AdamW Q8: 64 bytes stored, 136 loaded), and the
// fixed kernels ran faster (bench/step_kernel_probe, H100, AdamW Q8, 1.07B parameters, kernel
// alone: stochastic rounding 5.72 -> 5.19 ms, 24-bit master 5.83 -> 5.32).
enum Companions : int { kAnyCompanions = 0, kNearest = 1, kStochastic = 2, kMaster24 = 3, kMaster32 = 4 };

// The (parameter dtype, family) pairs compiled with fixed companions besides kAnyCompanions: bf16
// parameters with quantized state, whose kernels are bound by instruction issue (dense state is
// bound by memory, and fp32 parameters have one way to be stored).
template <typename T>
LOWBIT_HD constexpr bool has_fixed_companions(int family) {
  return std::is_same<T, bf16_t>::value && is_quant_family(family);
}

// A kernel's companions as values: constants where C fixes them.
template <typename T, int C>
struct Known {
  static_assert(C == kAnyCompanions || std::is_same<T, bf16_t>::value, "fixed companions are for bf16 parameters");
  static __device__ __forceinline__ ElemType grad_type(const GpuStepParam& P) {
    return C == kAnyCompanions ? P.grad_type : ElemType::BF16;
  }
  static __device__ __forceinline__ int correction_bits(const Args& a) {
    return C == kAnyCompanions ? a.correction_bits : (C == kMaster24 ? 8 : (C == kMaster32 ? 16 : 0));
  }
  static __device__ __forceinline__ bool stochastic(const Args& a) {
    return C == kAnyCompanions ? a.stochastic_round : C == kStochastic;
  }
};

// Whether a kernel's rule takes a lane's 8 elements together, as one f32x8 with BatchArith
// (speculative_arith.cuh), rather than one float at a time with nvcc's division and square root.
// Measured with bench/step_kernel_probe (H100, AdamW, 1.07B parameters, kernel alone, one at a
// time -> together): faster for the kernels with fixed companions and table-coded state (Q8 with
// bf16 parameters and stochastic rounding 5.18 -> 5.11 ms, with a 24-bit master 5.28 -> 5.16, Q4
// with a 24-bit master 5.39 -> 5.23); slower where the kernel holds more (kAnyCompanions: fp32
// parameters with Q8 state 6.44 -> 6.86, Q4 6.03 -> 6.38, their registers spilled). So those only
// (Q8 with bf16 parameters rounded to nearest, without: 4.86 -> 4.93 ms, session 19), and AdEMAMix
// with quantized state for every parameter dtype (see kSpeculates); -DLOWBIT_STEP_BATCH=0 or 1 sets
// every kernel for an A/B build (the speculating kernels aside).
#ifdef LOWBIT_STEP_BATCH
template <Rule R, int FAMILY, int C>
constexpr bool kBatches = LOWBIT_STEP_BATCH != 0 && !kSpeculates<R, FAMILY>;
#else
template <Rule R, int FAMILY, int C>
constexpr bool kBatches = !kSpeculates<R, FAMILY> && is_quant_family(FAMILY) &&
                          (C != kAnyCompanions || R == Rule::AdEMAMix);
#endif

// ---- shared-memory tables -------------------------------------------------------------------------

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
// negative and zero absmax take make_normalizer's {1, 0} by selects. (nvcc's branches for the
// absmax test and for its reciprocal's long routine, with their reconvergence points, were 10 of
// the 21 instructions per slot and block; H100, AdamW Q8 with bf16 parameters.)
#ifndef LOWBIT_STEP_SHORT_NORMALIZER  // 0: make_normalizer's branches, for an A/B build
#define LOWBIT_STEP_SHORT_NORMALIZER 1
#endif
__device__ __forceinline__ Normalizer step_normalizer(float amax) {
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__) && LOWBIT_STEP_SHORT_NORMALIZER
  const float pre = amax < 0x1p-64f ? 0x1p64f : (amax > 0x1p64f ? 0x1p-64f : 1.0f);
  const float inv = short_rcp(amax * pre);
  const bool positive = amax > 0.0f;
  return {positive ? pre : 1.0f, positive ? inv : 0.0f};
#else
  return make_normalizer(amax);
#endif
}

// The kernels that take step_normalizer rather than make_normalizer (bench_optim_step_gpu, H100,
// 1.07B parameters, full step with the check, make_normalizer -> step_normalizer): bf16 parameters
// rounded to nearest 5.37 -> 5.28 ms, with a 24-bit master 5.88 -> 5.79, fp32 parameters with Q8
// 7.86 -> 7.81, AdEMAMix C8 10.12 -> 10.06, LAMB Q4 12.36 -> 12.27; but stochastic rounding
// 5.83 -> 6.03 and 32-bit masters 6.51 -> 6.63 (their register allocations spilled more).
template <int C>
constexpr bool kShortNormalizer = C != kStochastic && C != kMaster32;

// ---- element access -----------------------------------------------------------------------------

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
__device__ __forceinline__ void add_corrections_of(const GpuStepParam& P, int64_t i, int64_t n, bool vec,
                                                   float (&p)[8]) {
  int32_t c[8];
  load_corrections8<BITS, FULL>(P.correction, i, n, vec, c);
#pragma unroll
  for (int e = 0; e < 8; ++e)
    p[e] = master_from(static_cast<uint16_t>(f32_bits(p[e]) >> 16), static_cast<CorrectionType<BITS>>(c[e]));
}

template <bool FULL>
__device__ __forceinline__ void add_corrections(const GpuStepParam& P, int bits, int64_t i, int64_t n, bool vec,
                                                float (&p)[8]) {
  if (bits == 16) add_corrections_of<16, FULL>(P, i, n, vec, p);
  else add_corrections_of<8, FULL>(P, i, n, vec, p);
}

// The 8 new master values split into bf16 parameters and BITS-bit corrections, stored; no_nan
// says none of the 8 is NaN (then the split needs no NaN test of its own).
template <int BITS, bool FULL>
__device__ __forceinline__ void store_corrected_of(const GpuStepParam& P, int64_t i, int64_t n, bool vec,
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
__device__ __forceinline__ void store_corrected(const GpuStepParam& P, int bits, int64_t i, int64_t n, bool vec,
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

// The maximum of v over `width` lanes (a power of two, aligned groups of the warp): butterfly
// shuffles, unrolled with a uniform test per level, or with REDUX (sm_80+: one instruction, the
// group's lanes as its mask). Which is faster depends on the family (bench/step_kernel_probe,
// H100, AdamW): REDUX for table-coded 8-bit state (Q8 7.51 against 7.89 ms; with bf16 parameters
// and a 24-bit master 8.37 against 8.87), shuffles for 4-bit codes (Q4 8.39 against 8.51).
template <int WARP, bool REDUX>
__device__ __forceinline__ uint32_t group_max(uint32_t v, int width, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(__HIPCC__)
  if (REDUX) {
    const uint32_t mask = width >= 32 ? 0xffffffffu : ((1u << width) - 1u) << (lane & ~(width - 1));
    return __reduce_max_sync(mask, v);
  }
#endif
#pragma unroll
  for (int off = 1; off < WARP; off *= 2) {
    if (off < width) {
      const uint32_t o = LOWBIT_SHFL_XOR(v, off, WARP);
      v = o > v ? o : v;
    }
  }
  return v;
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

  __device__ __forceinline__ void load(const GpuStepParam& P, const Args& a, int64_t i) {
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

// ---- the per-lane work ------------------------------------------------------------------------------

// 8 elements starting at element i of parameter P: load, decode, update in registers. NS slots
// are carried (the highest used slot + 1); FULL: the 8 elements are in range and aligned.
template <Rule R, typename T, int FAMILY, int NS, int C>
struct Lane {
  using K = Known<T, C>;
  // Elements past the parameter's end load as 0 (p, g and state) and update to 0: they change no
  // block's absmax and are never stored, so every loop runs all 8 without a bound.
  float p[8], s[NS][8];
  // Bit k: slot k's new values cannot be negative (Args::nonneg_mask, and the block's old absmax
  // is valid, so its decoded values are >= 0): its block needs no search for negative values.
  // Set from the old absmax every lane of a block reads, so it is the same across the block.
  uint32_t no_negative = 0;

  // Slot k's block, whose old scale is `old_amax`, needs no search when the rule cannot make its
  // values negative and the old scale is valid (not flagged negative).
  __device__ __forceinline__ void note_no_negative(const Args& a, int k, float old_amax) {
    if (((a.nonneg_mask >> k) & 1) && old_amax >= 0.0f) no_negative |= 1u << k;
  }

  template <bool FULL>
  __device__ __forceinline__ void load_update(const GpuStepParam& P, const Args& a, const Hyper& h, float grad_mult,
                                              const SharedFormat* sh, int64_t i, bool vec) {
    float g[8];
    load<FULL>(P, a, sh, i, vec, g);
    if constexpr (kSpeculates<R, FAMILY>) {
      SpeculativeArith ar;
      update(h, grad_mult, g, ar);
      if (ar.ok) return;
      // An operand outside the short sequences' range (speculative_arith.cuh): load again (the
      // update replaced p and s; the barrier keeps nvcc from holding the loaded bytes in
      // registers through the update instead) and redo the 8 elements with the IEEE operations.
      asm volatile("" ::: "memory");
      load<FULL>(P, a, sh, i, vec, g);
    }
    if constexpr (kBatches<R, FAMILY, C>) update_batch(h, grad_mult, g);
    else update(h, grad_mult, g, ExactArith{});
  }

  template <bool FULL>
  __device__ __forceinline__ void load(const GpuStepParam& P, const Args& a, const SharedFormat* sh, int64_t i,
                                       bool vec, float (&g)[8]) {
    if constexpr (FULL) {
      load_full(P, a, sh, i, g);
    } else {
      const int64_t n = P.numel;
      load8(static_cast<const T*>(P.param), i, n, vec, p);
      if constexpr (std::is_same<T, bf16_t>::value) {
        if (K::correction_bits(a) != 0) add_corrections<false>(P, K::correction_bits(a), i, n, vec, p);
      }
      load_grad8(P.grad, K::grad_type(P), i, n, vec, g);
      load_slots(P, a, sh, i, vec);
    }
  }

  // A whole, aligned unit: the raw bytes first (UnitBytes), then converted and decoded.
  __device__ __forceinline__ void load_full(const GpuStepParam& P, const Args& a, const SharedFormat* sh, int64_t i,
                                            float (&g)[8]) {
    UnitBytes<T, FAMILY, NS, C> b;
    b.load(P, a, i);
    b.param_grad(a, K::grad_type(P), p, g);
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      if (FAMILY == kF32) {
        convert8<float>(b.slot[k], s[k]);
      } else if (FAMILY == kBF16) {
        convert8<bf16_t>(b.slot[k], s[k]);
      } else {
        uint8_t c[8];
        b.codes(k, c);
        decode8(sh, a, k, c, b.amax[k], s[k]);
        note_no_negative(a, k, b.amax[k]);
      }
      // An unused slot loaded nothing (its values, whatever they decode to, are neither read by
      // the rule nor stored).
    }
  }

  // 8 values of slot k from their codes and the block's scale.
  __device__ __forceinline__ void decode8(const SharedFormat* sh, const Args& a, int k, const uint8_t (&c)[8],
                                          float amax, float (&out)[8]) const {
    const float* cb = sh[a.format_of_slot[k]].codebook;
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = decode_value(cb, c[e], amax);
  }

  // The bounded path's state: element by element past the end (0 there, and for unused slots).
  __device__ __forceinline__ void load_slots(const GpuStepParam& P, const Args& a, const SharedFormat* sh, int64_t i,
                                             bool vec) {
    const int64_t n = P.numel;
#pragma unroll
    for (int k = 0; k < NS; ++k) {
#pragma unroll
      for (int e = 0; e < 8; ++e) s[k][e] = 0.0f;
      if (!(a.used_mask & (1 << k))) continue;
      if (FAMILY == kF32) {
        load8(static_cast<const float*>(P.slot[k]), i, n, vec, s[k]);
      } else if (FAMILY == kBF16) {
        load8(static_cast<const bf16_t*>(P.slot[k]), i, n, vec, s[k]);
      } else {
        // The old scale, read by every lane of a block that exists (lanes past the end too), so
        // that no_negative is the same across the block's lanes.
        const int64_t block = i >> a.block_shift;
        const float old = (block << a.block_shift) < n ? P.absmax[k][block] : 0.0f;
        note_no_negative(a, k, old);
        if (i >= n) continue;
        uint8_t c[8];
        load_codes8<code_bits(FAMILY), false>(static_cast<const uint8_t*>(P.slot[k]), i, n, vec, c);
        decode8(sh, a, k, c, old, s[k]);
#pragma unroll
        for (int e = 0; e < 8; ++e)
          if (i + e >= n) s[k][e] = 0.0f;  // code 0 is not 0
      }
    }
  }

  // The rule on the 8 elements, in registers, with division and square root by `ar`.
  template <typename Ar>
  __device__ __forceinline__ void update(const Hyper& h, float grad_mult, const float (&g)[8], Ar&& ar) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      // The clipping / unscaling factor, with maximize's sign flip folded in by the prologue
      // (g * -m == -(g * m) exactly; g * 1 == g): one multiply, no branch.
      const float ge = g[e] * grad_mult;
      float st[RuleMaxSlots<R>::value];
#pragma unroll
      for (int k = 0; k < RuleMaxSlots<R>::value; ++k) st[k] = k < NS ? s[k < NS ? k : 0][e] : 0.0f;
      float pe = p[e];
      apply_rule<R, float, (NS >= 3)>(h, ge, pe, st, ar);  // Adam's amsgrad test only where slot 2 is carried
      p[e] = pe;
#pragma unroll
      for (int k = 0; k < NS; ++k) s[k][e] = st[k];
    }
  }

  // The same update on the 8 elements as one f32x8 value (kBatches).
  __device__ __forceinline__ void update_batch(const Hyper& h, float grad_mult, const float (&g)[8]) {
    constexpr int kSlots = RuleMaxSlots<R>::value;
    f32x8 ge, pe, st[kSlots];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      ge.v[e] = g[e] * grad_mult;  // as in update
      pe.v[e] = p[e];
#pragma unroll
      for (int k = 0; k < kSlots; ++k) st[k].v[e] = k < NS ? s[k < NS ? k : 0][e] : 0.0f;
    }
    apply_rule<R, f32x8, (NS >= 3)>(h, ge, pe, st, BatchArith{});
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      p[e] = pe.v[e];
#pragma unroll
      for (int k = 0; k < NS; ++k) s[k][e] = st[k].v[e];
    }
  }

  __device__ __forceinline__ BitScan scan(int k) const {
    BitScan sc;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const uint32_t u = __float_as_uint(s[k][e]);
      const uint32_t a = u & 0x7FFFFFFFu;
      sc.max_abs = a > sc.max_abs ? a : sc.max_abs;
      sc.max_raw = u > sc.max_raw ? u : sc.max_raw;
    }
    return sc;
  }

  // Dense slots and the parameter.
  template <bool FULL>
  __device__ __forceinline__ void store_dense(const GpuStepParam& P, const Args& a, uint64_t seed, int64_t i,
                                              bool vec) const {
    const int64_t n = P.numel;
    if (FAMILY == kF32 || FAMILY == kBF16) {
#pragma unroll
      for (int k = 0; k < NS; ++k) {
        if (!(a.used_mask & (1 << k))) continue;
        if (FAMILY == kF32) store8<FULL>(static_cast<float*>(P.slot[k]), i, n, vec, s[k]);
        else store8<FULL>(static_cast<bf16_t*>(P.slot[k]), i, n, vec, s[k]);
      }
    }
    if constexpr (std::is_same<T, bf16_t>::value) {
      if (K::correction_bits(a) != 0) {
        store_corrected<FULL>(P, K::correction_bits(a), i, n, FULL || vec, p);
        return;
      }
    }
    store_param8<FULL>(static_cast<T*>(P.param), i, n, vec, p, K::stochastic(a), seed, P.offset);
  }

  template <bool FULL>
  __device__ __forceinline__ void encode_slot(const GpuStepParam& P, const Args& a, const SharedFormat* sh, int k,
                                              float amax, int64_t i, bool vec) const {
    const Normalizer nz = kShortNormalizer<C> ? step_normalizer(amax) : make_normalizer(amax);
    uint8_t c[8];
    // pre == 1 (absmax within 2^-64..2^64: every block in practice): (x * 1) * inv is x * inv, one
    // multiply. The test is the same for the lanes of a block, so the branch rarely diverges.
    const bool one_multiply = nz.pre == 1.0f;
    const SharedFormat& f = sh[a.format_of_slot[k]];
    if (!(amax >= 0.0f)) {
      // A block flagged NaN or negative (encode.h: block_absmax): encode_value's clamps.
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = encode_value(f, normalize(nz, s[k][e]));
    } else if (one_multiply) {
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = encode_valid(f, s[k][e] * nz.inv);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) c[e] = encode_valid(f, normalize(nz, s[k][e]));
    }
    store_codes8<code_bits(FAMILY), FULL>(static_cast<uint8_t*>(P.slot[k]), i, P.numel, vec, c);
  }
};

// The parameter of unit u: the last j with first_unit[j] <= u (j only moves forward in a warp's run).
__device__ __forceinline__ int advance_param(const Chunk& c, int j, int64_t u) {
  while (j + 1 < c.count && c.first_unit[j + 1] <= u) ++j;
  return j;
}

// One unit of small blocks (B <= 8 lanes' worth of a warp): each group of B/8 lanes owns a block.
template <Rule R, typename T, int FAMILY, int NS, int WARP, int C, bool FULL>
__device__ __forceinline__ void small_block_unit(const GpuStepParam& P, const Args& a, const Hyper& h, float grad_mult,
                                                 uint64_t seed, const SharedFormat* sh, int64_t i, bool vec,
                                                 int lane, int group) {
  constexpr bool kQuant = is_quant_family(FAMILY);
  Lane<R, T, FAMILY, NS, C> L;
  L.template load_update<FULL>(P, a, h, grad_mult, sh, i, vec);
  // The parameter (and dense state) first: its registers are free during the reductions and the
  // encode, where the kernel's register pressure peaks.
  L.template store_dense<FULL>(P, a, seed, i, vec);
  if (kQuant) {
    bool bad = false;
    const bool leader = (lane & (group - 1)) == 0;
#pragma unroll
    for (int k = 0; k < NS; ++k) {
      if (!(a.used_mask & (1 << k))) continue;
      const float amax = group_absmax<WARP, FAMILY == kCodes8>(L.scan(k), group, (a.slot_signed_mask >> k) & 1,
                                                               (L.no_negative >> k) & 1, lane);
      bad |= !(amax >= 0.0f);
      if (FULL || i < P.numel) {
        if (leader) P.absmax[k][i >> a.block_shift] = amax;
        L.template encode_slot<FULL>(P, a, sh, k, amax, i, vec);
      }
    }
    if (bad && leader && (FULL || i < P.numel))
      atomicAdd(reinterpret_cast<unsigned long long*>(P.counters + 1), 1ull);
  }
}

// Blocks per SM the register allocation must allow. With quantized state the kernel is bound by
// instruction issue and latency (ncu on an H100): 3 blocks, more resident warps hide more of it
// (2 blocks: 8.33 against 7.48 ms for Q8 AdamW in bench/step_kernel_probe). FP32 state moves 28
// bytes per element and is bound by memory: 2 blocks without register spills, 10.64 against
// 11.11 ms. Kernels carrying three slots (AdEMAMix, Adam with amsgrad) spilled at 3 blocks: 2 ran
// AdEMAMix Q8 in 8.73 against 9.05 ms, C8 10.60 against 10.85. A build can choose one value for
// all with -DLOWBIT_STEP_MIN_BLOCKS=N.
#ifdef LOWBIT_STEP_MIN_BLOCKS
#define LOWBIT_STEP_MIN_BLOCKS_OF(family, slots) LOWBIT_STEP_MIN_BLOCKS
#else
#define LOWBIT_STEP_MIN_BLOCKS_OF(family, slots) ((family) == kF32 || (slots) >= 3 ? 2 : 3)
#endif
template <Rule R, typename T, int FAMILY, int NS, int WARP, int C>
__global__ void __launch_bounds__(kThreads, LOWBIT_STEP_MIN_BLOCKS_OF(FAMILY, NS)) step_kernel(const LOWBIT_GRID_CONSTANT Chunk chunk, const LOWBIT_GRID_CONSTANT Args a) {
  constexpr bool kQuant = is_quant_family(FAMILY);
  constexpr bool kCopyDescriptor = FAMILY == kF32;
  __shared__ __align__(16) SharedFormat sh[kQuant ? 2 : 1];  // unused (and dropped) without tables
  if (kQuant) stage_formats(sh, a);
  if (a.found_inf && *a.found_inf != 0.0f) return;
  const int lane = threadIdx.x % WARP;
  const int64_t warps = int64_t(gridDim.x) * (kThreads / WARP);
  const int64_t warp = int64_t(blockIdx.x) * (kThreads / WARP) + threadIdx.x / WARP;
  const int64_t units = chunk.first_unit[chunk.count];
  const int64_t u0 = units * warp / warps, u1 = units * (warp + 1) / warps;
  const int64_t B = a.block_size;
  const bool big_blocks = kQuant && B > 8 * WARP;
  const int group = kQuant && !big_blocks ? static_cast<int>(B / 8) : WARP;
  int j = 0;
  // The warp's run, one parameter at a time: its descriptor and per-step values are read once
  // into registers, not once per unit.
  for (int64_t u = u0; u < u1;) {
    j = advance_param(chunk, j, u);
    const ParamScalars& ps = a.scalars[chunk.first_param + j];
    // The descriptor is read from kernel-parameter space at each use, except with FP32 state, whose
    // kernel ran at half speed that way (H100, AdamW: 20-27 ms against 11.1 ms with a register
    // copy; Q8 the reverse, 8.4 ms against 9.8 ms, from the copy's register pressure).
    const GpuStepParam& param_ref = chunk.p[j];
    GpuStepParam param_copy;
    if (kCopyDescriptor) param_copy = param_ref;
    const GpuStepParam& P = kCopyDescriptor ? param_copy : param_ref;
    Hyper h = ps.hyper;
    h.maximize = false;  // folded into grad_mult by the prologue: known here, the rule drops its test
    const float grad_mult = ps.grad_mult;
    const uint64_t seed = ps.seed;
    const int64_t first = chunk.first_unit[j];
    const int64_t end = chunk.first_unit[j + 1] < u1 ? chunk.first_unit[j + 1] : u1;
    const bool vec = P.aligned != 0;
    if (!big_blocks) {
      // Units wholly inside the parameter and aligned take the path without bound checks.
      const int64_t full_end = vec ? first + P.numel / a.unit : first;
      for (; u < end; ++u) {
        const int64_t i = (u - first) * a.unit + int64_t(lane) * 8;
        if (u < full_end)
          small_block_unit<R, T, FAMILY, NS, WARP, C, true>(P, a, h, grad_mult, seed, sh, i, vec, lane, group);
        else
          small_block_unit<R, T, FAMILY, NS, WARP, C, false>(P, a, h, grad_mult, seed, sh, i, vec, lane, group);
      }
      continue;
    }
    for (; u < end; ++u) {
      // One block per unit, the whole warp: pass 1 finds the new absmax, pass 2 recomputes and stores.
      const int64_t base = (u - first) * a.unit;
      const int64_t block = base >> a.block_shift;
      Lane<R, T, FAMILY, NS, C> L;
      float amax_new[NS];
      bool bad = false;
      {
        BitScan sc[NS];
        for (int64_t c = 0; c < B; c += 8 * WARP) {
          L.template load_update<false>(P, a, h, grad_mult, sh, base + c + int64_t(lane) * 8, vec);
#pragma unroll
          for (int k = 0; k < NS; ++k) merge(sc[k], L.scan(k));
        }
#pragma unroll
        for (int k = 0; k < NS; ++k) {
          amax_new[k] = group_absmax<WARP, FAMILY == kCodes8>(sc[k], WARP, (a.slot_signed_mask >> k) & 1,
                                                              (L.no_negative >> k) & 1, lane);
          if (a.used_mask & (1 << k)) bad |= !(amax_new[k] >= 0.0f);
        }
      }
      for (int64_t c = 0; c < B; c += 8 * WARP) {
        const int64_t i = base + c + int64_t(lane) * 8;
        L.template load_update<false>(P, a, h, grad_mult, sh, i, vec);
        if (i < P.numel) {
#pragma unroll
          for (int k = 0; k < NS; ++k)
            if (a.used_mask & (1 << k)) L.template encode_slot<false>(P, a, sh, k, amax_new[k], i, vec);
        }
        L.template store_dense<false>(P, a, seed, i, vec);
      }
      // Every lane has read the old absmax (the shuffles above order it); now replace it.
      LOWBIT_SYNCWARP();
      if (lane == 0) {
#pragma unroll
        for (int k = 0; k < NS; ++k)
          if (a.used_mask & (1 << k)) P.absmax[k][block] = amax_new[k];
        if (bad) atomicAdd(reinterpret_cast<unsigned long long*>(P.counters + 1), 1ull);
      }
    }
  }
}

// LAMB's first pass: one warp per norm block, each warp a contiguous run of blocks (so the
// parameter index only moves forward). Lanes load 8 consecutive elements each, as the step does,
// and square p and the direction r in double. kernels/cpu's order: element i joins partial sum
// i mod 16 in increasing i, then the 16 partials are added in order. Of a chunk of 8 * WARP
// elements, partial c takes elements c, c + 16, ...: element e of lane L is value L / 2 of partial
// 8 (L % 2) + e. The warp writes each partial's values of the chunk as one row of shared memory,
// in order; then lane c < 16 adds row c of the squares of p to its partial, lane 16 + c row c of
// the squares of r, two doubles per load. Elements past the block's end are 0 and add +0.0, which
// changes no sum. (The first version kept the chunk in element order and had 16 lanes add both
// sums one double at a time: half of the kernel's instructions, H100.)
// Row c starts at c * kRowStride, rows 8..15 8 doubles further: the stores of one element by the
// warp's even lanes (row e) and odd lanes (row 8 + e) then fall in different banks, and each row
// starts on 16 bytes for the two-double loads.
template <int WARP>
struct LambRows {
  static constexpr int kPerPartial = 8 * WARP / 16;      // values of each partial in a chunk
  static constexpr int kRowStride = kPerPartial + 2;     // doubles, even
  static constexpr int kDoubles = 16 * kRowStride + 8;   // one sum's rows
  static __device__ __forceinline__ int start(int c) { return c * kRowStride + (c >= 8 ? 8 : 0); }
};

// The same rows holding p and r themselves, as floats, for blocks of a chunk or more: a float's
// square is exact in double (48 significant bits; exponents within double's range), so the lane
// that adds a row squares each value there, with the same product and the same additions in the
// same order, and the rows move half the bytes through shared memory (ncu, H100, Q8: the L1 /
// shared-memory pipeline 90 % busy with rows of squares). Row c starts at c * kRowStride floats,
// rows 8..15 16 floats further (32 banks: the even and odd lanes' stores of one element then fall
// in different banks), each on 16 bytes for four-float loads.
template <int WARP>
struct LambFloatRows {
  static constexpr int kPerPartial = 8 * WARP / 16;
  static constexpr int kRowStride = kPerPartial + 4;     // floats, a multiple of 4
  static constexpr int kFloats = 16 * kRowStride + 16;   // one sum's rows
  static __device__ __forceinline__ int start(int c) { return c * kRowStride + (c >= 8 ? 16 : 0); }
};

// Whether blocks of a chunk or more go through LambFloatRows (0: rows of squares, for an A/B build).
#ifndef LOWBIT_LAMB_FLOAT_ROWS
#define LOWBIT_LAMB_FLOAT_ROWS 1
#endif

// The 8 elements at i of LAMB's first pass: parameter (master value), gradient, decoded state;
// 0 past `end`. FULL: the 8 are in range and aligned.
template <bool FULL, typename T, int FAMILY>
__device__ __forceinline__ void lamb_load(const GpuStepParam& P, const Args& a, const float (*codebooks)[256], int64_t i,
                                          int64_t end, bool vec, float (&p)[8], float (&g)[8], float (&s)[2][8]) {
  if constexpr (FULL) {
    // Every load issued first, as the step kernel's units do (UnitBytes).
    UnitBytes<T, FAMILY, 2> u;
    u.load(P, a, i);
    u.param_grad(a, P.grad_type, p, g);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      if (FAMILY == kF32) {
        convert8<float>(u.slot[k], s[k]);
      } else if (FAMILY == kBF16) {
        convert8<bf16_t>(u.slot[k], s[k]);
      } else {
        uint8_t c[8];
        u.codes(k, c);
        const float* cb = codebooks[a.format_of_slot[k]];
#pragma unroll
        for (int e = 0; e < 8; ++e) s[k][e] = decode_value(cb, c[e], u.amax[k]);
      }
    }
    return;
  }
  load8(static_cast<const T*>(P.param), i, end, vec, p);
  if constexpr (std::is_same<T, bf16_t>::value) {
    if (a.correction_bits != 0) add_corrections<false>(P, a.correction_bits, i, end, vec, p);
  }
  load_grad8(P.grad, P.grad_type, i, end, vec, g);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    if (FAMILY == kF32) {
      load8(static_cast<const float*>(P.slot[k]), i, end, vec, s[k]);
    } else if (FAMILY == kBF16) {
      load8(static_cast<const bf16_t*>(P.slot[k]), i, end, vec, s[k]);
    } else {
      uint8_t c[8];
      load_codes8<FAMILY == kCodes8 ? 8 : 4>(static_cast<const uint8_t*>(P.slot[k]), i, end, vec, c);
      // The lane's own block (a chunk can hold several small ones); none past the end.
      const float amax = i < end ? P.absmax[k][i >> a.block_shift] : 0.0f;
      const float* cb = codebooks[a.format_of_slot[k]];
#pragma unroll
      for (int e = 0; e < 8; ++e) s[k][e] = i + e < end ? decode_value(cb, c[e], amax) : 0.0f;  // code 0 is not 0
    }
  }
}

// Whether the first pass's blocks of 64 and 128 (C8's, Q4's) add their rows with the segment
// length as a constant (0: at run time, for an A/B build).
#ifndef LOWBIT_LAMB_SEG_UNROLL
#define LOWBIT_LAMB_SEG_UNROLL 1
#endif

// Blocks per SM LAMB's first pass asks the register allocation for: 3 (80 registers). With grids
// of 8 blocks per SM, 4 (64 registers, some spilled) ran quantized state faster (H100, both LAMB
// passes over 1.07B parameters, Q8: bf16 + 24-bit master 13.65 -> 12.86 ms); with one-wave grids
// and LambFloatRows, 3 does (bench/step_kernel_probe, one call, 4 -> 3 blocks: Q8 fp32 13.06-13.08
// -> 12.73-12.77 ms, bf16 + 24-bit master 12.28-12.31 -> 12.19). Dense state: 3 (the compiler took
// 86-87 registers, 2 blocks). -DLOWBIT_LAMB_MIN_BLOCKS=N sets another value.
#ifdef LOWBIT_LAMB_MIN_BLOCKS
#define LOWBIT_LAMB_MIN_BLOCKS_OF(family) LOWBIT_LAMB_MIN_BLOCKS
#else
#define LOWBIT_LAMB_MIN_BLOCKS_OF(family) 3
#endif
template <typename T, int FAMILY, int WARP>
__global__ void __launch_bounds__(kThreads, LOWBIT_LAMB_MIN_BLOCKS_OF(FAMILY)) lamb_sums_kernel(const LOWBIT_GRID_CONSTANT Chunk chunk,
                                                             const LOWBIT_GRID_CONSTANT Args a) {
  constexpr bool kQuant = is_quant_family(FAMILY);
  constexpr int kWarps = kThreads / WARP, kChunkElems = 8 * WARP;
  using Rows = LambRows<WARP>;
  using FloatRows = LambFloatRows<WARP>;
  // Decoding needs only the codebooks (2 KiB, not the encode tables): room for the squares.
  __shared__ __align__(16) float codebooks[2][256];
  __shared__ __align__(16) double rows[kWarps][2][Rows::kDoubles];
  static_assert(sizeof(float) * 2 * FloatRows::kFloats <= sizeof(double) * 2 * Rows::kDoubles, "float rows fit");
  float (*const float_rows)[2][FloatRows::kFloats] = reinterpret_cast<float (*)[2][FloatRows::kFloats]>(rows);
  if (kQuant) {
    for (int d = 0; d < a.num_distinct; ++d) stage(codebooks[d], a.distinct[d]->codebook, 256);
    __syncthreads();
  }
  if (a.found_inf && *a.found_inf != 0.0f) return;
  const int lane = threadIdx.x % WARP, w = threadIdx.x / WARP;
  const int64_t warps = int64_t(gridDim.x) * kWarps, warp = int64_t(blockIdx.x) * kWarps + w;
  const int64_t blocks = chunk.first_block[chunk.count];
  const int64_t b0 = blocks * warp / warps, b1 = blocks * (warp + 1) / warps;
  const int64_t B = a.block_size;
  int j = 0;
  // The squares of a chunk's 8 elements per lane, into the rows (see LambRows). Elements from
  // `valid` on are past the end: p, g and the state are 0 there, but the direction is 0 / eps,
  // NaN with eps 0, so r is set to 0.
  // The directions of 8 elements, with division and square root by `ar` (speculative_arith.cuh).
  const auto directions = [&](const Hyper& h, float grad_mult, const float (&p)[8], const float (&g)[8],
                              const float (&s)[2][8], int64_t valid, auto&& ar, float (&r)[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float st[2] = {s[0][e], s[1][e]};
      float mn, vn;
      r[e] = e < valid ? lamb_direction(h, g[e] * grad_mult, p[e], st, &mn, &vn, ar) : 0.0f;
    }
  };
  // FLOATS: p and r into LambFloatRows; else their squares into LambRows.
  const auto square_into_rows = [&](const Hyper& h, float grad_mult, const float (&p)[8], const float (&g)[8],
                                    const float (&s)[2][8], int64_t valid, auto floats) {
    float r[8];
    SpeculativeArith ar;
    if (kLambSumsSpeculate) directions(h, grad_mult, p, g, s, valid, ar, r);
    if (!kLambSumsSpeculate || !ar.ok) directions(h, grad_mult, p, g, s, valid, ExactArith{}, r);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if constexpr (decltype(floats)::value) {
        const int at = FloatRows::start(8 * (lane % 2) + e) + lane / 2;
        float_rows[w][0][at] = p[e];
        float_rows[w][1][at] = r[e];
      } else {
        const int at = Rows::start(8 * (lane % 2) + e) + lane / 2;
        rows[w][0][at] = static_cast<double>(p[e]) * p[e];
        rows[w][1][at] = static_cast<double>(r[e]) * r[e];
      }
    }
  };
  using Squares = std::false_type;
  using Floats = std::integral_constant<bool, LOWBIT_LAMB_FLOAT_ROWS != 0>;
  if (B % 16 == 0 && B < kChunkElems) {
    // Blocks smaller than a chunk (Q4's 128, C8's 64): one chunk holds nb consecutive blocks of a
    // parameter, block t as values [t * B / 16, (t + 1) * B / 16) of every row. Lane c < 16 (p) and
    // 16 + c (r) add each block's segment of row c in order, and leave the partial in the
    // segment's first place (only that lane reads its row); then lane t < nb adds block t's 16 p
    // partials in order, lane nb + t its r partials. (One block per warp, as for larger blocks, left
    // most lanes without elements, and added the partials once per block by shuffles.)
    // SEG (B / 16, a power of two: block sizes are) as a constant unrolls the adds of the rows;
    // 0 takes it at run time.
    const auto small_blocks = [&](auto seg_constant) {
      constexpr int SEG = decltype(seg_constant)::value;
      const int seg = SEG != 0 ? SEG : static_cast<int>(B / 16);
      constexpr int kMostBlocks = SEG != 0 ? Rows::kPerPartial / SEG : Rows::kPerPartial;  // per chunk
      for (int64_t item = b0; item < b1;) {
        while (j + 1 < chunk.count && chunk.first_block[j + 1] <= item) ++j;
        const GpuStepParam& P = chunk.p[j];
        const ParamScalars& ps = a.scalars[chunk.first_param + j];
        const int64_t b = item - chunk.first_block[j], begin = b * B;
        const int64_t param_last = chunk.first_block[j + 1] < b1 ? chunk.first_block[j + 1] : b1;
        const int nb = static_cast<int>(kChunkElems / B < param_last - item ? kChunkElems / B : param_last - item);
        const int64_t end = P.numel - begin < nb * B ? P.numel : begin + nb * B;
        const bool vec = P.aligned != 0;
        const int64_t i = begin + int64_t(lane) * 8;
        float p[8], g[8], s[2][8];
        if (vec && begin + kChunkElems <= end) {
          lamb_load<true, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
          square_into_rows(ps.hyper, ps.grad_mult, p, g, s, 8, Squares{});
        } else {
          lamb_load<false, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
          square_into_rows(ps.hyper, ps.grad_mult, p, g, s, end - i, Squares{});
        }
        LOWBIT_SYNCWARP();
        if (lane < 32) {
          double* row = &rows[w][lane / 16][Rows::start(lane % 16)];
#pragma unroll
          for (int t = 0; t < kMostBlocks; ++t) {
            if (t < nb) {
              double part = 0.0;
#pragma unroll
              for (int k = 0; k < (SEG != 0 ? SEG : seg); ++k) part += row[t * seg + k];
              row[t * seg] = part;
            }
          }
        }
        LOWBIT_SYNCWARP();
        if (lane < 2 * nb) {
          const int which = lane < nb ? 0 : 1, t = lane - which * nb;
          double sum = 0.0;
#pragma unroll
          for (int c = 0; c < 16; ++c) sum += rows[w][which][Rows::start(c) + t * seg];
          a.block_sums[2 * (item + t) + which] = sum;
        }
        LOWBIT_SYNCWARP();
        item += nb;
      }
    };
    switch (LOWBIT_LAMB_SEG_UNROLL ? B / 16 : 0) {
      case 4: small_blocks(std::integral_constant<int, 4>{}); break;
      case 8: small_blocks(std::integral_constant<int, 8>{}); break;
      default: small_blocks(std::integral_constant<int, 0>{}); break;
    }
    return;
  }
  for (int64_t item = b0; item < b1; ++item) {
    while (j + 1 < chunk.count && chunk.first_block[j + 1] <= item) ++j;
    const GpuStepParam& P = chunk.p[j];
    const ParamScalars& ps = a.scalars[chunk.first_param + j];
    const Hyper h = ps.hyper;
    const float grad_mult = ps.grad_mult;  // maximize folded in by the prologue
    const int64_t b = item - chunk.first_block[j], begin = b * B;
    const int64_t end = P.numel - begin < B ? P.numel : begin + B;
    const bool vec = P.aligned != 0;
    double part = 0.0;  // lane c < 16: partial sum c of p's squares; lane 16 + c: of r's
    for (int64_t off = begin; off < end; off += kChunkElems) {
      const int64_t i = off + int64_t(lane) * 8;
      float p[8], g[8], s[2][8];
      // A whole chunk in range and aligned (every chunk of a large block but a parameter's
      // last): no bound tests.
      if (vec && off + kChunkElems <= end) {
        lamb_load<true, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
        square_into_rows(h, grad_mult, p, g, s, 8, Floats{});
      } else {
        lamb_load<false, T, FAMILY>(P, a, codebooks, i, end, vec, p, g, s);
        square_into_rows(h, grad_mult, p, g, s, end - i, Floats{});
      }
      LOWBIT_SYNCWARP();
      if (lane < 32) {
        if constexpr (Floats::value) {
          const float4* row = reinterpret_cast<const float4*>(&float_rows[w][lane / 16][FloatRows::start(lane % 16)]);
#pragma unroll
          for (int k = 0; k < FloatRows::kPerPartial / 4; ++k) {
            const float4 v = row[k];
            part += static_cast<double>(v.x) * v.x;
            part += static_cast<double>(v.y) * v.y;
            part += static_cast<double>(v.z) * v.z;
            part += static_cast<double>(v.w) * v.w;
          }
        } else {
          const double2* row = reinterpret_cast<const double2*>(&rows[w][lane / 16][Rows::start(lane % 16)]);
#pragma unroll
          for (int k = 0; k < Rows::kPerPartial / 2; ++k) {
            const double2 v = row[k];
            part += v.x;
            part += v.y;
          }
        }
      }
      LOWBIT_SYNCWARP();
    }
    // The 16 partials in order (every lane takes part in the shuffles).
    double sp = 0.0, sr = 0.0;
    for (int q = 0; q < 16; ++q) {
      sp += LOWBIT_SHFL(part, q, WARP);
      sr += LOWBIT_SHFL(part, 16 + q, WARP);
    }
    if (lane == 0) {
      a.block_sums[2 * item] = sp;
      a.block_sums[2 * item + 1] = sr;
    }
  }
}

// ---- launch -----------------------------------------------------------------------------------

// Blocks per SM in a launch's grid: 0 (the default) for one wave, the blocks every SM holds at
// once; N for a fixed N per SM (an A/B build: 8 before this was measured).
#ifndef LOWBIT_STEP_GRID_PER_SM
#define LOWBIT_STEP_GRID_PER_SM 0
#endif

// The grid of a launch of `kernel` that has work for `wanted` blocks: at most one wave, the blocks
// all SMs hold at once (the kernel's occupancy, queried once per kernel and device). Each warp
// takes an equal run of the launch's units, so the blocks of a single wave end together; a grid
// of several waves (8 blocks per SM: 2.67 waves at 3 resident) ran its last, partial wave at two
// blocks per SM, lower occupancy, alone. The kernel is a template argument, not a function
// pointer's type: each kernel needs its own cache.
template <auto kernel>
int wave_grid(int64_t wanted) {
  constexpr int kDevices = 64;
  static std::atomic<int> cached[kDevices];  // blocks per wave; 0 until queried
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;  // the launch reports the error
  int blocks = dev < kDevices ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (blocks == 0) {
    int sms = 1, resident = 1;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) sms = 1;
    if (LOWBIT_STEP_GRID_PER_SM > 0) {
      resident = LOWBIT_STEP_GRID_PER_SM;
    } else if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0) != cudaSuccess) {
      resident = 1;
    }
    blocks = std::max(1, sms) * std::max(1, resident);
    if (dev < kDevices) cached[dev].store(blocks, std::memory_order_relaxed);
  }
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, blocks)));
}

// Kernels of rule R for one chunk (optim_step_<rule>.cu instantiate it).
// companions: the chunk's Companions (kernels without fixed ones take kAnyCompanions for any).
template <Rule R>
cudaError_t launch_step(const Chunk& chunk, const Args& a, ElemType param_type, int family, int warp, int ns,
                        int companions, int64_t wanted, cudaStream_t stream);
template <Rule R, typename T, int FAMILY, int WARP, int C>
cudaError_t launch_companions(const Chunk& chunk, const Args& a, int ns, int64_t wanted, cudaStream_t stream) {
  constexpr int kMost = RuleMaxSlots<R>::value;
  constexpr int kFewer = rule_has_variant<R>(kMost - 1) ? kMost - 1 : (rule_has_variant<R>(1) ? 1 : kMost);
  if (ns == kMost) {
    constexpr auto kernel = step_kernel<R, T, FAMILY, kMost, WARP, C>;
    kernel<<<wave_grid<kernel>(wanted), kThreads, 0, stream>>>(chunk, a);
  } else if (ns == kFewer) {
    constexpr auto kernel = step_kernel<R, T, FAMILY, kFewer, WARP, C>;
    kernel<<<wave_grid<kernel>(wanted), kThreads, 0, stream>>>(chunk, a);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <Rule R, typename T, int FAMILY, int WARP>
cudaError_t launch_typed(const Chunk& chunk, const Args& a, int ns, int companions, int64_t wanted,
                         cudaStream_t stream) {
  if constexpr (has_fixed_companions<T>(FAMILY)) {
    switch (companions) {
      case kNearest: return launch_companions<R, T, FAMILY, WARP, kNearest>(chunk, a, ns, wanted, stream);
      case kStochastic: return launch_companions<R, T, FAMILY, WARP, kStochastic>(chunk, a, ns, wanted, stream);
      case kMaster24: return launch_companions<R, T, FAMILY, WARP, kMaster24>(chunk, a, ns, wanted, stream);
      case kMaster32: return launch_companions<R, T, FAMILY, WARP, kMaster32>(chunk, a, ns, wanted, stream);
      default: break;
    }
  }
  return launch_companions<R, T, FAMILY, WARP, kAnyCompanions>(chunk, a, ns, wanted, stream);
}

#define LOWBIT_STEP_LAUNCH_FAMILY(R, T, W)                                                      \
  switch (family) {                                                                             \
    case kF32: return launch_typed<R, T, kF32, W>(chunk, a, ns, companions, wanted, stream);                      \
    case kBF16: return launch_typed<R, T, kBF16, W>(chunk, a, ns, companions, wanted, stream);                    \
    case kCodes8: return launch_typed<R, T, kCodes8, W>(chunk, a, ns, companions, wanted, stream);                \
    case kCodes4: return launch_typed<R, T, kCodes4, W>(chunk, a, ns, companions, wanted, stream);                \
  }                                                                                             \
  return cudaErrorInvalidValue;

#define LOWBIT_STEP_LAUNCH_WARP(W)                                                              \
  if (warp == W) {                                                                              \
    switch (param_type) {                                                                       \
      case ElemType::F32: { LOWBIT_STEP_LAUNCH_FAMILY(R, float, W) }                            \
      case ElemType::BF16: { LOWBIT_STEP_LAUNCH_FAMILY(R, bf16_t, W) }                          \
      case ElemType::F16: { LOWBIT_STEP_LAUNCH_FAMILY(R, f16_t, W) }                            \
    }                                                                                           \
  }

#define LOWBIT_INSTANTIATE_STEP(RULE)                                                           \
  template <>                                                                                   \
  cudaError_t launch_step<RULE>(const Chunk& chunk, const Args& a, ElemType param_type, int family, int warp, \
                                int ns, int companions, int64_t wanted, cudaStream_t stream) {  \
    constexpr Rule R = RULE;                                                                    \
    LOWBIT_FOR_EACH_WARP_SIZE(LOWBIT_STEP_LAUNCH_WARP)                                          \
    return cudaErrorInvalidValue;                                                               \
  }

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
