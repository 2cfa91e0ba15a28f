// What an optimizer step is configured with: the rule and its named hyper-parameters, fixed per
// parameter group (the op's arguments), with the range each must lie in. Public: the optimizers'
// config() returns a StepConfig. The per-step values derived from it are step_values.h's.
#pragma once

#include <cmath>
#include <cstdint>


namespace lowbit {
namespace kernels {

enum class Rule : int32_t { Adam = 0, AdamW = 1, SGD = 2, Lion = 3, RMSprop = 4, Adagrad = 5, AdEMAMix = 6, LAMB = 7 };
constexpr int kNumRules = 8;

inline const char* rule_name(Rule r) {
  static const char* const names[kNumRules] = {"Adam", "AdamW", "SGD", "Lion", "RMSprop", "Adagrad", "AdEMAMix", "LAMB"};
  const int i = static_cast<int>(r);
  return i >= 0 && i < kNumRules ? names[i] : "?";
}

// The named hyper-parameters of every rule (each reads the ones torch.optim's counterpart has), once:
// X(type, name, default, range). StepConfig's fields, the op's keyword arguments and their defaults,
// their parsing, the range checks (tensors/optim_step_args.cpp), the comparison of recorded steps
// and Python's list (the op lowbit::optim_hyper_parameters) all come from this table, so a new
// hyper-parameter is one row here plus the rule that reads it (optim_rules.h).
// alpha is RMSprop's smoothing constant and AdEMAMix's mixing coefficient; lr_decay is Adagrad's;
// t_alpha_beta3 AdEMAMix's warm-up steps of alpha and beta3 (0 = none).
#define LOWBIT_STEP_HYPER_PARAMETERS(X)   \
  X(double, beta1, 0.9, UnitInterval)     \
  X(double, beta2, 0.999, UnitInterval)   \
  X(double, beta3, 0.9999, UnitInterval)  \
  X(double, eps, 1e-8, NonNegative)       \
  X(double, weight_decay, 0.0, NonNegative) \
  X(double, alpha, 0.0, NonNegative)      \
  X(double, momentum, 0.0, NonNegative)   \
  X(double, dampening, 0.0, Finite)       \
  X(double, lr_decay, 0.0, NonNegative)   \
  X(int64_t, t_alpha_beta3, 0, NonNegative) \
  X(bool, nesterov, false, Any)           \
  X(bool, centered, false, Any)           \
  X(bool, amsgrad, false, Any)            \
  X(bool, maximize, false, Any)

// Where a hyper-parameter's value must lie (NaN lies nowhere but in Any).
enum class HyperRange { Any, Finite, NonNegative, Positive, ZeroToInf, UnitInterval };

inline bool in_range(HyperRange r, double v) {
  switch (r) {
    case HyperRange::Any: return true;
    case HyperRange::Finite: return std::isfinite(v);
    case HyperRange::NonNegative: return std::isfinite(v) && v >= 0;
    case HyperRange::Positive: return std::isfinite(v) && v > 0;
    case HyperRange::ZeroToInf: return v >= 0;
    case HyperRange::UnitInterval: return v >= 0 && v < 1;
  }
  return false;
}

inline const char* range_text(HyperRange r) {
  switch (r) {
    case HyperRange::Any: return "any value";
    case HyperRange::Finite: return "finite";
    case HyperRange::NonNegative: return "finite and >= 0";
    case HyperRange::Positive: return "finite and > 0";
    case HyperRange::ZeroToInf: return "in [0, inf]";
    case HyperRange::UnitInterval: return "in [0, 1)";
  }
  return "?";
}

// The per-step values a call reads from tensors (they may live on a device), and where each must
// lie: the learning rate, AMP's loss scale, the squared norm of the gradients and LAMB's two sums
// per parameter (infinite where a value overflowed, as torch's norms are; never NaN or negative),
// and the step counter, below 2^53 so that t and t + 1 are exact in the double derive_hyper takes.
constexpr HyperRange kLrRange = HyperRange::NonNegative;
constexpr HyperRange kGradScaleRange = HyperRange::Positive;
constexpr HyperRange kGradSumsqRange = HyperRange::ZeroToInf;
constexpr HyperRange kLambNormRange = HyperRange::ZeroToInf;
constexpr int64_t kMaxStepCount = int64_t(1) << 53;

struct StepConfig {
  Rule rule = Rule::AdamW;
#define LOWBIT_STEP_CONFIG_FIELD(type, name, default_value, range) type name = default_value;
  LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_STEP_CONFIG_FIELD)
#undef LOWBIT_STEP_CONFIG_FIELD
};

}  // namespace kernels
}  // namespace lowbit
