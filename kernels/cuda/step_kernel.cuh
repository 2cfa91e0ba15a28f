// The fused optimizer step on GPUs: the step kernel (optim_step_cuda.h is the API; optim_step_cuda.cu
// drives a step; step_launch.cuh launches it; optim_step_<rule>.cu instantiate one rule each). CUDA, and HIP through portability.cuh.
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

#include "step_lane.cuh"
#include "step_tuning.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

// The parameter of unit u: the last j with first_unit[j] <= u (j only moves forward in a warp's run).
__device__ __forceinline__ int advance_param(const Chunk& c, int j, int64_t u) {
  while (j + 1 < c.count && c.first_unit[j + 1] <= u) ++j;
  return j;
}

// One unit of small blocks (B <= 8 lanes' worth of a warp): each group of B/8 lanes owns a block.
template <Rule R, typename T, int FAMILY, int NS, int WARP, int C, bool FULL>
__device__ __forceinline__ void small_block_unit(const StepParamRef& P, const Args& a, const Hyper& h, float grad_mult,
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

// Blocks per SM: step_tuning.cuh.
template <Rule R, typename T, int FAMILY, int NS, int WARP, int C>
__global__ void __launch_bounds__(kThreads, Tuning::step_min_blocks(FAMILY, NS)) step_kernel(const LOWBIT_GRID_CONSTANT Chunk chunk, const LOWBIT_GRID_CONSTANT Args a) {
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
    // kernel ran at half speed that way; with quantized state a register copy costs more, from
    // its register pressure (bench/HISTORY.md: step kernel tuning).
    const StepParamRef& param_ref = chunk.p[j];
    StepParamRef param_copy;
    if (kCopyDescriptor) param_copy = param_ref;
    const StepParamRef& P = kCopyDescriptor ? param_copy : param_ref;
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
    // Dense state never has big blocks: its kernels compile no such loop (nor warn that it is dead).
    if constexpr (kQuant) for (; u < end; ++u) {
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

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
