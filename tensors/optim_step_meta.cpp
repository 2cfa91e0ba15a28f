// Meta kernels of the optimizer-step ops (optim_ops.h): the same argument checks, no data touched,
// and the shapes of what the ops return, for shape inference, FakeTensor and torch.compile.
#include <torch/library.h>

#include "optim_ops.h"
#include "optim_step_boxed.h"

namespace lowbit {
namespace ops {
namespace {

void step_meta(const StepArgs& args) { check_step_call(args, "lowbit::optim_step_"); }

at::Tensor lamb_norms_meta(const StepArgs& args) {
  const StepCall c = check_step_call(args, "lowbit::optim_lamb_norms");
  return at::empty({static_cast<int64_t>(c.params.size()), 2}, at::TensorOptions().dtype(at::kDouble).device(at::kMeta));
}

std::tuple<at::Tensor, at::Tensor> grad_check_meta(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups,
                                                   bool want_sumsq) {
  check_grad_check_args(grads, groups, num_groups);
  const auto meta = at::TensorOptions().device(at::kMeta);
  return {at::empty({1}, meta.dtype(at::kFloat)), at::empty({num_groups}, meta.dtype(at::kDouble))};
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, Meta, m) {
  using namespace lowbit::ops;
  m.impl("optim_step_", torch::CppFunction::makeFromBoxedFunction<&boxed_step<&step_meta>>());
  m.impl("optim_step_reference_", torch::CppFunction::makeFromBoxedFunction<&boxed_step<&step_meta>>());
  m.impl("optim_lamb_norms", torch::CppFunction::makeFromBoxedFunction<&boxed_lamb_norms<&lamb_norms_meta>>());
  m.impl("optim_lamb_norms_reference",
         torch::CppFunction::makeFromBoxedFunction<&boxed_lamb_norms<&lamb_norms_meta>>());
  m.impl("grad_check", &grad_check_meta);
  m.impl("lamb_add_block_sums", [](const at::Tensor& block_sums, at::IntArrayRef first, at::IntArrayRef count) {
    check_lamb_add_block_sums_args(block_sums, first, count);
    return at::empty({static_cast<int64_t>(first.size()), 2}, block_sums.options());
  });
}
