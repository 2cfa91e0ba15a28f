// Options of lowbit's optimizers: torch::optim's names and defaults (TORCH_ARG builders, get_lr /
// set_lr for schedulers), plus the options every lowbit optimizer shares (LOWBIT_COMMON_ARGS).
#pragma once

#include <torch/optim/optimizer.h>

#include <tuple>

#include "state_format.h"

namespace lowbit {
namespace optim {

// "<who>: lr must be finite and >= 0, got <lr>" unless lr lies in its range (the step pipeline's,
// kernels/common/step_config.h).
void check_lr(double lr, const char* who);

// Options shared by every lowbit optimizer.
//   state_format           how each state tensor is stored (default Q8)
//   block_size             quantization block, 0 = the format's default (256 for 8-bit, 128 for 4-bit)
//   min_quant_numel        parameters with fewer elements keep FP32 state (decided on the whole
//                          parameter's numel, so sharding never changes it)
//   bf16_stochastic_round  round bf16 parameters stochastically (seeded, reproducible)
//   max_grad_norm          clip the group's gradients to this global L2 norm first (0 = off)
//   skip_nonfinite         read every gradient before the step and skip the step (parameters and
//                          state untouched, skipped_steps() counts it) if any holds Inf or NaN;
//                          false saves that read (4 bytes per fp32 parameter) where the caller
//                          guarantees finite gradients (or checks them itself, e.g. AMP's scaler).
//                          LAMB on the CPU checks in its first pass instead (no read of its own)
//                          once the group's state exists, where the group does not clip
//   fp8_second_moment      FP8 state: format of the unsigned states (second moments). E4M3 (the
//                          default) measured better than E5M2 in the Fashion-MNIST demo (89.02 % vs
//                          88.61 %, FP32 89.02 %); E5M2 keeps more range.
//   master_weight_bits     bf16 parameters only: 0 (none), 32 (an int16 correction per element: the
//                          step is bit for bit the one over fp32 master weights) or 24 (an int8
//                          correction: a master value with 16 significant bits). The correction is
//                          state (slot kCorrectionSlot; kernels/common/master_weight.h); it replaces
//                          bf16_stochastic_round, which cannot be combined with it.
#define LOWBIT_COMMON_ARGS(Options)                                  \
  TORCH_ARG(::lowbit::StateFormat, state_format) = ::lowbit::StateFormat::Q8; \
  TORCH_ARG(int64_t, block_size) = 0;                                \
  TORCH_ARG(int64_t, min_quant_numel) = 4096;                        \
  TORCH_ARG(bool, bf16_stochastic_round) = false;                    \
  TORCH_ARG(double, max_grad_norm) = 0.0;                            \
  TORCH_ARG(bool, skip_nonfinite) = true;                            \
  TORCH_ARG(::lowbit::QuantFormat, fp8_second_moment) = ::lowbit::QuantFormat::FP8E4M3; \
  TORCH_ARG(int64_t, master_weight_bits) = 0;                        \
                                                                     \
 public:                                                             \
  double get_lr() const override { return lr(); }                    \
  void set_lr(const double v) override {                             \
    ::lowbit::optim::check_lr(v, "set_lr");                         \
    lr(v);                                                           \
  }

struct CommonOptions {
  StateFormat state_format;
  int64_t block_size;
  int64_t min_quant_numel;
  bool bf16_stochastic_round;
  double max_grad_norm;
  QuantFormat fp8_second_moment;
  bool skip_nonfinite;
  int64_t master_weight_bits;
};

template <typename Options>
CommonOptions common_options(const Options& o) {
  return {o.state_format(),  o.block_size(),    o.min_quant_numel(), o.bf16_stochastic_round(),
          o.max_grad_norm(), o.fp8_second_moment(), o.skip_nonfinite(), o.master_weight_bits()};
}

struct AdamOptions : public torch::optim::OptimizerCloneableOptions<AdamOptions> {
  AdamOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, amsgrad) = false;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(AdamOptions)
};

struct AdamWOptions : public torch::optim::OptimizerCloneableOptions<AdamWOptions> {
  AdamWOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 1e-2;
  TORCH_ARG(bool, amsgrad) = false;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(AdamWOptions)
};

struct SGDOptions : public torch::optim::OptimizerCloneableOptions<SGDOptions> {
  SGDOptions(double lr) : lr_(lr) {}
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0;
  TORCH_ARG(double, dampening) = 0;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, nesterov) = false;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(SGDOptions)
};

// Lion (Chen et al., arXiv 2302.06675): defaults of the paper's reference implementation.
struct LionOptions : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  LionOptions(double lr = 1e-4) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-4;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.99);
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(LionOptions)
};

struct RMSpropOptions : public torch::optim::OptimizerCloneableOptions<RMSpropOptions> {
  RMSpropOptions(double lr = 1e-2) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-2;
  TORCH_ARG(double, alpha) = 0.99;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(double, momentum) = 0;
  TORCH_ARG(bool, centered) = false;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(RMSpropOptions)
};

struct AdagradOptions : public torch::optim::OptimizerCloneableOptions<AdagradOptions> {
  AdagradOptions(double lr = 1e-2) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-2;
  TORCH_ARG(double, lr_decay) = 0;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(double, initial_accumulator_value) = 0;
  TORCH_ARG(double, eps) = 1e-10;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(AdagradOptions)
};

// AdEMAMix (Pagliardini et al., arXiv 2409.03137): betas (beta1, beta2, beta3), alpha; alpha and
// beta3 warm up over t_alpha_beta3 steps when it is > 0, as in the paper.
struct AdEMAMixOptions : public torch::optim::OptimizerCloneableOptions<AdEMAMixOptions> {
  AdEMAMixOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999, 0.9999);
  TORCH_ARG(double, alpha) = 5.0;
  TORCH_ARG(int64_t, t_alpha_beta3) = 0;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(AdEMAMixOptions)
};

// LAMB (You et al., arXiv 1904.00962): Adam's direction plus decoupled weight decay, scaled per
// parameter by the trust ratio ||p|| / ||r||.
struct LAMBOptions : public torch::optim::OptimizerCloneableOptions<LAMBOptions> {
  LAMBOptions(double lr = 1e-3) : lr_(lr) {}
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-6;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, maximize) = false;
  LOWBIT_COMMON_ARGS(LAMBOptions)
};

}  // namespace optim
}  // namespace lowbit
