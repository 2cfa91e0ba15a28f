// The fused optimizer step on the CPU: every block of every parameter of a group in one OpenMP
// region; per block one read of param, grad and state, one write of param and state.
#pragma once

#include <cstdint>

#include "../common/optim_rules.h"
#include "../common/quantize_params.h"

namespace lowbit {
namespace kernels {

struct FormatView;

enum class SlotStorage : int32_t { None = 0, F32 = 1, BF16 = 2, Quant = 3 };  // None: slot unused

struct StateSlotRef {
  SlotStorage storage = SlotStorage::None;
  void* values = nullptr;    // F32: float*, BF16: bf16 bits (uint16_t*)
  uint8_t* codes = nullptr;  // Quant
  float* absmax = nullptr;   // Quant: one per block of block_size
  QuantFormat format = QuantFormat::Dyn8Signed;
  const FormatView* tables = nullptr;  // set inside optim_step_cpu
};

struct ParamTask {
  void* param = nullptr;
  ElemType param_type = ElemType::F32;
  const void* grad = nullptr;
  ElemType grad_type = ElemType::F32;
  int64_t numel = 0;
  int64_t block_size = 256;  // quantization block of the state; also the unit of work
  int num_slots = 0;
  StateSlotRef slots[3];
  Hyper hyper;
  bool stochastic_round = false;  // bf16 params: round the fp32 result stochastically
  uint64_t seed = 0;              // counter-based RNG: hash(seed, element index)
};

struct OptimStep {
  Rule rule = Rule::AdamW;
  const ParamTask* tasks = nullptr;
  int64_t num_tasks = 0;
  float grad_scale = 1.0f;  // gradient clipping factor, applied as the gradient is read
  bool vector_path = true;  // false: the scalar loop even where AVX-512 is present (tests)
  // Out (optional, num_tasks entries): blocks whose quantized state became Inf or NaN (an
  // overflow); their absmax holds encode.h's NaN flag.
  int64_t* nonfinite_blocks = nullptr;
};

void optim_step_cpu(const OptimStep& step);

// LAMB's first pass alone (the step runs it itself): out[2 t] = sum of p^2 and out[2 t + 1] = sum
// of r^2 over parameter t, r the update direction before the trust ratio, in double. Element i of
// a block goes to partial sum i mod 16, a block's 16 partials are added in order, and the blocks
// in block order: the same sums on every path and thread count (the ATen reference included).
void lamb_norms_cpu(const OptimStep& step, double* out);

}  // namespace kernels
}  // namespace lowbit
