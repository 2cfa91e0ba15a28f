// CPU kernels of lowbit::optim_step_, optim_lamb_norms and grad_check (optim_ops.h): checks, the
// per-step values derived from the call's counters and scalars, then the fused loops of
// kernels/cpu. A parameter that is not contiguous takes the reference path.
#include <torch/library.h>

#include <algorithm>

#include <lowbit/kernels/cpu/grad_stats_cpu.h>
#include <lowbit/kernels/cpu/optim_step_cpu.h>

#include "blockwise_ops.h"
#include "optim_ops.h"
#include "optim_step_boxed.h"

namespace lowbit {
namespace ops {
namespace {

constexpr const char* kOp = "lowbit::optim_step_";

void check_cpu(const at::Tensor& t, const char* what, size_t i) {
  TORCH_CHECK(t.device().is_cpu(), kOp, ": the ", what, " of parameter ", i, " is on ", t.device(),
              "; the CPU kernel takes CPU tensors only");
}

// The kernel's view of one parameter at step t: `param` and `grad` are its data (the addresses
// check_step_call took, or contiguous copies).
kernels::ParamTask make_task(const StepCall& c, const StepParam& p, void* param, const void* grad, int64_t t,
                             double lr) {
  kernels::ParamTask task;
  task.param = param;
  task.param_type = elem_type(p.param_type);
  task.grad = grad;
  task.grad_type = elem_type(p.grad_type);
  task.numel = p.numel;
  task.offset = p.offset;
  task.block_size = c.block_size;
  task.hyper = kernels::derive_hyper(c.config, t, lr);
  task.stochastic_round = c.stochastic_round && p.param_type == at::kBFloat16;
  task.seed = kernels::step_seed(c.seed, t, p.rng_key);
  task.num_slots = std::min(c.num_slots, kernels::kMomentSlots);
  for (int k = 0; k < c.num_slots; ++k) {
    kernels::StateSlotRef& r = task.slots[k];
    r.storage = c.slots[k].storage;
    r.format = c.slots[k].format;
    if (r.storage == kernels::SlotStorage::Quant) {
      r.codes = static_cast<uint8_t*>(p.state_data[k]);
      r.absmax = p.absmax_data[k];
    } else if (r.storage != kernels::SlotStorage::None) {
      r.values = p.state_data[k];
    }
  }
  return task;
}

// The parameters of a checked CPU call as kernel tasks; those that are not contiguous are listed
// apart (the reference steps them).
struct CpuCall {
  StepCall call;
  std::vector<at::Tensor> copies;  // contiguous copies where needed, kept alive
  std::vector<kernels::ParamTask> tasks;
  std::vector<size_t> task_param, strided;
  std::vector<int64_t> steps;
  float grad_mult = 1.0f;
  kernels::OptimStep kernel;
};

void prepare(CpuCall& cc, bool for_norms) {
  StepCall& c = cc.call;
  cc.grad_mult = call_grad_multiplier(c);
  const double lr = call_lr(c);
  for (size_t i = 0; i < c.params.size(); ++i) {
    StepParam& p = c.params[i];
    check_cpu(*p.param, "value", i);
    const int64_t t = p.counters_data[0] + 1;
    cc.steps.push_back(t);
    const bool contiguous = p.param_contiguous;
    if (!contiguous && !for_norms) {
      cc.strided.push_back(i);
      continue;
    }
    // For the step the parameter is contiguous (strided ones went to the reference above); LAMB's
    // read-only pass takes a contiguous copy of any other.
    const auto data = [&](const at::Tensor& t, const void* taken) -> void* {
      if (taken || t.numel() == 0) return const_cast<void*>(taken);
      cc.copies.push_back(t.contiguous());
      return cc.copies.back().data_ptr();
    };
    void* param = contiguous ? p.param_data : data(*p.param, nullptr);
    const void* grad = data(*p.grad, p.grad_data);
    cc.tasks.push_back(make_task(c, p, param, grad, t, lr));
    cc.task_param.push_back(i);
  }
  cc.kernel.rule = c.config.rule;
  cc.kernel.tasks = cc.tasks.data();
  cc.kernel.num_tasks = static_cast<int64_t>(cc.tasks.size());
  cc.kernel.grad_scale = cc.grad_mult;
  cc.kernel.vector_path = !c.scalar_loop;
}

void step_cpu(const StepArgs& args) {
  CpuCall cc;
  cc.call = check_step_call(args, kOp);
  StepCall& c = cc.call;
  if (c.params.empty()) return;
  if (c.found_inf) TORCH_CHECK(c.found_inf->device().is_cpu(), kOp, ": found_inf must be on the CPU here");
  if (call_skipped(c)) return;
  prepare(cc, false);
  if (c.config.rule == kernels::Rule::LAMB && c.lamb_norms) {
    const at::Tensor norms = c.lamb_norms->contiguous();
    const double* nd = norms.data_ptr<double>();
    for (size_t k = 0; k < cc.tasks.size(); ++k)
      cc.tasks[k].hyper.trust = kernels::lamb_trust(nd[2 * cc.task_param[k]], nd[2 * cc.task_param[k] + 1]);
    cc.kernel.trust_given = true;
  }
  std::vector<int64_t> nonfinite(cc.tasks.size(), 0);
  cc.kernel.nonfinite_blocks = nonfinite.data();
  kernels::optim_step_cpu(cc.kernel);
  for (size_t k = 0; k < cc.tasks.size(); ++k) {
    int64_t* counters = c.params[cc.task_param[k]].counters_data;
    counters[0] = cc.steps[cc.task_param[k]];
    counters[1] += nonfinite[k];
  }
  for (size_t i : cc.strided) {
    StepParam& p = c.params[i];
    const int64_t t = cc.steps[i];
    float trust = 1.0f;
    if (c.config.rule == kernels::Rule::LAMB) {
      if (c.lamb_norms) {
        trust = kernels::lamb_trust((*c.lamb_norms)[i][0].item<double>(), (*c.lamb_norms)[i][1].item<double>());
      } else {
        const auto sums = reference_lamb_sums(c, p, t, cc.grad_mult);
        trust = kernels::lamb_trust(sums[0], sums[1]);
      }
    }
    const int64_t bad = reference_param_step(c, p, t, cc.grad_mult, trust);
    int64_t* counters = p.counters->data_ptr<int64_t>();
    counters[0] = t;
    counters[1] += bad;
  }
}

at::Tensor lamb_norms_cpu(const StepArgs& args) {
  CpuCall cc;
  cc.call = check_step_call(args, "lowbit::optim_lamb_norms");
  const int64_t n = static_cast<int64_t>(cc.call.params.size());
  at::Tensor out = at::zeros({n, 2}, at::kDouble);
  if (n == 0) return out;
  prepare(cc, true);
  kernels::lamb_norms_cpu(cc.kernel, out.data_ptr<double>());
  return out;
}

std::tuple<at::Tensor, at::Tensor> grad_check_cpu(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups,
                                                  bool want_sumsq) {
  check_grad_check_args(grads, groups, num_groups);
  std::vector<at::Tensor> keep;
  std::vector<kernels::GradRef> refs;
  for (size_t i = 0; i < grads.size(); ++i) {
    TORCH_CHECK(grads[i].device().is_cpu(), "lowbit::grad_check: gradient ", i, " is on ", grads[i].device(),
                "; the CPU kernel takes CPU tensors only");
    if (!grads[i].is_contiguous()) keep.push_back(grads[i].contiguous());
    const at::Tensor& c = grads[i].is_contiguous() ? grads[i] : keep.back();
    refs.push_back({c.const_data_ptr(), elem_type(grads[i].scalar_type()), c.numel()});
  }
  const int64_t n = static_cast<int64_t>(refs.size());
  std::vector<uint8_t> finite(n);
  std::vector<double> sumsq(n, 0.0);
  kernels::grad_stats_cpu(refs.data(), n, want_sumsq, finite.data(), sumsq.data());
  at::Tensor found_inf = at::zeros({1}, at::kFloat), group_sumsq = at::zeros({num_groups}, at::kDouble);
  double* gs = group_sumsq.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) {
    if (!finite[i]) found_inf.data_ptr<float>()[0] = 1.0f;
    gs[groups[i]] += sumsq[i];  // gradients in order within each group
  }
  return {found_inf, group_sumsq};
}

}  // namespace
}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CPU, m) {
  using namespace lowbit::ops;
  m.impl("optim_step_", torch::CppFunction::makeFromBoxedFunction<&boxed_step<&step_cpu>>());
  m.impl("optim_lamb_norms", torch::CppFunction::makeFromBoxedFunction<&boxed_lamb_norms<&lamb_norms_cpu>>());
  m.impl("grad_check", &grad_check_cpu);
  m.impl("lamb_add_block_sums", &lamb_add_block_sums_host);
}
