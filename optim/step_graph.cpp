// StepGraph (step_graph.h): when to record a step, when its recording still does a step's work.
#include "step_graph.h"

#include <c10/util/Exception.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>

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

bool add_step_input(const at::Tensor& p, StepInputs& in) {
  StepInputs::Param x;
  x.param = p.unsafeGetTensorImpl();
  x.numel = p.numel();
  x.dtype = static_cast<int8_t>(p.scalar_type());
  // The TensorImpl's own gradient: Tensor::grad() also asks autograd whether p is a leaf (for a
  // warning), a fifth of this look's time over thousands of parameters.
  const at::Tensor& g = p.unsafeGetTensorImpl()->grad();
  if (g.defined()) {
    if (!in.device) {
      in.device = p.device();
      if (!ops::can_record(*in.device)) {  // the CPU: nothing to record, nothing more to look at
        in.recordable = false;
        return false;
      }
    }
    // Anything the step would refuse or take another path for is not recorded: the full step then
    // checks it as always.
    const bool ok = p.layout() == at::kStrided && g.layout() == at::kStrided && p.device() == *in.device &&
                    g.device() == *in.device && p.is_contiguous() && g.is_contiguous() && g.sizes().equals(p.sizes());
    if (!ok) {
      in.recordable = false;
      return false;
    }
    // The step writes the parameter through its mutable address (a copy-on-write tensor is
    // materialized there, as the step would).
    x.data = p.mutable_data_ptr();
    x.grad = g.const_data_ptr();
    x.grad_dtype = static_cast<int8_t>(g.scalar_type());
  }
  in.params.push_back(x);
  return true;
}

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

namespace {

// What StepInputs holds of each parameter, one int64 row each (parameter, elements, gradient,
// numel, dtype + 256 x gradient dtype); no rows when a step of them cannot be recorded
// (add_step_input). Given the rows a recording was made for, it also says whether these are the
// same, and if so bumps the version of each parameter with a gradient, as the op calls the replay
// stands for would (tensors/optim_ops.h): one pass over the list for both.
std::tuple<at::Tensor, bool> step_graph_inputs(const std::vector<at::Tensor>& params,
                                               const std::optional<at::Tensor>& recorded) {
  const bool given = recorded.has_value() && recorded->defined();
  TORCH_CHECK(!given || (recorded->scalar_type() == at::kLong && recorded->device().is_cpu() &&
                            recorded->dim() == 2 && recorded->size(1) == 5 && recorded->is_contiguous()),
              "lowbit::StepGraphInputs.look: recorded must be the rows an earlier call returned (a contiguous "
              "int64 CPU tensor of shape [n, 5]), got ", recorded->scalar_type(), " of shape ", recorded->sizes(),
              " on ", recorded->device());
  StepInputs in;
  in.recordable = true;
  in.params.reserve(params.size());
  for (const at::Tensor& p : params)
    if (!add_step_input(p, in)) break;
  if (!in.recordable || !in.device) return {at::empty({0, 5}, at::kLong), false};
  const int64_t n = static_cast<int64_t>(in.params.size());
  at::Tensor rows = at::empty({n, 5}, at::kLong);
  int64_t* r = rows.mutable_data_ptr<int64_t>();
  for (const StepInputs::Param& x : in.params) {
    *r++ = static_cast<int64_t>(reinterpret_cast<intptr_t>(x.param));
    *r++ = static_cast<int64_t>(reinterpret_cast<intptr_t>(x.data));
    *r++ = static_cast<int64_t>(reinterpret_cast<intptr_t>(x.grad));
    *r++ = x.numel;
    *r++ = static_cast<int64_t>(x.dtype) + 256 * static_cast<int64_t>(x.grad_dtype);
  }
  const bool same = given && recorded->sizes().equals(rows.sizes()) &&
                    std::memcmp(recorded->const_data_ptr(), rows.const_data_ptr(), rows.nbytes()) == 0;
  if (same)
    for (const at::Tensor& p : params)
      if (p.unsafeGetTensorImpl()->grad().defined()) p.unsafeGetTensorImpl()->bump_version();
  return {rows, same};
}

// torch.classes.lowbit.StepGraphInputs: for the Python optimizers' step graphs (python/lowbit/
// optim/step_graph.py), a parameter list held here once, then looked at each step with no
// argument but the recorded rows: handing thousands of tensors from Python to an op costs more
// than reading them (about 0.4 us a tensor against 0.05), and the list rarely changes.
struct StepGraphInputs : torch::CustomClassHolder {
  explicit StepGraphInputs(std::vector<at::Tensor> list) : params(std::move(list)) {}
  std::tuple<at::Tensor, bool> look(const std::optional<at::Tensor>& recorded) const {
    return step_graph_inputs(params, recorded);
  }
  int64_t size() const { return static_cast<int64_t>(params.size()); }
  std::vector<at::Tensor> params;
};

}  // namespace

}  // namespace optim
}  // namespace lowbit

TORCH_LIBRARY_FRAGMENT(lowbit, m) {
  m.class_<lowbit::optim::StepGraphInputs>("StepGraphInputs")
      .def(torch::init<std::vector<at::Tensor>>())
      .def("look", &lowbit::optim::StepGraphInputs::look, "", {torch::arg("recorded") = torch::IValue()})
      .def("size", &lowbit::optim::StepGraphInputs::size);
}
