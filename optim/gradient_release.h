// Gradient release (DESIGN.md, memory floor): each parameter steps as soon as its gradient is final
// in backward() and the gradient is freed at once, so a model never holds all its gradients.
#pragma once

#include <memory>

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

// Attaches to every parameter of `opt` (a post-accumulate-grad hook on each leaf): when backward()
// has summed a parameter's gradient, the hook steps that parameter alone through
// LowbitOptimizer::step_parameters and drops its .grad. Each parameter's result is bit for bit the
// one opt.step() would give it after the whole backward; param groups, lr schedulers (set_lr between
// backward passes), state overrides, master weights and checkpoints work as before. Call nothing
// else: no opt.step(), no zero_grad().
//
// What needs every gradient at once cannot work: global-norm clipping (max_grad_norm > 0) is
// refused here. The non-finite check (skip_nonfinite) applies per parameter: a parameter whose
// gradient holds Inf or NaN is not stepped (its state untouched), the others are, and
// skipped_steps() counts one per parameter skipped.
//
// Gradient accumulation: set_accumulating(true) for every micro-batch but the last, so gradients
// add up in .grad as usual; set_accumulating(false) before the last backward() releases them.
class GradHooks;

class GradientRelease {
 public:
  explicit GradientRelease(LowbitOptimizer& opt);
  ~GradientRelease();  // removes the hooks
  GradientRelease(const GradientRelease&) = delete;
  GradientRelease& operator=(const GradientRelease&) = delete;

  void set_accumulating(bool on);
  bool accumulating() const;
  // Parameters stepped by the hooks so far (one per parameter per backward).
  int64_t released() const;

  struct Shared;  // what the hooks read: the optimizer, the switch, the count

 private:
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<GradHooks> hooks_;
};

}  // namespace optim
}  // namespace lowbit
