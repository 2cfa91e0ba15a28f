// The one way a step is put to the op: parameters (whole, a block-aligned fragment of one, or one
// state block of one) with their gradients, their state and where they sit in the whole parameter,
// bucketed into one lowbit::optim_step_ (or optim_lamb_norms) call per device and state layout;
// and the accounting around a step (steps skipped for non-finite gradients, state blocks that
// overflowed). LowbitOptimizer (and GradientRelease through it) and distributed/'s
// ShardedOptimizer build every step here. Not installed.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "../tensors/optim_ops.h"

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

// Views of a block-aligned range of each state slot of `st`, `len` elements from element `begin`,
// in the order the op takes them (dense values, or codes then absmax).
void append_state_range(const ParamState& st, int64_t begin, int64_t len, std::vector<at::Tensor>& out);

// The stochastic-rounding key of parameter `index` of group `group`: the same wherever it steps
// (one process, a rank's fragment of it), and saved implicitly by checkpoints (never change it).
inline int64_t param_rng_key(size_t group, size_t index) { return static_cast<int64_t>(group * 7919u + index); }

// What the op reads on a device from the gradients' pre-pass: found_inf (float32 [1], nonzero: skip
// the step) and the squared norm of the group's gradients (float64 [1]); either may be undefined
// where the step does without it.
struct GradChecks {
  at::Tensor found_inf, grad_sumsq;
};

// What every call of one parameter group shares (LowbitOptimizer::group_step builds it).
struct GroupStep {
  kernels::StepConfig config;
  CommonOptions common;
  uint64_t seed = 0;
  bool reference = false;    // the ATen reference instead of the fused kernels (tests)
  bool scalar_loop = false;  // the CPU kernel's scalar loop (tests)
  std::function<at::Tensor(at::Device)> lr;  // the group's lr, float64 [1] on a device
  std::function<GradChecks(at::Device)> grad_checks;  // set by the caller after its pre-pass
};

class StepCalls {
 public:
  // capacity: the most items one call will hold (its lists never grow by reallocation).
  StepCalls(GroupStep group, size_t capacity);

  // One item: `param` and `grad` (views of the same numel) with the whole of `state`; `offset` is
  // the item's first element in the whole parameter (stochastic rounding, block boundaries), and
  // `rng_key` the whole parameter's (param_rng_key). lamb_norms: the item's row of LAMB's norms
  // (float64 [1, 2]) where they come from elsewhere (a sharded step's all-reduce).
  void add(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, int64_t offset, int64_t rng_key,
           const at::Tensor& lamb_norms = {});
  // The same with elements [state_begin, state_begin + param.numel()) of `state` (state_begin a
  // multiple of its block size).
  void add_range(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, int64_t state_begin,
                 int64_t offset, int64_t rng_key);

  // One optim_step_ per bucket; the items are then gone.
  void step();
  // LAMB's norms of every item, in the order added: float64 [items, 2]; the items (of one state
  // layout on one device: one call) are then gone.
  at::Tensor lamb_norms();
  // LAMB's first pass of every call now (optim_lamb_norms), its norms kept for step(), which then
  // runs only the update. Returns whether a gradient holds a non-finite value: one makes its
  // parameter's sums NaN (the update direction m / (sqrt(v) + eps) is Inf / Inf or NaN), so only
  // the rare rows whose sums are not finite have their gradients read again (finite gradients
  // make such sums where the parameter is not finite, or with eps 0 where a gradient is 0: 0 / 0).
  // A call with such a row keeps the first pass in its step, as without this.
  bool lamb_first_pass();

 private:
  struct Bucket {
    at::Device device;
    std::vector<kernels::SlotType> slots;
    int64_t block_size;
    ops::StepArgs args;
    std::vector<at::Tensor> norms;
  };
  Bucket& bucket_for(const at::Tensor& param, const ParamState& state);
  ops::StepArgs& add_item(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, int64_t offset,
                          int64_t rng_key, const at::Tensor& lamb_norms);

  GroupStep group_;
  size_t capacity_;
  std::vector<Bucket> buckets_;
};

// Counts a step skipped for a non-finite gradient into `skipped` (int64 [1], created on the device
// of found_inf, float32 [1], at the first call) where found_inf is nonzero: added on the device, so
// a GPU step never waits for the host. On the CPU it also returns whether the step is skipped (the
// caller then builds no call); elsewhere false.
bool count_skipped(at::Tensor& skipped, const at::Tensor& found_inf);

// Blocks of `st` that overflowed to Inf/NaN since the last call (counters[1]; reading it waits for a
// GPU step), now marked reported, and the step count then: blocks 0 when none.
struct Overflow {
  int64_t blocks = 0, step = 0;
};
Overflow fresh_overflow(const ParamState& st);

}  // namespace optim
}  // namespace lowbit
