// The machinery every lowbit optimizer shares: lazily created state in FP32 / BF16 / quantized
// form, the fused step, skipping of non-finite gradients, gradient clipping, state accounting and
// checkpoints. Concrete optimizers (optimizers.h) only map their options to an update rule.
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <unordered_map>
#include <vector>

#include <lowbit/kernels/common/optim_rules.h>
#include <lowbit/tensors/qtensor.h>

#include "options.h"
#include "state_format.h"

namespace lowbit {
namespace optim {

// One state tensor of one parameter: dense (FP32 / BF16) or quantized.
struct StateSlot {
  StateFormat storage = StateFormat::FP32;  // FP32, BF16, or the quantized family (Q8/Q4/FP8)
  at::Tensor dense;                         // FP32 or BF16 storage
  QTensor quantized;                        // quantized storage
  int64_t nbytes() const;
  at::Tensor to_float() const;              // fp32 values, shaped like the parameter
};

struct ParamState {
  int64_t step = 0;
  StateFormat format = StateFormat::FP32;   // resolved format (after min_quant_numel, overrides)
  int64_t block_size = 0;                   // quantization block of quantized slots
  std::vector<StateSlot> slots;             // by rule slot index; an unused slot is empty
};

class LowbitOptimizer : public torch::optim::Optimizer {
 public:
  using LossClosure = torch::optim::Optimizer::LossClosure;

  // Runs one step; a non-finite gradient anywhere skips it for every parameter and is counted.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Bytes held by optimizer state (codes + absmax for quantized state).
  int64_t state_bytes() const;
  // Steps skipped because a gradient held NaN or Inf.
  int64_t skipped_steps() const { return skipped_steps_; }

  // Keeps `param`'s state in `format` whatever its group says (e.g. FP32 for embeddings). Must be
  // set before the parameter's first step.
  void override_state_format(const at::Tensor& param, StateFormat format);

  // The state of a parameter (nullptr before its first step).
  const ParamState* state_of(const at::Tensor& param) const;
  // The parameter's state tensors expanded to fp32 (for export to other optimizers).
  std::vector<at::Tensor> export_state_fp32(const at::Tensor& param) const;

  // Runs every parameter through the ATen reference step instead of the fused kernel (the test
  // oracle; also the path of devices without a fused kernel).
  void use_reference_step(bool on) { force_reference_ = on; }
  // Runs the fused CPU kernel's scalar loop even where AVX-512 is present (what other CPUs run;
  // tests compare the two loops).
  void use_scalar_kernel(bool on) { force_scalar_ = on; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  static constexpr int64_t kCheckpointVersion = 1;

 protected:
  LowbitOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                  std::unique_ptr<torch::optim::OptimizerOptions> defaults);

  virtual kernels::Rule rule() const = 0;
  // The rule's hyper-parameters for a group at (1-based) step t of a parameter.
  virtual kernels::Hyper hyper(const torch::optim::OptimizerOptions& options, int64_t t) const = 0;
  virtual CommonOptions common(const torch::optim::OptimizerOptions& options) const = 0;
  // Initial value of a state slot (Adagrad's initial_accumulator_value); 0 by default.
  virtual double initial_state_value(const torch::optim::OptimizerOptions&, int slot) const { return 0.0; }
  // Which slots of the rule this group uses (RMSprop without momentum needs no momentum buffer).
  virtual bool slot_used(const torch::optim::OptimizerOptions&, int slot) const { return true; }
  virtual const char* name() const = 0;

 private:
  ParamState& ensure_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options, int64_t group,
                           int64_t index);
  // A fresh state for p in its resolved format; slot k starts from values[k] when given.
  ParamState make_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                        const std::vector<at::Tensor>& values) const;
  // Reads a checkpoint of libtorch's torch::optim::Adam / AdamW into this (Adam / AdamW) optimizer.
  void load_torch_adam(torch::serialize::InputArchive& archive);
  void check_grad(const at::Tensor& p, const at::Tensor& g, int64_t group, int64_t index) const;

  std::unordered_map<c10::TensorImpl*, ParamState> states_;
  std::unordered_map<c10::TensorImpl*, StateFormat> overrides_;
  int64_t skipped_steps_ = 0;
  bool force_reference_ = false;
  bool force_scalar_ = false;
  uint64_t seed_ = 0x6C6F77626974ull;  // "lowbit": stochastic rounding seed, saved in checkpoints
};

}  // namespace optim
}  // namespace lowbit
