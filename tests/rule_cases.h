// Every optimizer with the options that exercise the most of its rule, as a factory and as the
// op's StepConfig: shared by the tests that compare paths (host/device, shards, CPU/CUDA).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <lowbit/lowbit.h>

namespace lowbit_test {

using lowbit::StateFormat;
namespace lo = lowbit::optim;
namespace lk = lowbit::kernels;

// Every rule with the options that give it the most slots and branches, as optimizer and config.
struct RuleCase {
  const char* name;
  std::function<std::unique_ptr<lo::LowbitOptimizer>(std::vector<at::Tensor>&, StateFormat, bool sr)> make;
  lk::StepConfig config;
};

inline lk::StepConfig cfg(lk::Rule r, std::function<void(lk::StepConfig&)> f = nullptr) {
  lk::StepConfig c;
  c.rule = r;
  if (f) f(c);
  return c;
}

inline std::vector<RuleCase> rule_cases() {
  using namespace lo;
  return {
      {"Adam", [](auto& p, StateFormat f, bool sr) { return std::make_unique<Adam>(p, AdamOptions(1e-2).weight_decay(1e-2).amsgrad(true).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::Adam, [](auto& c) { c.weight_decay = 1e-2; c.amsgrad = true; })},
      {"AdamW", [](auto& p, StateFormat f, bool sr) { return std::make_unique<AdamW>(p, AdamWOptions(1e-2).maximize(true).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::AdamW, [](auto& c) { c.weight_decay = 1e-2; c.maximize = true; })},
      {"SGD", [](auto& p, StateFormat f, bool sr) { return std::make_unique<SGD>(p, SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::SGD, [](auto& c) { c.momentum = 0.9; c.nesterov = true; c.weight_decay = 1e-3; })},
      {"Lion", [](auto& p, StateFormat f, bool sr) { return std::make_unique<Lion>(p, LionOptions(1e-3).weight_decay(0.1).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::Lion, [](auto& c) { c.beta1 = 0.9; c.beta2 = 0.99; c.weight_decay = 0.1; })},
      {"RMSprop", [](auto& p, StateFormat f, bool sr) { return std::make_unique<RMSprop>(p, RMSpropOptions(1e-3).centered(true).momentum(0.5).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::RMSprop, [](auto& c) { c.alpha = 0.99; c.centered = true; c.momentum = 0.5; })},
      {"Adagrad", [](auto& p, StateFormat f, bool sr) { return std::make_unique<Adagrad>(p, AdagradOptions(0.05).lr_decay(0.01).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::Adagrad, [](auto& c) { c.eps = 1e-10; c.lr_decay = 0.01; })},
      {"AdEMAMix", [](auto& p, StateFormat f, bool sr) { return std::make_unique<AdEMAMix>(p, AdEMAMixOptions(1e-3).t_alpha_beta3(10).weight_decay(0.01).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::AdEMAMix, [](auto& c) { c.alpha = 5.0; c.t_alpha_beta3 = 10; c.weight_decay = 0.01; })},
      {"LAMB", [](auto& p, StateFormat f, bool sr) { return std::make_unique<LAMB>(p, LAMBOptions(1e-2).weight_decay(0.01).state_format(f).bf16_stochastic_round(sr)); },
       cfg(lk::Rule::LAMB, [](auto& c) { c.eps = 1e-6; c.weight_decay = 0.01; })},
  };
}

// Sets master_weight_bits on every group of an optimizer made by rule_cases().
inline void set_master_bits(lo::LowbitOptimizer& opt, int64_t bits) {
  for (auto& g : opt.param_groups()) {
    auto* o = &g.options();
    if (auto* x = dynamic_cast<lo::AdamOptions*>(o)) x->master_weight_bits(bits);
    else if (auto* x = dynamic_cast<lo::AdamWOptions*>(o)) x->master_weight_bits(bits);
    else if (auto* x = dynamic_cast<lo::SGDOptions*>(o)) x->master_weight_bits(bits);
    else if (auto* x = dynamic_cast<lo::LionOptions*>(o)) x->master_weight_bits(bits);
    else if (auto* x = dynamic_cast<lo::RMSpropOptions*>(o)) x->master_weight_bits(bits);
    else if (auto* x = dynamic_cast<lo::AdagradOptions*>(o)) x->master_weight_bits(bits);
    else if (auto* x = dynamic_cast<lo::AdEMAMixOptions*>(o)) x->master_weight_bits(bits);
    else if (auto* x = dynamic_cast<lo::LAMBOptions*>(o)) x->master_weight_bits(bits);
    else TORCH_CHECK(false, "set_master_bits: unknown options type");
  }
}

}  // namespace lowbit_test
