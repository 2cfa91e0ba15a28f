// The dispatcher ops of an optimizer step. The optimizers (optim/) call these and nothing below
// them: each backend registers its kernel, and the CompositeExplicitAutograd reference (ATen ops
// only) serves every other device and is the oracle the kernels are tested against.
//
// Schema (TORCH_LIBRARY(lowbit)):
//   grad_stats(Tensor[] grads, bool want_sumsq) -> (Tensor finite, Tensor sumsq)
//       finite: bool [N], whether every element of grads[i] is finite; sumsq: float64 [N], the sum
//       of squares (0 unless want_sumsq). Both on the CPU.
//   optim_step_(int rule, Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] states, int[] slot_kinds,
//               int[] block_sizes, float[] hyper, int[] seeds, int[] flags, float grad_scale,
//               bool scalar_loop=False) -> Tensor
//       One fused step of kernels::Rule `rule` over N parameters, in place. Per parameter: three
//       slot kinds (kSlot* below; the state tensors of its slots follow in `states` in order: one
//       tensor for a dense slot, codes then absmax for a quantized one), the quantization block,
//       kHyperFields values of kernels::Hyper (pack_hyper), a seed and flags (kFlag*). Gradients
//       are multiplied by grad_scale as they are read. scalar_loop: the CPU kernel's scalar loop
//       even where AVX-512 is present (tests compare the two). Returns int64 [N] on the CPU: per
//       parameter, the blocks of quantized state that became Inf or NaN (an overflow; their
//       absmax holds the NaN flag), 0 normally.
//   optim_step_reference_(...): the same arguments, always the ATen reference.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include <lowbit/kernels/common/optim_rules.h>

#include "quant_format.h"

namespace lowbit {
namespace ops {

constexpr int64_t kSlotNone = 0;
constexpr int64_t kSlotF32 = 1;
constexpr int64_t kSlotBF16 = 2;
constexpr int64_t kSlotQuantized = 16;  // + static_cast<int>(QuantFormat)
constexpr int64_t kFlagStochasticRound = 1;  // bf16 params: round the result stochastically

struct StepSlot {
  int64_t kind = kSlotNone;
  at::Tensor values;          // dense slots: float32 or bfloat16, numel of the parameter
  at::Tensor codes, absmax;   // quantized slots
  QuantFormat format = QuantFormat::Dyn8Signed;
};

struct StepParam {
  at::Tensor param, grad;
  StepSlot slots[3];
  int num_slots = 0;          // 1 + the last used slot
  int64_t block_size = 0;
  kernels::Hyper hyper;
  uint64_t seed = 0;
  bool stochastic_round = false;
};

// Calls through the dispatcher, what the optimizers use: the fused kernel of the tensors' device
// (the reference where none is registered), or the reference itself.
at::Tensor optim_step(int64_t rule, at::TensorList params, at::TensorList grads, at::TensorList states,
                at::IntArrayRef slot_kinds, at::IntArrayRef block_sizes, at::ArrayRef<double> hyper,
                at::IntArrayRef seeds, at::IntArrayRef flags, double grad_scale, bool scalar_loop, bool reference);
std::tuple<at::Tensor, at::Tensor> grad_stats(at::TensorList grads, bool want_sumsq);

// Checks the arguments of optim_step_ and groups them per parameter; errors name the parameter.
std::vector<StepParam> parse_step_args(int64_t rule, at::TensorList params, at::TensorList grads,
                                       at::TensorList states, at::IntArrayRef slot_kinds,
                                       at::IntArrayRef block_sizes, at::ArrayRef<double> hyper,
                                       at::IntArrayRef seeds, at::IntArrayRef flags, const char* op);

// The reference step of one parameter (ATen ops; any device); returns the blocks of quantized state
// that became non-finite.
int64_t reference_param_step(kernels::Rule rule, StepParam& p, double grad_scale);

// The reference kernels, as registered.
at::Tensor optim_step_reference(int64_t rule, at::TensorList params, at::TensorList grads, at::TensorList states,
                          at::IntArrayRef slot_kinds, at::IntArrayRef block_sizes, at::ArrayRef<double> hyper,
                          at::IntArrayRef seeds, at::IntArrayRef flags, double grad_scale, bool scalar_loop);
std::tuple<at::Tensor, at::Tensor> grad_stats_reference(at::TensorList grads, bool want_sumsq);

}  // namespace ops
}  // namespace lowbit
