// Options -> the step's named hyper-parameters (kernels::StepConfig) for each optimizer, and their
// argument checks (with torch::optim's messages). What depends on the step (bias corrections,
// schedules) is derived where the step runs (kernels/common/step_config.h).
#include "optimizers.h"

#include <cmath>

namespace lowbit {
namespace optim {

namespace {

// NaN fails every comparison, but Inf passes ">= 0": hyper-parameters must be finite too.
bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0; }

void check_betas(double b1, double b2) {
  TORCH_CHECK(0 <= b1 && b1 < 1, "Invalid beta parameter at index 0: ", b1);
  TORCH_CHECK(0 <= b2 && b2 < 1, "Invalid beta parameter at index 1: ", b2);
}

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
void Adam::validate(const AdamOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(finite_nonneg(o.eps()), "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
}

kernels::StepConfig AdamW::config(const torch::optim::OptimizerOptions& o) const {
  return adam_like(kernels::Rule::AdamW, opts(o));
}
void AdamW::validate(const AdamWOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(finite_nonneg(o.eps()), "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
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
void SGD::validate(const SGDOptions& o) {
  TORCH_CHECK(finite_nonneg(o.momentum()), "Invalid momentum value: ", o.momentum());
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(std::isfinite(o.dampening()), "Invalid dampening value: ", o.dampening());
  TORCH_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
              "Nesterov momentum requires a momentum and zero dampening");
}

kernels::StepConfig Lion::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  return with_betas(kernels::Rule::Lion, std::get<0>(o.betas()), std::get<1>(o.betas()), 0.0, o.weight_decay(),
                    o.maximize());
}
void Lion::validate(const LionOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
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
void RMSprop::validate(const RMSpropOptions& o) {
  TORCH_CHECK(finite_nonneg(o.eps()), "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(finite_nonneg(o.momentum()), "Invalid momentum value: ", o.momentum());
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(finite_nonneg(o.alpha()), "Invalid alpha value: ", o.alpha());
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
void Adagrad::validate(const AdagradOptions& o) {
  TORCH_CHECK(finite_nonneg(o.lr_decay()), "Invalid lr_decay value: ", o.lr_decay());
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(finite_nonneg(o.initial_accumulator_value()), "Invalid initial_accumulator_value value: ",
              o.initial_accumulator_value());
  TORCH_CHECK(finite_nonneg(o.eps()), "Invalid epsilon value: ", o.eps());
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
void AdEMAMix::validate(const AdEMAMixOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(0 <= std::get<2>(o.betas()) && std::get<2>(o.betas()) < 1, "Invalid beta parameter at index 2: ",
              std::get<2>(o.betas()));
  TORCH_CHECK(finite_nonneg(o.eps()), "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(finite_nonneg(o.alpha()), "Invalid alpha value: ", o.alpha());
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(o.t_alpha_beta3() >= 0, "Invalid t_alpha_beta3 value: ", o.t_alpha_beta3());
}

kernels::StepConfig LAMB::config(const torch::optim::OptimizerOptions& oo) const {
  const auto& o = opts(oo);
  return with_betas(kernels::Rule::LAMB, std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                    o.maximize());
}
void LAMB::validate(const LAMBOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(finite_nonneg(o.eps()), "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(finite_nonneg(o.weight_decay()), "Invalid weight_decay value: ", o.weight_decay());
}

}  // namespace optim
}  // namespace lowbit
