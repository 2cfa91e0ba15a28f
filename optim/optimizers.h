// lowbit's optimizers: drop-in torch::optim::Optimizer classes whose state can be FP32, BF16, or
// 8-bit / 4-bit / fp8 blockwise-quantized. Construct like torch::optim::AdamW:
//   lowbit::optim::AdamW opt(model->parameters(), lowbit::optim::AdamWOptions(1e-3).state_format(lowbit::StateFormat::Q8));
#pragma once

#include <cmath>

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

namespace detail {

// Constructors and option plumbing shared by every optimizer; `Derived` supplies the rule.
template <typename Options>
class OptimizerWith : public LowbitOptimizer {
 public:
  explicit OptimizerWith(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults)
      : LowbitOptimizer(std::move(groups), std::make_unique<Options>(defaults)) {
    for (const auto& g : param_groups_) check_common(static_cast<const Options&>(g.options()));
  }

 protected:
  CommonOptions common(const torch::optim::OptimizerOptions& o) const override {
    return common_options(static_cast<const Options&>(o));
  }
  static const Options& opts(const torch::optim::OptimizerOptions& o) { return static_cast<const Options&>(o); }

 private:
  static void check_common(const Options& o) {
    TORCH_CHECK(std::isfinite(o.lr()) && o.lr() >= 0, "Invalid learning rate: ", o.lr());
    TORCH_CHECK(o.min_quant_numel() >= 0, "Invalid min_quant_numel: ", o.min_quant_numel());
    TORCH_CHECK(std::isfinite(o.max_grad_norm()) && o.max_grad_norm() >= 0, "Invalid max_grad_norm: ",
                o.max_grad_norm());
    if (o.block_size() != 0) resolve_block_size(QuantFormat::Dyn8Signed, o.block_size(), "lowbit optimizer options");
    TORCH_CHECK(o.fp8_second_moment() == QuantFormat::FP8E4M3 || o.fp8_second_moment() == QuantFormat::FP8E5M2,
                "Invalid fp8_second_moment: ", format_name(o.fp8_second_moment()), "; expected FP8E4M3 or FP8E5M2");
  }
};

}  // namespace detail

#define LOWBIT_OPTIMIZER_CTORS(Name, Options)                                                         \
  explicit Name(std::vector<torch::optim::OptimizerParamGroup> groups, Options defaults = {})         \
      : detail::OptimizerWith<Options>(std::move(groups), defaults) {                                \
    validate(defaults);                                                                               \
  }                                                                                                   \
  explicit Name(std::vector<at::Tensor> params, Options defaults = {})                                \
      : Name(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))}, \
             defaults) {}                                                                             \
  const char* name() const override { return "lowbit::optim::" #Name; }

class Adam : public detail::OptimizerWith<AdamOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(Adam, AdamOptions)
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  static void validate(const AdamOptions& o);
};

class AdamW : public detail::OptimizerWith<AdamWOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(AdamW, AdamWOptions)
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  static void validate(const AdamWOptions& o);
};

class SGD : public detail::OptimizerWith<SGDOptions> {
 public:
  explicit SGD(std::vector<torch::optim::OptimizerParamGroup> groups, SGDOptions defaults)
      : detail::OptimizerWith<SGDOptions>(std::move(groups), defaults) {
    validate(defaults);
  }
  explicit SGD(std::vector<at::Tensor> params, SGDOptions defaults)
      : SGD(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
            defaults) {}
  const char* name() const override { return "lowbit::optim::SGD"; }
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  static void validate(const SGDOptions& o);
};

class Lion : public detail::OptimizerWith<LionOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(Lion, LionOptions)
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  static void validate(const LionOptions& o);
};

class RMSprop : public detail::OptimizerWith<RMSpropOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(RMSprop, RMSpropOptions)
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  static void validate(const RMSpropOptions& o);
};

class Adagrad : public detail::OptimizerWith<AdagradOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(Adagrad, AdagradOptions)
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  double initial_state_value(const torch::optim::OptimizerOptions& o, int slot) const override;
  static void validate(const AdagradOptions& o);
};

class AdEMAMix : public detail::OptimizerWith<AdEMAMixOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(AdEMAMix, AdEMAMixOptions)
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  static void validate(const AdEMAMixOptions& o);
};

class LAMB : public detail::OptimizerWith<LAMBOptions> {
 public:
  LOWBIT_OPTIMIZER_CTORS(LAMB, LAMBOptions)
 protected:
  kernels::StepConfig config(const torch::optim::OptimizerOptions& o) const override;
  static void validate(const LAMBOptions& o);
};

#undef LOWBIT_OPTIMIZER_CTORS

}  // namespace optim
}  // namespace lowbit
