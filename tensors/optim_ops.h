// The dispatcher ops of an optimizer step. The optimizers (optim/) call these and nothing below
// them: each backend registers its kernel, a Meta kernel gives shape inference (torch.compile), and
// the CompositeExplicitAutograd reference (ATen ops, driven by the same per-element rules as the
// kernels) serves every other device and is the oracle the kernels are tested against.
//
// Schema (TORCH_LIBRARY(lowbit); python/lowbit/optim.py builds these arguments for Python users):
//
//   grad_check(Tensor[] grads, int[] groups, int num_groups, bool want_sumsq)
//       -> (Tensor found_inf, Tensor sumsq)
//     One read of every gradient before a step, on their device: found_inf float32 [1] is 1 when
//     any element of any gradient is Inf or NaN (else 0); sumsq float64 [num_groups] adds, per
//     group (groups[i] is gradient i's), the squares of its gradients in a fixed order (0 unless
//     want_sumsq). Nothing is read back to the host.
//
//   optim_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] state, Tensor(c!)[] counters,
//               Tensor lr, *, str rule, str[] slots, int block_size=0, <hyper-parameters>,
//               int[] offsets=[], int[] rng_keys=[], int seed=0, bool stochastic_round=False,
//               Tensor? found_inf=None, Tensor? grad_sumsq=None, float max_grad_norm=0.0,
//               Tensor? grad_scale=None, Tensor? lamb_norms=None, bool scalar_loop=False) -> ()
//     One fused step of `rule` ("AdamW", ...) over N parameters, in place, all with the same state
//     layout: `slots` names the storage of each state slot ("none", "fp32", "bf16" or a
//     QuantFormat name such as "Dyn8Signed"; kernels/common/state_slots.h); `state` holds, per
//     parameter and in slot order, one tensor per dense slot and codes then absmax per quantized
//     slot. block_size: the quantization block (0: the first quantized slot's default).
//     Hyper-parameters by name, each with its default and range from one table
//     (LOWBIT_STEP_HYPER_PARAMETERS, kernels/common/step_config.h): beta1, beta2, beta3, eps,
//     weight_decay, alpha, momentum, dampening, lr_decay, t_alpha_beta3, nesterov, centered,
//     amsgrad, maximize; optim_hyper_parameters() -> str[] lists them. A value out of its range
//     is refused before anything is written.
//     What changes per step lives in tensors on the parameters' device and is read where the step
//     runs: counters[i] int64 [2] = (steps taken, state blocks that overflowed): the op takes step
//     t = counters[i][0] + 1, stores it, and adds the blocks of quantized state that became Inf or
//     NaN to counters[i][1]; lr float64/float32 [1]. Bias corrections and schedules are derived
//     from t and lr there (kernels/common/step_config.h), the same bits on every backend.
//     found_inf (float32 [1], nonzero = skip): the whole call does nothing, counters included.
//     grad_sumsq (float64 [1]) with max_grad_norm > 0: clip by the norm of the gradients it sums;
//     grad_scale (float32 [1]): the gradients are multiplied by the loss scale (AMP) and divided
//     by it here. lamb_norms (float64 [N, 2]): LAMB's sums of p^2 and r^2 over each whole
//     parameter (for a shard); the op computes them over what it sees when absent.
//     offsets[i]: the element of the whole parameter where params[i] starts (a multiple of
//     block_size with quantized state), so quantization blocks and stochastic-rounding indices
//     are those of the whole parameter: a block-aligned range of a flat shard steps exactly as the
//     same range of the whole parameter does. rng_keys[i], seed: the stochastic-rounding noise of
//     bf16 parameters (stochastic_round) is hash(step_seed(seed, t, rng_keys[i]), element index).
//     scalar_loop: the CPU kernel's scalar loop even where AVX-512 is present (tests).
//     Where these per-step tensors lie on the CPU the op checks their values against their ranges
//     (kernels/common/step_config.h: lr >= 0, grad_scale > 0, grad_sumsq and lamb_norms in
//     [0, inf], counters[i] = (steps in [0, 2^53 - 1), overflowed >= 0)) and refuses the call,
//     naming the value. On a GPU the step reads them there and never waits for the host, so the
//     host cannot see them: the optimizers derive them from checked options and the gradients;
//     a raw call on a GPU must keep them in range itself.
//     The op refuses a parameter that is not a leaf of the autograd graph and a gradient that
//     shares memory with anything the step writes, and bumps the version counter of every tensor
//     it writes (parameters, counters, state), as torch's in-place ops do.
//
//   optim_lamb_norms(<optim_step_'s arguments>) -> Tensor
//     LAMB's first pass alone, nothing written: float64 [N, 2], per parameter the sums of p^2 and
//     r^2 over the elements it is given (element i of a block into partial sum i mod 16, a block's
//     16 partials in order, the blocks' sums as kernels::lamb_add_block_sums adds them).
//
//   lamb_add_block_sums(Tensor block_sums, int[] first, int[] count) -> Tensor
//     block_sums float64 [blocks, 2] (per norm block: sum of p^2, sum of r^2, as optim_lamb_norms
//     sums a block) -> float64 [n, 2]: range i's blocks [first[i], first[i] + count[i]) added in
//     LAMB's order (kernels::lamb_add_block_sums), on the sums' device: a sharded parameter's whole
//     sums from its pieces' block sums without a trip to the host.
//
//   optim_step_reference_ / optim_lamb_norms_reference: the same, always the ATen reference.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "../kernels/common/state_slots.h"
#include "../kernels/common/step_config.h"
#include "../kernels/common/step_launch.h"
#include "../kernels/common/step_values.h"

#include "quant_format.h"

namespace lowbit {
namespace ops {

// The per-call values of optim_step_ / optim_lamb_norms besides the lists: given in StepArgs, kept
// as given in the checked StepCall.
struct StepScalars {
  at::Tensor lr;
  kernels::StepConfig config;
  uint64_t seed = 0;
  bool stochastic_round = false;
  std::optional<at::Tensor> found_inf, grad_sumsq, grad_scale, lamb_norms;
  double max_grad_norm = 0.0;
  bool scalar_loop = false;
};

// The arguments of optim_step_ / optim_lamb_norms as C++ values (what the optimizers fill in).
struct StepArgs : StepScalars {
  std::vector<at::Tensor> params, grads, state, counters;
  std::vector<kernels::SlotType> slots;  // one per slot index, up to kernels::kMaxSlots
  int64_t block_size = 0;
  std::vector<int64_t> offsets, rng_keys;  // empty: all 0
};

// One parameter of a checked call. Its tensors are borrowed from the StepArgs it was checked
// from, which outlive the call: no reference count is touched per tensor (over thousands of small
// tensors those atomic updates were a tenth of the host's time of a step).
struct StepParam {
  const at::Tensor* param = nullptr;
  const at::Tensor* grad = nullptr;
  const at::Tensor* counters = nullptr;
  std::array<const at::Tensor*, kernels::kMaxSlots> values{}, codes{}, absmax{};  // by slot: dense, or quantized
  at::ScalarType param_type = at::kFloat;
  at::ScalarType grad_type = at::kFloat;
  bool param_contiguous = true;
};

// A checked call: every list has the length its parameters need, every tensor the dtype, size and
// device the kernels assume; errors name the op, the argument and the parameter.
struct StepCall : StepScalars {
  kernels::SlotType slots[kernels::kMaxSlots];
  int num_slots = 0;  // 1 + the last slot that is not None
  int64_t block_size = 0;
  std::vector<StepParam> params;
  // Each parameter as the kernels take it (kernels/common/step_launch.h), from what check_step_call
  // read, so a backend touches no tensor's metadata again (over thousands of small tensors each
  // pass costs cache misses): addresses (what optim_step_ writes copy-on-write materialized; null
  // for meta tensors, and grad also where the gradient is not contiguous), numel, offset, rng_key.
  // Alignment is make_launches', once the addresses of contiguous copies are known.
  std::vector<kernels::StepParamRef> refs;
};

// A checked call as the kernels' launches: one StepLaunch per parameter dtype (its scalars on the
// call's device), over the contiguous parameters, or every parameter with `copy_strided` (read-only
// passes: contiguous copies); gradients that are not contiguous are copied. `strided` lists the
// parameters left to the reference. The launches point into this object: keep it while they run.
struct StepLaunches {
  std::vector<kernels::StepLaunch> launches;
  std::vector<std::vector<size_t>> index;  // per launch: the call's index of each of its parameters
  std::vector<size_t> strided;
  std::vector<std::vector<kernels::StepParamRef>> refs;
  std::vector<at::Tensor> copies;
};
void make_launches(const StepCall& c, bool copy_strided, StepLaunches* out);

// The returned call borrows a's tensors (StepParam): a must outlive it.
StepCall check_step_call(const StepArgs& a, const char* op);
// The named hyper-parameters against their ranges (LOWBIT_STEP_HYPER_PARAMETERS in step_config.h)
// and each other; errors begin with `who` and name the hyper-parameter and its value.
void check_step_config(const kernels::StepConfig& c, const char* who);
// "<who>: lr must be finite and >= 0, got <lr>" unless lr is in kernels::kLrRange.
void check_lr(double lr, const char* who);
// grad_check's arguments: as many group ids as gradients, each in [0, num_groups), every gradient
// float32 / bfloat16 / float16 on the device of the first.
void check_grad_check_args(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups);
// lamb_add_block_sums' arguments: float64 [blocks, 2] contiguous sums, as many firsts as counts,
// every range inside [0, blocks).
void check_lamb_add_block_sums_args(const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count);
// The op on the CPU (the reference of every other backend): the ranges added in LAMB's order.
at::Tensor lamb_add_block_sums_host(const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count);

// What the call's device scalars say (read on the host: the CPU kernel and the reference).
bool call_skipped(const StepCall& c);
float call_grad_multiplier(const StepCall& c);
double call_lr(const StepCall& c);

// Calls through the dispatcher: the kernel of the tensors' device (the reference where none is
// registered), or the reference itself.
// By value: an optimizer moves its argument lists in (thousands of tensors, no copy).
void optim_step(StepArgs a, bool reference = false);
at::Tensor optim_lamb_norms(StepArgs a, bool reference = false);
std::tuple<at::Tensor, at::Tensor> grad_check(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups,
                                              bool want_sumsq);
at::Tensor lamb_add_block_sums(const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count);

// The reference steps of the call's parameters `which` (none where the call is skipped): what a
// backend's kernels leave to it (parameters that are not contiguous), and the whole reference op.
void reference_steps(const StepCall& c, const std::vector<size_t>& which);
// Master weights (kernels/common/master_weight.h) in ATen ops, on any device: the fp32 master
// values of bf16 parameter b with correction c (int16: 32-bit mode, int8: 24-bit), shaped like b;
// and x (any float dtype, b's numel) split into b and c, written in place.
at::Tensor master_values(const at::Tensor& b, const at::Tensor& c);
void store_master(const at::Tensor& x, at::Tensor b, at::Tensor c);

}  // namespace ops
}  // namespace lowbit
