// Options -> update-rule hyper-parameters for each optimizer, and their argument checks (with
// torch::optim's messages). Derived quantities are computed in double and rounded once.
#include "optimizers.h"

#include <cmath>

namespace lowbit {
namespace optim {

namespace {

void check_betas(double b1, double b2) {
  TORCH_CHECK(0 <= b1 && b1 < 1, "Invalid beta parameter at index 0: ", b1);
  TORCH_CHECK(0 <= b2 && b2 < 1, "Invalid beta parameter at index 1: ", b2);
}

// The Adam family's shared part: lr, betas with their complements (rounded from double), eps,
// weight decay, maximize, and the bias corrections of step t.
kernels::Hyper adam_family(double lr, double b1, double b2, double eps, double wd, bool maximize, int64_t t) {
  kernels::Hyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(b1);
  h.beta2 = static_cast<float>(b2);
  h.one_minus_beta1 = static_cast<float>(1 - b1);
  h.one_minus_beta2 = static_cast<float>(1 - b2);
  h.eps = static_cast<float>(eps);
  h.weight_decay = static_cast<float>(wd);
  h.maximize = maximize;
  const double bc1 = 1 - std::pow(b1, static_cast<double>(t));
  h.inv_bias1 = static_cast<float>(1 / bc1);
  h.step_size = static_cast<float>(lr / bc1);
  h.inv_bias2_sqrt = static_cast<float>(1 / std::sqrt(1 - std::pow(b2, static_cast<double>(t))));
  h.decay = static_cast<float>(1 - lr * wd);
  return h;
}

template <typename O>
kernels::Hyper adam_like(const O& o, int64_t t) {
  kernels::Hyper h = adam_family(o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
                                 o.maximize(), t);
  h.amsgrad = o.amsgrad();
  return h;
}

}  // namespace

kernels::Hyper Adam::hyper(const torch::optim::OptimizerOptions& o, int64_t t) const { return adam_like(opts(o), t); }
void Adam::validate(const AdamOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
}

kernels::Hyper AdamW::hyper(const torch::optim::OptimizerOptions& o, int64_t t) const { return adam_like(opts(o), t); }
void AdamW::validate(const AdamWOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
}

kernels::Hyper SGD::hyper(const torch::optim::OptimizerOptions& oo, int64_t t) const {
  const auto& o = opts(oo);
  kernels::Hyper h;
  h.lr = static_cast<float>(o.lr());
  h.momentum = static_cast<float>(o.momentum());
  h.dampening = static_cast<float>(o.dampening());
  h.one_minus_dampening = static_cast<float>(1 - o.dampening());
  h.weight_decay = static_cast<float>(o.weight_decay());
  h.nesterov = o.nesterov();
  h.maximize = o.maximize();
  h.first_step = t == 1;
  return h;
}
void SGD::validate(const SGDOptions& o) {
  TORCH_CHECK(o.momentum() >= 0, "Invalid momentum value: ", o.momentum());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
              "Nesterov momentum requires a momentum and zero dampening");
}

kernels::Hyper Lion::hyper(const torch::optim::OptimizerOptions& oo, int64_t) const {
  const auto& o = opts(oo);
  kernels::Hyper h;
  h.lr = static_cast<float>(o.lr());
  h.beta1 = static_cast<float>(std::get<0>(o.betas()));
  h.beta2 = static_cast<float>(std::get<1>(o.betas()));
  h.one_minus_beta1 = static_cast<float>(1 - std::get<0>(o.betas()));
  h.one_minus_beta2 = static_cast<float>(1 - std::get<1>(o.betas()));
  h.weight_decay = static_cast<float>(o.weight_decay());
  h.decay = static_cast<float>(1 - o.lr() * o.weight_decay());
  h.maximize = o.maximize();
  return h;
}
void Lion::validate(const LionOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
}

kernels::Hyper RMSprop::hyper(const torch::optim::OptimizerOptions& oo, int64_t) const {
  const auto& o = opts(oo);
  kernels::Hyper h;
  h.lr = static_cast<float>(o.lr());
  h.alpha = static_cast<float>(o.alpha());
  h.one_minus_alpha = static_cast<float>(1 - o.alpha());
  h.eps = static_cast<float>(o.eps());
  h.weight_decay = static_cast<float>(o.weight_decay());
  h.momentum = static_cast<float>(o.momentum());
  h.centered = o.centered();
  h.maximize = o.maximize();
  return h;
}
bool RMSprop::slot_used(const torch::optim::OptimizerOptions& oo, int slot) const {
  const auto& o = opts(oo);
  return slot == 0 || (slot == 1 && o.momentum() > 0) || (slot == 2 && o.centered());
}
void RMSprop::validate(const RMSpropOptions& o) {
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.momentum() >= 0, "Invalid momentum value: ", o.momentum());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(o.alpha() >= 0, "Invalid alpha value: ", o.alpha());
}

kernels::Hyper Adagrad::hyper(const torch::optim::OptimizerOptions& oo, int64_t t) const {
  const auto& o = opts(oo);
  kernels::Hyper h;
  h.lr = static_cast<float>(o.lr());
  h.eps = static_cast<float>(o.eps());
  h.weight_decay = static_cast<float>(o.weight_decay());
  h.maximize = o.maximize();
  h.step_size = static_cast<float>(o.lr() / (1 + static_cast<double>(t - 1) * o.lr_decay()));
  return h;
}
double Adagrad::initial_state_value(const torch::optim::OptimizerOptions& o, int) const {
  return opts(o).initial_accumulator_value();
}
void Adagrad::validate(const AdagradOptions& o) {
  TORCH_CHECK(o.lr_decay() >= 0, "Invalid lr_decay value: ", o.lr_decay());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
  TORCH_CHECK(o.initial_accumulator_value() >= 0, "Invalid initial_accumulator_value value: ",
              o.initial_accumulator_value());
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
}

kernels::Hyper AdEMAMix::hyper(const torch::optim::OptimizerOptions& oo, int64_t t) const {
  const auto& o = opts(oo);
  const double b1 = std::get<0>(o.betas()), b3 = std::get<2>(o.betas());
  kernels::Hyper h = adam_family(o.lr(), b1, std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.maximize(), t);
  double alpha = o.alpha(), beta3 = b3;
  if (o.t_alpha_beta3() > 0) {
    // The paper's warm-up: alpha rises linearly; beta3 follows the schedule that makes the slow
    // EMA's half-life grow linearly from beta1's to beta3's.
    const double frac = std::min(1.0, static_cast<double>(t) / static_cast<double>(o.t_alpha_beta3()));
    alpha = frac * o.alpha();
    const double lb1 = std::log(b1), lb3 = std::log(b3);
    beta3 = std::exp(lb1 * lb3 / ((1 - frac) * lb3 + frac * lb1));
  }
  h.alpha = static_cast<float>(alpha);
  h.beta3 = static_cast<float>(std::min(beta3, b3));
  h.one_minus_beta3 = static_cast<float>(1 - std::min(beta3, b3));
  return h;
}
void AdEMAMix::validate(const AdEMAMixOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(0 <= std::get<2>(o.betas()) && std::get<2>(o.betas()) < 1, "Invalid beta parameter at index 2: ",
              std::get<2>(o.betas()));
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.alpha() >= 0, "Invalid alpha value: ", o.alpha());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
}

kernels::Hyper LAMB::hyper(const torch::optim::OptimizerOptions& oo, int64_t t) const {
  const auto& o = opts(oo);
  return adam_family(o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), o.maximize(),
                     t);
}
void LAMB::validate(const LAMBOptions& o) {
  check_betas(std::get<0>(o.betas()), std::get<1>(o.betas()));
  TORCH_CHECK(o.eps() >= 0, "Invalid epsilon value: ", o.eps());
  TORCH_CHECK(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay());
}

}  // namespace optim
}  // namespace lowbit
