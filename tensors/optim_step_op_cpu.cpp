// CPU kernels of lowbit::optim_step_, optim_lamb_norms and grad_check (optim_ops.h): checks, then
// the call's launches (make_launches) to the fused loops of kernels/cpu, which derive the per-step
// values from the counters and scalars as the GPU's do. A parameter that is not contiguous takes
// the reference path.
#include <torch/library.h>

#include <algorithm>

#include "../kernels/cpu/grad_stats_cpu.h"
#include "../kernels/cpu/optim_step_cpu.h"

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

// LAMB's whole-parameter sums of a launch's parameters (a call's rows, in the launch's order).
std::vector<double> launch_norms(const at::Tensor& norms, const std::vector<size_t>& index) {
  const at::Tensor n = norms.contiguous();
  const double* d = n.const_data_ptr<double>();
  std::vector<double> out;
  for (size_t i : index) out.insert(out.end(), {d[2 * i], d[2 * i + 1]});
  return out;
}

void step_cpu(const StepArgs& args) {
  const StepCall c = check_step_call(args, kOp);
  if (c.params.empty()) return;
  if (c.found_inf) TORCH_CHECK(c.found_inf->device().is_cpu(), kOp, ": found_inf must be on the CPU here");
  for (size_t i = 0; i < c.params.size(); ++i) check_cpu(*c.params[i].param, "value", i);
  if (call_skipped(c)) return;
  StepLaunches l;
  make_launches(c, false, &l);
  for (size_t d = 0; d < l.launches.size(); ++d) {
    kernels::StepLaunch& s = l.launches[d];
    std::vector<double> norms;
    if (c.config.rule == kernels::Rule::LAMB && c.lamb_norms) {
      norms = launch_norms(*c.lamb_norms, l.index[d]);
      s.lamb_norms = norms.data();
    }
    kernels::optim_step_cpu(s);
  }
  reference_steps(c, l.strided);  // the parameters that are not contiguous
}

at::Tensor lamb_norms_cpu(const StepArgs& args) {
  const StepCall c = check_step_call(args, "lowbit::optim_lamb_norms");
  const int64_t n = static_cast<int64_t>(c.params.size());
  at::Tensor out = at::zeros({n, 2}, at::kDouble);
  if (n == 0) return out;
  for (size_t i = 0; i < c.params.size(); ++i) check_cpu(*c.params[i].param, "value", i);
  StepLaunches l;
  make_launches(c, true, &l);
  double* o = out.data_ptr<double>();
  for (size_t d = 0; d < l.launches.size(); ++d) {
    std::vector<double> part(2 * l.index[d].size());
    kernels::lamb_norms_cpu(l.launches[d], part.data());
    for (size_t k = 0; k < l.index[d].size(); ++k) {
      o[2 * l.index[d][k]] = part[2 * k];
      o[2 * l.index[d][k] + 1] = part[2 * k + 1];
    }
  }
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
