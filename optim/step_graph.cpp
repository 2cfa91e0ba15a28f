// StepGraph (step_graph.h): when to record a step, when its recording still does a step's work.
#include "step_graph.h"

#include <c10/util/Exception.h>

namespace lowbit {
namespace optim {

namespace {

// Recordings thrown away before the optimizer stops recording: gradients that move every few
// steps would otherwise cost a capture each time and gain nothing.
constexpr int64_t kMaxDropped = 8;

bool same_config(const kernels::StepConfig& a, const kernels::StepConfig& b) {
  bool same = a.rule == b.rule;
#define LOWBIT_SAME_HYPER(type, name, default_value, range) same = same && a.name == b.name;
  LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_SAME_HYPER)
#undef LOWBIT_SAME_HYPER
  return same;
}

bool same_common(const CommonOptions& a, const CommonOptions& b) {
  return a.state_format == b.state_format && a.block_size == b.block_size && a.min_quant_numel == b.min_quant_numel &&
         a.bf16_stochastic_round == b.bf16_stochastic_round && a.max_grad_norm == b.max_grad_norm &&
         a.fp8_second_moment == b.fp8_second_moment && a.skip_nonfinite == b.skip_nonfinite &&
         a.master_weight_bits == b.master_weight_bits;
}

}  // namespace

bool same_inputs(const StepInputs& a, const StepInputs& b) {
  if (!a.recordable || !b.recordable || a.state_epoch != b.state_epoch || a.device != b.device ||
      a.params.size() != b.params.size() || a.groups.size() != b.groups.size())
    return false;
  for (size_t g = 0; g < a.groups.size(); ++g)
    if (!same_config(a.groups[g].config, b.groups[g].config) || !same_common(a.groups[g].common, b.groups[g].common))
      return false;
  for (size_t i = 0; i < a.params.size(); ++i) {
    const StepInputs::Param &x = a.params[i], &y = b.params[i];
    if (x.param != y.param || x.data != y.data || x.grad != y.grad || x.numel != y.numel || x.dtype != y.dtype ||
        x.grad_dtype != y.grad_dtype)
      return false;
  }
  return true;
}

void StepGraph::set_enabled(bool on) {
  enabled_ = on;
  dropped_ = 0;
  forget();
}

bool StepGraph::matches(const StepInputs& now) {
  if (!recording_) return false;
  if (same_inputs(now, recorded_)) return true;
  recording_.reset();
  if (++dropped_ >= kMaxDropped) {
    TORCH_WARN("lowbit: stopped recording optimizer steps as CUDA graphs: the gradients' addresses (or the "
               "options, or the state) changed after ", dropped_, " recordings; steps run as they come");
    enabled_ = false;
  }
  return false;
}

void StepGraph::replay() {
  recording_->replay();
  ++replays_;
}

bool StepGraph::repeats(const StepInputs& now) const {
  return enabled_ && has_last_ && same_inputs(now, last_);
}

void StepGraph::remember(StepInputs now) {
  last_ = std::move(now);
  has_last_ = true;
}

void StepGraph::keep(std::unique_ptr<ops::Recording> recording, StepInputs inputs) {
  recording_ = std::move(recording);
  recorded_ = std::move(inputs);
  has_last_ = false;
  ++replays_;  // the recording ran this step
}

void StepGraph::give_up() {
  enabled_ = false;
  forget();
}

// Dropping a recording whose last replay may still be running on the device is safe: CUDA frees
// an executable graph in flight when it completes (cuGraphExecDestroy), and ATen gives the graph's
// private memory pool back only with cudaFree, which waits for the device.
void StepGraph::forget() {
  recording_.reset();
  has_last_ = false;
}

}  // namespace optim
}  // namespace lowbit
