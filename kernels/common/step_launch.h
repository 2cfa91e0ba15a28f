// What a fused optimizer step launch is, for every backend: the binding (tensors/) fills one
// StepLaunch per group of parameters and hands it unchanged to kernels/cpu (optim_step_cpu.h) or
// kernels/cuda (optim_step_cuda.h). Plain C++, no torch. Pointers are on the kernels' device (host
// memory for the CPU kernels). Each backend derives a parameter's per-step values (Hyper, the
// rounding seed, the gradient multiplier, LAMB's trust ratio) from its counters and the launch's
// scalars itself, with step_config.h's functions, and writes its counters.
#pragma once

#include <cstdint>

#include "quantize_params.h"
#include "state_slots.h"
#include "step_config.h"

namespace lowbit {
namespace kernels {

// One parameter, or a block-aligned range of one: its tensors' addresses and where it lies in the
// whole parameter.
struct StepParamRef {
  void* param = nullptr;
  const void* grad = nullptr;
  void* slot[kMomentSlots] = {};     // by slot: F32 / BF16 values, or codes
  float* absmax[kMomentSlots] = {};  // quantized slots: one scale per block
  void* correction = nullptr;        // bf16 parameters: the master-weight correction (slot kCorrectionSlot)
  int64_t* counters = nullptr;       // [2]: steps taken, overflowed blocks
  int64_t numel = 0;
  int64_t offset = 0;   // element of the whole parameter where this range starts (rounding index)
  int64_t rng_key = 0;  // the parameter's key in the rounding seed (step_seed)
  ElemType grad_type = ElemType::F32;
  int32_t aligned = 0;  // every pointer allows 16-byte accesses (GPU kernels)
};

// Whether every address of r allows 16-byte accesses (null ones do).
inline bool aligned16(const StepParamRef& r) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(r.param) | reinterpret_cast<uintptr_t>(r.grad) |
                   reinterpret_cast<uintptr_t>(r.correction);
  for (int k = 0; k < kMomentSlots; ++k) bits |= reinterpret_cast<uintptr_t>(r.slot[k]);
  return bits % 16 == 0;
}

// One launch: parameters of one dtype and one state layout, and the step's scalars.
struct StepLaunch {
  StepConfig config;
  SlotType slots[kMaxSlots];
  int num_slots = 0;
  int64_t block_size = 256;
  ElemType param_type = ElemType::F32;
  const void* lr = nullptr;            // [1], float64 (lr_is_double) or float32
  bool lr_is_double = true;
  const float* found_inf = nullptr;    // [1] or null: nonzero skips everything
  const double* grad_sumsq = nullptr;  // [1] or null; clipping when max_grad_norm > 0
  double max_grad_norm = 0.0;
  const float* grad_scale = nullptr;   // [1] or null: the AMP loss scale
  const double* lamb_norms = nullptr;  // [n][2] whole-parameter sums, or null (computed by the step)
  uint64_t seed = 0;
  bool stochastic_round = false;
  const StepParamRef* params = nullptr;  // host array of n
  int64_t n = 0;
  void* scratch = nullptr;   // GPU: gpu_step_scratch_bytes(*this) bytes of device memory
  bool scalar_loop = false;  // CPU: the scalar loop even where a vector loop exists (tests)
};

}  // namespace kernels
}  // namespace lowbit
