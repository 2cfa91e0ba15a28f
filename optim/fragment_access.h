// What distributed/ (ShardedOptimizer, fragment checkpoints) needs from a LowbitOptimizer to step a
// block-aligned range of a parameter itself: what a group's step shares (the rest of the step is
// step_calls.h's), the state a range gets, and the state the optimizer saves (per-parameter state,
// the stochastic-rounding seed, skipped steps). Not installed.
#pragma once

#include "lowbit_optimizer.h"
#include "state_layout.h"
#include "step_calls.h"

namespace lowbit {
namespace optim {

struct FragmentAccess {
  using O = LowbitOptimizer;
  // What every op call of the group's step shares (step_calls.h: a range of a parameter steps
  // through StepCalls as a whole one does).
  static GroupStep group_step(O& o, size_t group) { return o.group_step(group); }

  // The layout of `p`'s state (decided by its whole numel, and any override_state_format), with
  // the master-weight correction slot where the group has one: make_state's layout.
  static StateLayout layout(const O& o, size_t group, const at::Tensor& p) {
    return o.layout_of(p, o.param_groups_[group].options());
  }
  // A fresh state for `numel` elements of `p` starting at a block boundary; slot k from values[k] if given.
  static ParamState make_state(const O& o, size_t group, const at::Tensor& p, int64_t numel,
                               const std::vector<at::Tensor>& values = {}) {
    return o.make_state(p, o.param_groups_[group].options(), values, numel);
  }

  static uint64_t seed(const O& o) { return o.seed_; }
  static void set_seed(O& o, uint64_t seed) {
    o.seed_ = seed;
    o.state_changed();
  }

  // Replacing the optimizer's own state of `p` (checkpoints; state_of reads it).
  static void set_state(O& o, const at::Tensor& p, ParamState st) {
    o.states_[p.unsafeGetTensorImpl()] = std::move(st);
    o.state_changed();
  }
  static void clear_state(O& o, const at::Tensor& p) {
    o.states_.erase(p.unsafeGetTensorImpl());
    o.state_changed();
  }
  static void set_skipped(O& o, int64_t n) {
    o.skipped_ = at::Tensor();
    o.skipped_loaded_ = n;
    o.state_changed();
  }
};

}  // namespace optim
}  // namespace lowbit
