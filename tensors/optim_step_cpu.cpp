// CPU kernels of lowbit::optim_step_ and grad_stats (optim_ops.h): argument checks, then the fused
// loops of kernels/cpu. A parameter that is not contiguous takes the reference path.
#include <torch/library.h>

#include <lowbit/kernels/cpu/grad_stats_cpu.h>
#include <lowbit/kernels/cpu/optim_step_cpu.h>

#include "blockwise_ops.h"
#include "optim_ops.h"

namespace lowbit {
namespace ops {
namespace {

void check_cpu(const at::Tensor& t, const char* op, const char* what, size_t i) {
  TORCH_CHECK(t.device().is_cpu(), op, ": the ", what, " of parameter ", i, " is on ", t.device(),
              "; the CPU kernel takes CPU tensors only");
}

at::Tensor optim_step_cpu(int64_t rule, at::TensorList params, at::TensorList grads, at::TensorList states,
                    at::IntArrayRef slot_kinds, at::IntArrayRef block_sizes, at::ArrayRef<double> hyper,
                    at::IntArrayRef seeds, at::IntArrayRef flags, double grad_scale, bool scalar_loop) {
  const char* op = "lowbit::optim_step_";
  std::vector<StepParam> ps =
      parse_step_args(rule, params, grads, states, slot_kinds, block_sizes, hyper, seeds, flags, op);
  at::Tensor nonfinite = at::zeros({static_cast<int64_t>(ps.size())}, at::kLong);
  int64_t* out = nonfinite.data_ptr<int64_t>();
  std::vector<kernels::ParamTask> tasks;
  std::vector<size_t> task_param;  // parameter index of each task
  std::vector<at::Tensor> grads_contiguous;
  grads_contiguous.reserve(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    StepParam& sp = ps[i];
    check_cpu(sp.param, op, "value", i);
    check_cpu(sp.grad, op, "gradient", i);
    if (!sp.param.is_contiguous()) {
      out[i] = reference_param_step(static_cast<kernels::Rule>(rule), sp, grad_scale);
      continue;
    }
    grads_contiguous.push_back(sp.grad.contiguous());
    const at::Tensor& g = grads_contiguous.back();
    kernels::ParamTask t;
    t.param = sp.param.data_ptr();
    t.param_type = elem_type(sp.param.scalar_type());
    t.grad = g.data_ptr();
    t.grad_type = elem_type(g.scalar_type());
    t.numel = sp.param.numel();
    t.block_size = sp.block_size;
    t.hyper = sp.hyper;
    t.stochastic_round = sp.stochastic_round;
    t.seed = sp.seed;
    t.num_slots = sp.num_slots;
    for (int k = 0; k < sp.num_slots; ++k) {
      const StepSlot& s = sp.slots[k];
      kernels::StateSlotRef& r = t.slots[k];
      if (s.kind >= kSlotQuantized) {
        r.storage = kernels::SlotStorage::Quant;
        r.codes = s.codes.data_ptr<uint8_t>();
        r.absmax = s.absmax.data_ptr<float>();
        r.format = s.format;
      } else if (s.kind != kSlotNone) {
        r.storage = s.kind == kSlotBF16 ? kernels::SlotStorage::BF16 : kernels::SlotStorage::F32;
        r.values = s.values.data_ptr();
      }
    }
    tasks.push_back(t);
    task_param.push_back(i);
  }
  std::vector<int64_t> task_nonfinite(tasks.size(), 0);
  kernels::OptimStep step;
  step.rule = static_cast<kernels::Rule>(rule);
  step.tasks = tasks.data();
  step.num_tasks = static_cast<int64_t>(tasks.size());
  step.grad_scale = static_cast<float>(grad_scale);
  step.vector_path = !scalar_loop;
  step.nonfinite_blocks = task_nonfinite.data();
  kernels::optim_step_cpu(step);
  for (size_t k = 0; k < tasks.size(); ++k) out[task_param[k]] = task_nonfinite[k];
  return nonfinite;
}

std::tuple<at::Tensor, at::Tensor> grad_stats_cpu(at::TensorList grads, bool want_sumsq) {
  std::vector<at::Tensor> keep;
  std::vector<kernels::GradRef> refs;
  for (size_t i = 0; i < grads.size(); ++i) {
    check_cpu(grads[i], "lowbit::grad_stats", "gradient", i);
    const auto t = grads[i].scalar_type();
    TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, "lowbit::grad_stats: gradient ", i,
                " has dtype ", t, "; supported: float32, bfloat16, float16");
    keep.push_back(grads[i].contiguous());
    refs.push_back({keep.back().data_ptr(), elem_type(t), keep.back().numel()});
  }
  const int64_t n = static_cast<int64_t>(refs.size());
  at::Tensor finite = at::empty({n}, at::kByte), sumsq = at::zeros({n}, at::kDouble);
  kernels::grad_stats_cpu(refs.data(), n, want_sumsq, finite.data_ptr<uint8_t>(), sumsq.data_ptr<double>());
  return {finite.to(at::kBool), sumsq};
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CPU, m) {
  m.impl("optim_step_", &lowbit::ops::optim_step_cpu);
  m.impl("grad_stats", &lowbit::ops::grad_stats_cpu);
}
