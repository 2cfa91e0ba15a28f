// The fused optimizer step on the CPU: every block of every parameter of a call in one OpenMP
// region; per block one read of param, grad and state, one write of param and state.
#pragma once

#include <cstdint>

#include "../common/quantize_params.h"
#include "../common/state_slots.h"
#include "../common/step_config.h"

namespace lowbit {
namespace kernels {

// One parameter (or a block-aligned range of one) at one step.
struct ParamTask {
  void* param = nullptr;
  ElemType param_type = ElemType::F32;
  const void* grad = nullptr;
  ElemType grad_type = ElemType::F32;
  int64_t numel = 0;
  int64_t offset = 0;        // element of the whole parameter where this range starts (RNG index)
  int64_t block_size = 256;  // quantization block of the state; also the unit of work
  int num_slots = 0;                // moment slots (at most kMomentSlots)
  // slots[kCorrectionSlot]: the master-weight correction of a bf16 parameter (Int16 / Int8
  // storage, master_weight.h), or None.
  StateSlotRef slots[kMaxSlots];
  Hyper hyper;                    // this step's values (derive_hyper)
  bool stochastic_round = false;  // bf16 params: round the fp32 result stochastically
  uint64_t seed = 0;              // counter-based RNG: hash(seed, offset + element index)
};

struct OptimStep {
  Rule rule = Rule::AdamW;
  const ParamTask* tasks = nullptr;
  int64_t num_tasks = 0;
  float grad_scale = 1.0f;   // clipping / loss-scale factor, applied as the gradient is read
  bool trust_given = false;  // LAMB: tasks' hyper.trust is set (whole-parameter norms); else pass 1 runs
  bool vector_path = true;   // false: the scalar loop even where AVX-512 is present (tests)
  // Out (optional, num_tasks entries): blocks whose quantized state became Inf or NaN (an
  // overflow); their absmax holds encode.h's NaN flag.
  int64_t* nonfinite_blocks = nullptr;
};

void optim_step_cpu(const OptimStep& step);

// LAMB's first pass alone (the step runs it itself): out[2 t] = sum of p^2 and out[2 t + 1] = sum
// of r^2 over parameter t, r the update direction before the trust ratio, in double. Element i of
// a block goes to partial sum i mod 16, a block's 16 partials are added in order, and the blocks'
// sums in lamb_add_block_sums's order (groups of 256 blocks): the same sums on every path and
// thread count (the ATen reference included).
void lamb_norms_cpu(const OptimStep& step, double* out);

}  // namespace kernels
}  // namespace lowbit
