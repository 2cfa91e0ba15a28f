// A variant of the step kernels' tuning (kernels/cuda/step_tuning.cuh) for bench/step_kernel_probe:
// the library's choices, each replaced where its definition is given. Built only for the probe
// (CMake: LOWBIT_STEP_PROBE_VARIANTS, "TAG=-DNAME=VALUE ..." per variant):
//   LOWBIT_STEP_SPECULATE=0|1       SpeculativeArith in every step kernel and LAMB's first pass, or none
//   LOWBIT_STEP_BATCH=0|1           BatchArith in every kernel that does not speculate, or none
//   LOWBIT_STEP_SHORT_NORMALIZER=0|1  the branch-free normalizer in every kernel, or none
//   LOWBIT_STEP_MIN_BLOCKS=N        blocks per SM for every step kernel's registers
//   LOWBIT_LAMB_MIN_BLOCKS=N        the same for LAMB's first pass
//   LOWBIT_LAMB_FLOAT_ROWS=0|1      LAMB's rows of floats, or of squares
//   LOWBIT_LAMB_SEG_UNROLL=0|1      LAMB's small-block segments unrolled, or at run time
//   LOWBIT_STEP_GRID_PER_SM=N       N blocks per SM in every grid (0: one wave)
//   LOWBIT_STEP_NONNEG_SKIP=0|1     the search for negative values skipped where it cannot find one
#pragma once

namespace lowbit {
namespace kernels {
namespace gpu_step {

struct Tuning : StepTuning {
#ifdef LOWBIT_STEP_SPECULATE
  template <Rule R, int FAMILY>
  static constexpr bool speculates() {
    return LOWBIT_STEP_SPECULATE != 0;
  }
  static constexpr bool lamb_sums_speculate = LOWBIT_STEP_SPECULATE != 0;
#endif
#ifdef LOWBIT_STEP_BATCH
  template <Rule R, int FAMILY, int C>
  static constexpr bool batches() {
    return LOWBIT_STEP_BATCH != 0;
  }
#endif
#ifdef LOWBIT_STEP_SHORT_NORMALIZER
  template <int C>
  static constexpr bool short_normalizer() {
    return LOWBIT_STEP_SHORT_NORMALIZER != 0;
  }
#endif
#ifdef LOWBIT_STEP_MIN_BLOCKS
  static constexpr int step_min_blocks(int, int) { return LOWBIT_STEP_MIN_BLOCKS; }
#endif
#ifdef LOWBIT_LAMB_MIN_BLOCKS
  static constexpr int lamb_min_blocks(int) { return LOWBIT_LAMB_MIN_BLOCKS; }
#endif
#ifdef LOWBIT_LAMB_FLOAT_ROWS
  static constexpr bool lamb_float_rows = LOWBIT_LAMB_FLOAT_ROWS != 0;
#endif
#ifdef LOWBIT_LAMB_SEG_UNROLL
  static constexpr bool lamb_seg_unroll = LOWBIT_LAMB_SEG_UNROLL != 0;
#endif
#ifdef LOWBIT_STEP_GRID_PER_SM
  static constexpr int grid_per_sm = LOWBIT_STEP_GRID_PER_SM;
#endif
#ifdef LOWBIT_STEP_NONNEG_SKIP
  static constexpr bool nonneg_skip = LOWBIT_STEP_NONNEG_SKIP != 0;
#endif
};

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
