// Options -> the step's named hyper-parameters (kernels::StepConfig) for each optimizer, whose ranges
// the hyper-parameter table defines and LowbitOptimizer::check_groups checks. What depends on the
// step (bias corrections, schedules) is derived where the step runs (kernels/common/step_config.h).
#include "optimizers.h"

#include <cmath>

namespace lowbit {
namespace optim {

namespace {

kernels::StepConfig with_betas(kernels::Rule rule, double b1, double b2, double eps, double wd, bool maximize) {
  kernels::StepConfig c;
  c.rule = rule;
  c.beta1 = b1;
  c.beta2 = b2;
  c.eps = eps;
  c.weight_decay = wd;
  c.maximize = maximize;
  return c;
}

template <typename O>
kernels::StepConfig adam_like(kernels::Rule rule, const O& o) {
  kernels::StepConfig c =
      with_betas(rule, std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.maximize());
  c.amsgrad = o.amsgrad();
  return c;
}

}  // namespace

kernels::StepConfig Adam::config(const torch::optim::OptimizerOptions& o) const {
  return adam_like(kernels::Rule::Adam, opts(o));
}

kernels::StepConfig AdamW::config(const torch::optim::OptimizerOptions& o) const {
  return adam_like(kernels::Rule::AdamW, opts(o));
}

kernels::StepConfig SGD::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  kernels::StepConfig c;
  c.rule = kernels::Rule::SGD;
  c.momentum = o.momentum();
  c.dampening = o.dampening();
  c.weight_decay = o.weight_decay();
  c.nesterov = o.nesterov();
  c.maximize = o.maximize();
  return c;
}

kernels::StepConfig Lion::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  return with_betas(kernels::Rule::Lion, std::get<0>(o.betas()), std::get<1>(o.betas()), 0.0, o.weight_decay(),
                    o.maximize());
}

kernels::StepConfig RMSprop::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  kernels::StepConfig c;
  c.rule = kernels::Rule::RMSprop;
  c.alpha = o.alpha();
  c.eps = o.eps();
  c.weight_decay = o.weight_decay();
  c.momentum = o.momentum();
  c.centered = o.centered();
  c.maximize = o.maximize();
  return c;
}

kernels::StepConfig Adagrad::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  kernels::StepConfig c;
  c.rule = kernels::Rule::Adagrad;
  c.eps = o.eps();
  c.weight_decay = o.weight_decay();
  c.lr_decay = o.lr_decay();
  c.maximize = o.maximize();
  return c;
}
double Adagrad::initial_state_value(const torch::optim::OptimizerOptions& o, int) const {
  return opts(o).initial_accumulator_value();
}
void Adagrad::check_options(const torch::optim::OptimizerOptions& o, const char* who) const {
  const double v = opts(o).initial_accumulator_value();
  TORCH_CHECK(std::isfinite(v) && v >= 0, who, ": initial_accumulator_value must be finite and >= 0, got ", v);
}

kernels::StepConfig AdEMAMix::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  kernels::StepConfig c = with_betas(kernels::Rule::AdEMAMix, std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(),
                                     o.weight_decay(), o.maximize());
  c.beta3 = std::get<2>(o.betas());
  c.alpha = o.alpha();
  c.t_alpha_beta3 = o.t_alpha_beta3();
  return c;
}

kernels::StepConfig LAMB::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  return with_betas(kernels::Rule::LAMB, std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                    o.maximize());
}

}  // namespace optim
}  // namespace lowbit
