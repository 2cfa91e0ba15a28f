// Typed calls of the optimizer-step ops through the dispatcher (optim_ops.h), for the optimizers.
#include <ATen/core/dispatch/Dispatcher.h>

#include "optim_ops.h"

namespace lowbit {
namespace ops {

at::Tensor optim_step(int64_t rule, at::TensorList params, at::TensorList grads, at::TensorList states,
                at::IntArrayRef slot_kinds, at::IntArrayRef block_sizes, at::ArrayRef<double> hyper,
                at::IntArrayRef seeds, at::IntArrayRef flags, double grad_scale, bool scalar_loop, bool reference) {
  using Sig = at::Tensor(int64_t, at::TensorList, at::TensorList, at::TensorList, at::IntArrayRef, at::IntArrayRef,
                   at::ArrayRef<double>, at::IntArrayRef, at::IntArrayRef, double, bool);
  static const auto fused =
      c10::Dispatcher::singleton().findSchemaOrThrow("lowbit::optim_step_", "").typed<Sig>();
  static const auto oracle =
      c10::Dispatcher::singleton().findSchemaOrThrow("lowbit::optim_step_reference_", "").typed<Sig>();
  return (reference ? oracle : fused)
      .call(rule, params, grads, states, slot_kinds, block_sizes, hyper, seeds, flags, grad_scale, scalar_loop);
}

std::tuple<at::Tensor, at::Tensor> grad_stats(at::TensorList grads, bool want_sumsq) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("lowbit::grad_stats", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(at::TensorList, bool)>();
  return op.call(grads, want_sumsq);
}

}  // namespace ops
}  // namespace lowbit
