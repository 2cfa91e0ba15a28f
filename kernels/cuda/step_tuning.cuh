// The step kernels' measured choices, in one place: which arithmetic each kernel takes, how many
// blocks per SM its registers must allow, the grid. Each was timed against its alternatives on an
// H100 with bench/step_kernel_probe (the kernels alone, 1.07B parameters); the numbers are in
// bench/HISTORY.md ("Step kernel tuning"). The probe builds variants of these choices
// (bench/step_probe_tuning.cuh, CMake's LOWBIT_STEP_PROBE_VARIANTS); the library has none.
#pragma once

#include "step_args.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

struct StepTuning {
  // Division and square root by SpeculativeArith (speculative_arith.cuh) rather than the IEEE
  // operations alone: only AdEMAMix with dense state gains; elsewhere the extra instructions and
  // registers cost more than nvcc's branches. Nor does LAMB's first pass.
  template <Rule R, int FAMILY>
  static constexpr bool speculates() {
    return R == Rule::AdEMAMix && !is_quant_family(FAMILY);
  }
  static constexpr bool lamb_sums_speculate = false;

  // A lane's 8 elements updated together as one f32x8 with BatchArith: faster for table-coded
  // state where the kernel's companions are fixed (fewer registers held) and for AdEMAMix; slower
  // where kAnyCompanions kernels then spill. Never where the kernel speculates.
  template <Rule R, int FAMILY, int C>
  static constexpr bool batches() {
    return is_quant_family(FAMILY) && (C != kAnyCompanions || R == Rule::AdEMAMix);
  }

  // The block normalizer without branches (step_tables.cuh: step_normalizer): fewer instructions
  // per slot and block, except where stochastic rounding or a 32-bit master already fill the
  // registers (their allocations spilled more).
  template <int C>
  static constexpr bool short_normalizer() {
    return C != kStochastic && C != kMaster32;
  }

  // Blocks per SM the step kernel's register allocation must allow. Quantized state is bound by
  // instruction issue and latency: 3, more resident warps hide more of it. FP32 state is bound by
  // memory: 2, without spills. Kernels carrying three slots (AdEMAMix, Adam with amsgrad) spill
  // at 3: 2.
  static constexpr int step_min_blocks(int family, int slots) { return family == kF32 || slots >= 3 ? 2 : 3; }

  // LAMB's first pass: 3 blocks per SM (80 registers) with one-wave grids and float rows.
  static constexpr int lamb_min_blocks(int /*family*/) { return 3; }
  // Blocks of a chunk or more move p and r through shared memory as floats (LambFloatRows), half
  // the bytes of rows of squares (the L1 / shared-memory pipeline was the limit).
  static constexpr bool lamb_float_rows = true;
  // Blocks of 64 and 128 (C8's, Q4's) add their rows with the segment length as a constant.
  static constexpr bool lamb_seg_unroll = true;

  // Blocks per SM in a launch's grid: 0 for one wave (the blocks all SMs hold at once), N for a
  // fixed N. A grid of several waves ran its last, partial wave at lower occupancy, alone.
  static constexpr int grid_per_sm = 0;

  // Slots whose update cannot be negative skip the search for negative values in blocks whose old
  // scale is valid (state_slots.h: nonneg_update_slots).
  static constexpr bool nonneg_skip = true;
};

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit

// The probe's variants replace StepTuning as a whole; the library always takes it.
#ifdef LOWBIT_STEP_TUNING_HEADER
#include LOWBIT_STEP_TUNING_HEADER
#else
namespace lowbit {
namespace kernels {
namespace gpu_step {
using Tuning = StepTuning;
}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
#endif

namespace lowbit {
namespace kernels {
namespace gpu_step {

template <Rule R, int FAMILY>
constexpr bool kSpeculates = Tuning::speculates<R, FAMILY>();
constexpr bool kLambSumsSpeculate = Tuning::lamb_sums_speculate;
template <Rule R, int FAMILY, int C>
constexpr bool kBatches = !kSpeculates<R, FAMILY> && Tuning::batches<R, FAMILY, C>();
template <int C>
constexpr bool kShortNormalizer = Tuning::short_normalizer<C>();

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
