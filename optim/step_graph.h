// Steps recorded once and replayed (a CUDA graph, tensors/step_recording.h): once a step's inputs
// repeat (the same parameters and gradient addresses, options and state), the optimizer records
// the step's device work and from then on replays it with one launch, for as long as the inputs
// stay the same. Over thousands of small tensors the host's part of a step is then one look at
// each parameter and its gradient, not the pass over every state tensor's metadata that building
// the step op's arguments, dispatching and checking them take. Replays compute the same bits as
// the steps they replace: the same kernels on the same addresses, reading the step count, lr and
// skip flag where they live on the device.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <vector>

#include "../kernels/common/step_config.h"
#include "../tensors/step_recording.h"

#include "options.h"

namespace lowbit {
namespace optim {

// What a step saw of its inputs: enough to tell whether a recorded step does this step's work.
struct StepInputs {
  struct Param {
    const void* param = nullptr;      // the parameter (its TensorImpl)
    const void* data = nullptr;       // its elements
    const void* grad = nullptr;       // its gradient's elements; null: no gradient
    int64_t numel = 0;
    int8_t dtype = 0, grad_dtype = 0;
  };
  struct Group {
    kernels::StepConfig config;
    CommonOptions common;
  };
  std::vector<Param> params;  // every parameter of every group, in order
  std::vector<Group> groups;
  int64_t state_epoch = 0;          // the optimizer's state_epoch_ (bumped when its state changes)
  std::optional<at::Device> device; // the device of every parameter that has a gradient
  // A step of these inputs can be recorded: one device that records, and every parameter with a
  // gradient dense and contiguous, with a dense, contiguous gradient of its shape on its device.
  bool recordable = false;
};

bool same_inputs(const StepInputs& a, const StepInputs& b);

// Appends what a step sees of parameter `p` to `in.params` (and, at the first parameter with a
// gradient, sets in.device). False, with in.recordable cleared, when a step of it cannot be
// recorded: the first gradient on a device that records nothing (the CPU), or a parameter whose
// step would be refused or take another path (sparse, non-contiguous, a gradient of another
// shape or device).
bool add_step_input(const at::Tensor& p, StepInputs& in);

class StepGraph {
 public:
  bool enabled() const { return enabled_; }
  void set_enabled(bool on);
  int64_t replays() const { return replays_; }

  // Whether the recorded step does the work of a step with inputs `now`. A recording that does
  // not is dropped (the inputs changed: new gradient addresses, options, state).
  bool matches(const StepInputs& now);
  void replay();
  // Whether a step with inputs `now` should be recorded: they repeat the last step's.
  bool repeats(const StepInputs& now) const;
  // After a step run as it came: its inputs, for repeats().
  void remember(StepInputs now);
  // After a step recorded (and run by one replay): the recording and its inputs.
  void keep(std::unique_ptr<ops::Recording> recording, StepInputs inputs);
  // Recording a step failed: steps run as they come from now on.
  void give_up();
  // Drops the recording and the last step's inputs (the state they point to changed).
  void forget();

 private:
  bool enabled_ = true;
  std::unique_ptr<ops::Recording> recording_;
  StepInputs recorded_, last_;
  bool has_last_ = false;
  int64_t replays_ = 0;
  int64_t dropped_ = 0;  // recordings dropped because the inputs changed
};

}  // namespace optim
}  // namespace lowbit
