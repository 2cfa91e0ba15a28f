// optim_step_ and optim_lamb_norms have one schema (optim_ops.h) of 32 named arguments. Every
// backend registers them as boxed kernels that convert the dispatcher's stack to StepArgs here,
// once, instead of repeating the 32-argument signature per backend.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

#include "optim_ops.h"

namespace lowbit {
namespace ops {

// The arguments of both ops, after the op name (TORCH_LIBRARY in ops_schema.cpp); the named
// hyper-parameters and their defaults come from LOWBIT_STEP_HYPER_PARAMETERS (step_config.h).
std::string step_arguments();
// Their names, in the table's order (the op lowbit::optim_hyper_parameters returns them).
std::vector<std::string> hyper_parameter_names();

// The call's arguments, taken off the stack (the stack then holds nothing).
StepArgs pop_step_args(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// A boxed kernel of optim_step_ (fn(args) does the step) or optim_lamb_norms (fn returns the sums).
template <void (*fn)(const StepArgs&)>
void boxed_step(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fn(pop_step_args(op, stack));
}
template <at::Tensor (*fn)(const StepArgs&)>
void boxed_lamb_norms(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::Tensor out = fn(pop_step_args(op, stack));
  torch::jit::push(*stack, std::move(out));
}

}  // namespace ops
}  // namespace lowbit
