// The fused optimizer step on the CPU: every block of every parameter of a launch in one OpenMP
// region; per block one read of param, grad and state, one write of param and state. A launch is a
// StepLaunch (kernels/common/step_launch.h), the record the GPU kernels take, with host pointers.
#pragma once

#include "../common/step_launch.h"

namespace lowbit {
namespace kernels {

// Steps the launch's parameters unless *found_inf is nonzero: each parameter's per-step values
// from its counters and the launch's scalars (step_config.h: derive_hyper, step_seed,
// grad_multiplier, lamb_trust: what the GPU's prologue derives), LAMB's first pass where
// lamb_norms is null; then counters[0] = the step taken, and counters[1] += the blocks whose
// quantized state became Inf or NaN (their absmax holds encode.h's NaN flag).
void optim_step_cpu(const StepLaunch& s);

// LAMB's first pass alone (the step runs it itself): out[2 t] = sum of p^2 and out[2 t + 1] = sum
// of r^2 over parameter t, r the update direction before the trust ratio at the step its counters
// make next, in double. Element i of a block goes to partial sum i mod 16, a block's 16 partials
// are added in order, and the blocks' sums in lamb_add_block_sums's order (groups of 256 blocks):
// the same sums on every path and thread count (the ATen reference included). Counters unchanged.
void lamb_norms_cpu(const StepLaunch& s, double* out);

}  // namespace kernels
}  // namespace lowbit
