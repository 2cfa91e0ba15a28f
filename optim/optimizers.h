// lowbit's optimizers: drop-in torch::optim::Optimizer classes whose state can be FP32, BF16, or
// 8-bit / 4-bit / fp8 blockwise-quantized. Construct like torch::optim::AdamW:
//   lowbit::optim::AdamW opt(model->parameters(), lowbit::optim::AdamWOptions(1e-3).state_format(lowbit::StateFormat::Q8));
#pragma once

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

namespace detail {

// Constructors and option plumbing shared by every optimizer; `Derived` supplies the rule.
template <typename Options>
class OptimizerWith : public LowbitOptimizer {
 public:
  explicit OptimizerWith(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults)
      : LowbitOptimizer(std::move(groups), std::make_unique<Options>(defaults)) {}

 protected:
  CommonOptions common(const torch::optim::OptimizerOptions& o) const override {
    return common_options(static_cast<const Options&>(o));
  }
  static const Options& opts(const torch::optim::OptimizerOptions& o) { return static_cast<const Options&>(o); }
};

}  // namespace detail

// DEFAULTS: `= {}`, or nothing where the options have no default (SGD: lr is required).
#define LOWBIT_OPTIMIZER_CTORS(Name, Options, DEFAULTS)                                               \
  explicit Name(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults DEFAULTS)      \
      : detail::OptimizerWith<Options>(std::move(groups), defaults) {                                \
    check_groups();                                                                                   \
  }                                                                                                   \
  explicit Name(std::vector<at::Tensor> params, Options defaults DEFAULTS)                             \
      : Name(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))}, \
             defaults) {}                                                                             \
  const char* name() const override { return "lowbit::optim::" #Name; }

class Adam : public detail::OptimizerWith<AdamOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(Adam, AdamOptions, = {})
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
};

class AdamW : public detail::OptimizerWith<AdamWOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(AdamW, AdamWOptions, = {})
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
};

class SGD : public detail::OptimizerWith<SGDOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(SGD, SGDOptions, )
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
};

class Lion : public detail::OptimizerWith<LionOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(Lion, LionOptions, = {})
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
};

class RMSprop : public detail::OptimizerWith<RMSpropOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(RMSprop, RMSpropOptions, = {})
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
};

class Adagrad : public detail::OptimizerWith<AdagradOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(Adagrad, AdagradOptions, = {})
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  double initial_state_value(const torch::optim::OptimizerOptions& o, int slot) const override;
  void check_options(const torch::optim::OptimizerOptions& o, const char* who) const override;
};

class AdEMAMix : public detail::OptimizerWith<AdEMAMixOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(AdEMAMix, AdEMAMixOptions, = {})
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
};

class LAMB : public detail::OptimizerWith<LAMBOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(LAMB, LAMBOptions, = {})
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
};

#undef LOWBIT_OPTIMIZER_CTORS

}  // namespace optim
}  // namespace lowbit
