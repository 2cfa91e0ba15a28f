// What the GPU step kernels share: the launch's arguments (Args), its chunk of parameter
// descriptors (Chunk), the state families and the compile-time companions of a kernel. The job of
// each file: step_tuning.cuh (measured choices), step_tables.cuh (shared-memory formats),
// step_element_access.cuh (loads and stores of 8 elements), step_lane.cuh (one lane's update),
// step_kernel.cuh and lamb_sums_kernel.cuh (the kernels), step_launch.cuh (grids and instantiation);
// optim_step_cuda.cu drives a step.
#pragma once

#include <type_traits>

#include "../common/optim_rules.h"
#include "gpu_tables.cuh"
#include "optim_step_cuda.h"
#include "portability.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

constexpr int kThreads = 256;
constexpr int kChunk = kDescriptorsPerLaunch;

// How a launch's state is stored: every used slot the same way. kCodes8 / kCodes4: 8-bit and 4-bit
// codes, encoded and decoded through shared-memory tables. The companded formats (compand.h) are
// 8-bit codes too: their tables give the bits of their arithmetic (code_tables.h), and ran faster
// than it (bench/HISTORY.md: step kernel tuning).
enum Family : int { kF32 = 0, kBF16 = 1, kCodes8 = 2, kCodes4 = 3 };

// Quantized state; every quantized family is table-coded (its formats staged in shared memory).
LOWBIT_HD constexpr bool is_quant_family(int f) { return f == kCodes8 || f == kCodes4; }
LOWBIT_HD constexpr int code_bits(int f) { return f == kCodes4 ? 4 : 8; }

// Slots a rule's update reads and writes with every option on.
template <Rule R>
struct RuleMaxSlots {
  static constexpr int value = rule_max_slots(R);
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
  StepParamRef p[kChunk];
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
// kernel nvcc spilled the bf16 kernels' registers, and the fixed kernels ran faster.
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
  static __device__ __forceinline__ ElemType grad_type(const StepParamRef& P) {
    return C == kAnyCompanions ? P.grad_type : ElemType::BF16;
  }
  static __device__ __forceinline__ int correction_bits(const Args& a) {
    return C == kAnyCompanions ? a.correction_bits : (C == kMaster24 ? 8 : (C == kMaster32 ? 16 : 0));
  }
  static __device__ __forceinline__ bool stochastic(const Args& a) {
    return C == kAnyCompanions ? a.stochastic_round : C == kStochastic;
  }
};

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
