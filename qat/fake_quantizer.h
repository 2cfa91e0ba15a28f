// FakeQuantizer: the module that fake-quantizes one tensor (an activation or a weight) per its
// FakeQuantConfig, with on/off switches and a delayed start. Autograd: clipped STE to the input;
// with Learnable qparams, LSQ gradients to `scale` (and LSQ+ to `zero_point` when asymmetric).
#pragma once

#include <torch/torch.h>

#include <string>
#include <tuple>

#include "fake_quant_config.h"

namespace lowbit {
namespace qat {

class FakeQuantizerImpl : public torch::nn::Module {
 public:
  // `who` names the quantizer in error messages (prepare() passes e.g. "fc1.weight").
  explicit FakeQuantizerImpl(FakeQuantConfig config, std::string who = "FakeQuantizer");

  at::Tensor forward(const at::Tensor& x);

  // Off: forward returns its input unchanged.
  void enable(bool on = true) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // Off for the first `steps` training-mode forward calls (delayed start); counts training calls.
  void set_start_step(int64_t steps);
  int64_t start_step() const { return start_step_; }
  int64_t steps_seen() const { return steps_; }
  // Whether the next forward call fake-quantizes (given the mode and counts).
  bool active() const;

  const FakeQuantConfig& config() const { return config_; }
  const std::string& who() const { return who_; }

  // (scale, zero_point) that forward applies to x now, flat per group of x's layout (for convert()).
  std::tuple<at::Tensor, at::Tensor> qparams(const at::Tensor& x);
  // Learnable: sets scale / zero_point from x's dynamic qparams (prepare() calls it with the weight;
  // activations initialise themselves from their first batch).
  void init_learnable(const at::Tensor& x);

  // Learnable: parameters; observers: running statistics (buffers). Undefined until initialised.
  at::Tensor scale, zero_point, running_min, running_max;

 private:
  void observe(const at::Tensor& grouped, int64_t group_size);
  FakeQuantConfig config_;
  std::string who_;
  bool enabled_ = true;
  int64_t start_step_ = 0;
  int64_t steps_ = 0;
};
TORCH_MODULE(FakeQuantizer);

}  // namespace qat
}  // namespace lowbit
