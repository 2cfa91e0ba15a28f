// LowbitOptimizer: state creation, the step (check -> gradient pre-pass -> build the calls -> the
// step op), accounting. Checkpoints are in checkpoint.cpp.
#include "lowbit_optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "../tensors/optim_ops.h"
#include "../tensors/quant_format.h"
#include "../tensors/step_recording.h"

#include "state_layout.h"
#include "step_calls.h"
#include "step_graph.h"

namespace lowbit {
namespace optim {

int64_t StateSlot::nbytes() const {
  if (type.storage == kernels::SlotStorage::Quant) return quantized.nbytes();
  return dense.defined() ? static_cast<int64_t>(dense.nbytes()) : 0;
}

at::Tensor StateSlot::to_float() const {
  if (type.storage == kernels::SlotStorage::Quant) return quantized.dequantize().reshape(-1);
  return dense.defined() ? dense.to(at::kFloat) : at::Tensor();
}

int64_t ParamState::step() const { return counters.defined() ? counters[0].item<int64_t>() : 0; }

void check_lr(double lr, const char* who) { ops::check_lr(lr, who); }

LowbitOptimizer::LowbitOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                 std::unique_ptr<torch::optim::OptimizerOptions> defaults)
    : torch::optim::Optimizer(std::move(groups), std::move(defaults)), step_graph_(std::make_unique<StepGraph>()) {}

LowbitOptimizer::~LowbitOptimizer() = default;

void LowbitOptimizer::check_groups() {
  size_t params = 0;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& options = param_groups_[gi].options();
    const std::string who = c10::str(name(), ": param group ", gi);
    const CommonOptions c = common(options);
    const double lr = options.get_lr();
    check_lr(lr, who.c_str());
    ops::check_step_config(config(options), who.c_str());
    const int format = static_cast<int>(c.state_format);
    TORCH_CHECK(format >= 0 && format < kNumStateFormats, who, ": state_format ", format, " is not a StateFormat");
    if (c.block_size != 0) resolve_block_size(QuantFormat::Dyn8Signed, c.block_size, (who + ": block_size").c_str());
    TORCH_CHECK(c.min_quant_numel >= 0, who, ": min_quant_numel must be >= 0, got ", c.min_quant_numel);
    TORCH_CHECK(std::isfinite(c.max_grad_norm) && c.max_grad_norm >= 0, who,
                ": max_grad_norm must be finite and >= 0, got ", c.max_grad_norm);
    TORCH_CHECK(c.fp8_second_moment == QuantFormat::FP8E4M3 || c.fp8_second_moment == QuantFormat::FP8E5M2, who,
                ": fp8_second_moment must be FP8E4M3 or FP8E5M2, got ", format_name(c.fp8_second_moment));
    correction_slot_type(c.master_weight_bits, who.c_str());
    check_options(options, who.c_str());
    params += param_groups_[gi].params().size();
  }
  // A tensor in two groups would be stepped twice per step. Looked for when the groups' size
  // changed (add_param_group), not at every step.
  if (params == params_checked_) return;
  std::unordered_map<c10::TensorImpl*, std::pair<size_t, size_t>> seen;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& ps = param_groups_[gi].params();
    for (size_t i = 0; i < ps.size(); ++i) {
      const auto first = seen.emplace(ps[i].unsafeGetTensorImpl(), std::make_pair(gi, i));
      TORCH_CHECK(first.second, name(), ": parameter ", i, " of group ", gi, " is also parameter ", first.first->second.second,
                  " of group ", first.first->second.first, "; a tensor may be in one group only (it would step twice)");
    }
  }
  params_checked_ = params;
}

bool LowbitOptimizer::has_param(const at::Tensor& t) const {
  for (const auto& g : param_groups_)
    for (const auto& p : g.params())
      if (p.is_same(t)) return true;
  return false;
}

void LowbitOptimizer::override_state_format(const at::Tensor& param, StateFormat format) {
  TORCH_CHECK(has_param(param), name(), ": override_state_format: the tensor is not a parameter of this optimizer");
  const int f = static_cast<int>(format);
  TORCH_CHECK(f >= 0 && f < kNumStateFormats, name(), ": override_state_format: ", f, " is not a StateFormat");
  TORCH_CHECK(states_.find(param.unsafeGetTensorImpl()) == states_.end(), name(),
              ": override_state_format must come before the parameter's first step");
  overrides_[param.unsafeGetTensorImpl()] = format;
}

void LowbitOptimizer::replace_parameter(const at::Tensor& from, const at::Tensor& to) {
  TORCH_CHECK(has_param(from), name(), ": replace_parameter: the tensor to replace is not a parameter of this optimizer");
  TORCH_CHECK(!has_param(to), name(), ": replace_parameter: the replacement is a parameter of this optimizer already");
  TORCH_CHECK(to.sizes() == from.sizes() && to.scalar_type() == from.scalar_type(), name(),
              ": replace_parameter: the replacement has shape ", to.sizes(), " and dtype ", to.scalar_type(),
              "; the parameter has ", from.sizes(), " and ", from.scalar_type());
  TORCH_CHECK(states_.find(from.unsafeGetTensorImpl()) == states_.end(), name(),
              ": replace_parameter: the parameter holds optimizer state already; replace it before its first step");
  for (auto& group : param_groups_)
    for (at::Tensor& p : group.params())
      if (p.is_same(from)) p = to;
  auto it = overrides_.find(from.unsafeGetTensorImpl());
  if (it != overrides_.end()) {
    overrides_[to.unsafeGetTensorImpl()] = it->second;
    overrides_.erase(it);
  }
  params_checked_ = 0;  // look for repeats again
  state_changed();
}

const ParamState* LowbitOptimizer::state_of(const at::Tensor& param) const {
  auto it = states_.find(param.unsafeGetTensorImpl());
  return it == states_.end() ? nullptr : &it->second;
}

std::vector<at::Tensor> LowbitOptimizer::export_state_fp32(const at::Tensor& param) const {
  TORCH_CHECK(has_param(param), name(), ": export_state_fp32: the tensor is not a parameter of this optimizer");
  std::vector<at::Tensor> out;
  if (const ParamState* st = state_of(param))
    for (size_t k = 0; k < st->slots.size() && k < static_cast<size_t>(kernels::kMomentSlots); ++k) {
      at::Tensor t = st->slots[k].to_float();
      out.push_back(t.defined() ? t.view(param.sizes()) : t);
    }
  return out;
}

namespace {
const StateSlot* correction_of(const ParamState* st) {
  if (!st || st->slots.size() <= static_cast<size_t>(kernels::kCorrectionSlot)) return nullptr;
  const StateSlot& s = st->slots[kernels::kCorrectionSlot];
  return kernels::is_correction(s.type.storage) ? &s : nullptr;
}
}  // namespace

at::Tensor LowbitOptimizer::export_master_fp32(const at::Tensor& param) const {
  const StateSlot* c = correction_of(state_of(param));
  if (!c) return param.detach().to(at::kFloat);
  // The correction is stored flat: the values pair up element by element, shaped like the parameter.
  return ops::master_values(param.detach().reshape(-1), c->dense.reshape(-1)).view(param.sizes());
}

void LowbitOptimizer::load_master_fp32(const at::Tensor& param, const at::Tensor& values) {
  TORCH_CHECK(values.sizes() == param.sizes(), name(), ": load_master_fp32: values have shape ", values.sizes(),
              ", the parameter ", param.sizes());
  TORCH_CHECK(values.is_floating_point(), name(), ": load_master_fp32: values have dtype ", values.scalar_type(),
              "; expected a float dtype");
  TORCH_CHECK(at::isfinite(values).all().item<bool>(), name(), ": load_master_fp32: values hold NaN or Inf");
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].is_same(param)) continue;
      torch::NoGradGuard no_grad;
      ParamState& st = ensure_state(param, param_groups_[gi].options(), gi, i);
      const StateSlot* c = correction_of(&st);
      TORCH_CHECK(c, name(), ": load_master_fp32: parameter ", i, " of group ", gi,
                  " has no master-weight correction (set master_weight_bits to 24 or 32)");
      TORCH_CHECK(param.is_contiguous(), name(), ": load_master_fp32: parameter ", i, " of group ", gi,
                  " is not contiguous");
      at::Tensor p = param;  // the parameter's storage, written in place
      ops::store_master(values.detach().to(param.device()), p.detach(), c->dense);
      return;
    }
  }
  TORCH_CHECK(false, name(), ": load_master_fp32: the tensor is not a parameter of this optimizer");
}

int64_t LowbitOptimizer::state_bytes() const {
  int64_t total = 0;
  for (const auto& kv : states_)
    for (const auto& s : kv.second.slots) total += s.nbytes();
  return total;
}

bool LowbitOptimizer::clips_gradients() const {
  for (const auto& g : param_groups_)
    if (common(g.options()).max_grad_norm > 0) return true;
  return false;
}

int64_t LowbitOptimizer::skipped_steps() const {
  return skipped_loaded_ + (skipped_.defined() ? skipped_.item<int64_t>() : 0);
}

void LowbitOptimizer::set_overflow_check_interval(int64_t n) {
  TORCH_CHECK(n >= 0, name(), ": the overflow check interval must be >= 0, got ", n);
  overflow_check_interval_ = n;
}

void LowbitOptimizer::check_overflow() { check_overflow_on(false); }

// A state that overflowed cannot be stored (its blocks decode to NaN): say so rather than go on.
void LowbitOptimizer::check_overflow_on(bool cpu_only, const std::vector<Position>* where) const {
  const auto check = [&](size_t gi, size_t i) {
    const at::Tensor& p = param_groups_[gi].params()[i];
    auto it = states_.find(p.unsafeGetTensorImpl());
    if (it == states_.end() || (cpu_only && !it->second.counters.is_cpu())) return;
    const Overflow fresh = fresh_overflow(it->second);
    TORCH_CHECK(fresh.blocks == 0, name(), ": the state of parameter ", i, " of group ", gi, " (shape ", p.sizes(),
                ") overflowed to Inf/NaN in ", fresh.blocks, " block(s) at step ", fresh.step,
                "; the parameter is updated but that state is lost. Lower the learning rate, clip gradients "
                "(max_grad_norm), or keep this parameter's state in FP32 (override_state_format)");
  };
  if (where) {
    for (const Position& x : *where) check(x.first, x.second);
    return;
  }
  for (size_t gi = 0; gi < param_groups_.size(); ++gi)
    for (size_t i = 0; i < param_groups_[gi].params().size(); ++i) check(gi, i);
}

std::vector<LowbitOptimizer::Position> LowbitOptimizer::positions(const std::unordered_set<c10::TensorImpl*>* only) {
  std::vector<Position> out;
  if (!only) {
    for (size_t gi = 0; gi < param_groups_.size(); ++gi)
      for (size_t i = 0; i < param_groups_[gi].params().size(); ++i) out.emplace_back(gi, i);
    return out;
  }
  const auto valid = [this](c10::TensorImpl* t, const Position& x) {
    return x.first < param_groups_.size() && x.second < param_groups_[x.first].params().size() &&
           param_groups_[x.first].params()[x.second].unsafeGetTensorImpl() == t;
  };
  bool rebuilt = false;
  for (c10::TensorImpl* t : *only) {
    auto it = position_index_.find(t);
    if ((it == position_index_.end() || !valid(t, it->second)) && !rebuilt) {
      // The groups changed since the index was built (or it never was): build it again, once per call.
      position_index_.clear();
      for (size_t gi = 0; gi < param_groups_.size(); ++gi)
        for (size_t i = 0; i < param_groups_[gi].params().size(); ++i)
          position_index_[param_groups_[gi].params()[i].unsafeGetTensorImpl()] = Position(gi, i);
      rebuilt = true;
      it = position_index_.find(t);
    }
    if (it != position_index_.end() && valid(t, it->second)) out.push_back(it->second);  // else: not a parameter
  }
  std::sort(out.begin(), out.end());
  return out;
}

void LowbitOptimizer::check_grad(const at::Tensor& p, const at::Tensor& g, int64_t group, int64_t index) const {
  const auto where = [&] { return c10::str("parameter ", index, " of group ", group, " (shape ", p.sizes(), ")"); };
  TORCH_CHECK(!g.is_sparse(), name(), ": ", where(), " has a sparse gradient; lowbit optimizers need dense gradients");
  TORCH_CHECK(p.layout() == at::kStrided, name(), ": ", where(), " is not a dense tensor");
  const auto ok = [](at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; };
  TORCH_CHECK(ok(p.scalar_type()), name(), ": ", where(), " has dtype ", p.scalar_type(),
              "; supported: float32, bfloat16, float16");
  TORCH_CHECK(ok(g.scalar_type()), name(), ": the gradient of ", where(), " has dtype ", g.scalar_type(),
              "; supported: float32, bfloat16, float16");
  TORCH_CHECK(g.device() == p.device(), name(), ": ", where(), " is on ", p.device(), " but its gradient is on ",
              g.device());
  TORCH_CHECK(g.sizes() == p.sizes(), name(), ": ", where(), " has a gradient of shape ", g.sizes());
}

StateLayout LowbitOptimizer::layout_of(const at::Tensor& p, const torch::optim::OptimizerOptions& options) const {
  const CommonOptions c = common(options);
  auto ov = overrides_.find(p.unsafeGetTensorImpl());
  return state_layout(config(options), ov != overrides_.end() ? ov->second : c.state_format, p.numel(), c.block_size,
                      c.min_quant_numel, c.fp8_second_moment, name(), c.master_weight_bits);
}

ParamState LowbitOptimizer::make_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                                       const std::vector<at::Tensor>& values, int64_t numel) const {
  if (numel < 0) numel = p.numel();
  const CommonOptions c = common(options);
  ParamState st;
  st.counters = at::zeros({2}, p.options().dtype(at::kLong));
  const StateLayout layout = layout_of(p, options);
  st.format = layout.format;
  st.block_size = layout.block_size;
  if (c.master_weight_bits != 0) {
    TORCH_CHECK(p.scalar_type() == at::kBFloat16, name(), ": master_weight_bits ", c.master_weight_bits,
                " needs bfloat16 parameters; this one (shape ", p.sizes(), ") is ", p.scalar_type(),
                " (fp32 parameters are their own master weights)");
    TORCH_CHECK(!c.bf16_stochastic_round, name(), ": master_weight_bits ", c.master_weight_bits,
                " and bf16_stochastic_round exclude each other: the correction keeps what rounding to bf16 drops");
  }
  st.slots.resize(layout.slots.size());
  const auto fopts = p.options().dtype(at::kFloat);
  for (size_t k = 0; k < layout.slots.size(); ++k) {
    StateSlot& s = st.slots[k];
    s.type = layout.slots[k];
    if (!s.defined()) continue;
    if (kernels::is_correction(s.type.storage)) {
      // The master starts as the parameter itself: a zero correction.
      s.dense = at::zeros({numel}, p.options().dtype(s.type.storage == kernels::SlotStorage::Int16 ? at::kShort
                                                                                                    : at::kChar));
      continue;
    }
    at::Tensor init = k < values.size() && values[k].defined()
                          ? values[k].detach().to(p.device(), at::kFloat).reshape({numel})
                          : at::full({numel}, initial_state_value(options, static_cast<int>(k)), fopts);
    if (s.type.storage == kernels::SlotStorage::Quant) {
      s.quantized = quantize(init, s.type.format, st.block_size);
    } else {
      s.dense = init.to(s.type.storage == kernels::SlotStorage::BF16 ? at::kBFloat16 : at::kFloat).clone();
    }
  }
  return st;
}

ParamState& LowbitOptimizer::ensure_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                                          int64_t group, int64_t index) {
  auto it = states_.find(p.unsafeGetTensorImpl());
  if (it != states_.end()) {
    const at::Device d = it->second.counters.device();
    TORCH_CHECK(d == p.device(), name(), ": parameter ", index, " of group ", group, " is on ", p.device(),
                " but its optimizer state is on ", d, "; move the parameter back or recreate the optimizer");
    return it->second;
  }
  state_changed();
  return states_.emplace(p.unsafeGetTensorImpl(), make_state(p, options, {})).first->second;
}

at::Tensor LowbitOptimizer::lr_tensor(size_t group, at::Device device) {
  if (lr_tensors_.size() < param_groups_.size()) lr_tensors_.resize(param_groups_.size());
  const double lr = param_groups_[group].options().get_lr();
  // Also what options().lr(x) set, which bypasses set_lr's check.
  TORCH_CHECK(std::isfinite(lr) && lr >= 0, name(), ": group ", group, " has learning rate ", lr,
              "; it must be finite and >= 0");
  for (LrTensor& t : lr_tensors_[group]) {
    if (t.value.device() != device) continue;
    if (t.written != lr) {
      t.value.fill_(lr);  // a kernel on a GPU: no synchronization
      t.written = lr;
    }
    return t.value;
  }
  lr_tensors_[group].push_back({at::full({1}, lr, at::TensorOptions().dtype(at::kDouble).device(device)), lr});
  return lr_tensors_[group].back().value;
}

void LowbitOptimizer::refresh_lr() {
  for (size_t gi = 0; gi < lr_tensors_.size(); ++gi)
    for (const LrTensor& t : std::vector<LrTensor>(lr_tensors_[gi])) lr_tensor(gi, t.value.device());
}

torch::Tensor LowbitOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  step_only(nullptr);
  return loss;
}

void LowbitOptimizer::step_parameters(const std::vector<at::Tensor>& params, const at::Tensor& found_inf) {
  std::unordered_set<c10::TensorImpl*> only;
  for (const at::Tensor& p : params) only.insert(p.unsafeGetTensorImpl());
  step_only(&only, found_inf);
}

// A device's gradients, for the pre-pass (the skip decision and the norms for clipping).
struct LowbitOptimizer::DeviceGrads {
  at::Device device;
  std::vector<at::Tensor> grads;
  std::vector<int64_t> groups;
  at::Tensor found_inf, sumsq;
};

StepInputs LowbitOptimizer::step_inputs() const {
  StepInputs in;
  in.state_epoch = state_epoch_;
  in.recordable = true;
  for (const auto& group : param_groups_) {
    in.groups.push_back({config(group.options()), common(group.options())});
    for (const at::Tensor& p : group.params())
      if (!add_step_input(p, in)) return in;
  }
  in.recordable = in.device.has_value();
  return in;
}

void LowbitOptimizer::step_only(const std::unordered_set<c10::TensorImpl*>* only, const at::Tensor& found_inf) {
  torch::NoGradGuard no_grad;
  check_groups();
  // ---- a recorded step whose inputs these are: replay it.
  const bool graphs = only == nullptr && path_ == StepPath::Fused && step_graph_->enabled();
  StepInputs inputs;
  if (graphs) {
    inputs = step_inputs();
    if (inputs.recordable && step_graph_->matches(inputs)) {
      refresh_lr();
      step_graph_->replay();
      // What the op does at every call it makes (tensors/optim_ops.h): autograd sees the change.
      for (const auto& group : param_groups_)
        for (const at::Tensor& p : group.params())
          if (p.grad().defined()) p.unsafeGetTensorImpl()->bump_version();
      ++steps_called_;
      if (overflow_check_interval_ > 0 && steps_called_ % overflow_check_interval_ == 0) check_overflow_on(false);
      return;
    }
  }
  // ---- check: every parameter with a gradient, grouped by device for the pre-pass.
  const std::vector<Position> where = positions(only);
  std::vector<DeviceGrads> devices;
  bool want_sumsq = false, any_grad = false;
  std::vector<bool> prepass(param_groups_.size());
  // LAMB's first pass reads every gradient anyway: on the CPU the non-finite check rides on it
  // (lamb_check below), for a group that skips and does not clip (clipping needs the gradients'
  // norm before that pass) whose parameters in this step have their state made (a first step keeps
  // the pre-pass, so that a skipped group makes no state), in a step of CPU parameters only (the
  // flag it sets is the CPU's alone). Not where the caller gives found_inf: then there is no
  // pre-pass to spare.
  std::vector<char> lamb_check(param_groups_.size(), 0);
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const CommonOptions c = common(param_groups_[gi].options());
    want_sumsq |= c.max_grad_norm > 0;
    prepass[gi] = c.skip_nonfinite || c.max_grad_norm > 0;
    lamb_check[gi] = !found_inf.defined() && c.skip_nonfinite && c.max_grad_norm == 0 &&
                     config(param_groups_[gi].options()).rule == kernels::Rule::LAMB;
  }
  if (std::any_of(lamb_check.begin(), lamb_check.end(), [](char c) { return c != 0; })) {
    bool cpu_only = true;
    for (const auto& [gi, i] : where) {
      const at::Tensor& p = param_groups_[gi].params()[i];
      if (!p.grad().defined()) continue;
      cpu_only &= p.is_cpu();
      if (states_.count(p.unsafeGetTensorImpl()) == 0) lamb_check[gi] = 0;
    }
    if (!cpu_only) std::fill(lamb_check.begin(), lamb_check.end(), 0);
  }
  for (const auto& [gi, i] : where) {
    const at::Tensor& p = param_groups_[gi].params()[i];
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    check_grad(p, g, gi, i);
    // A given flag is checked whether or not this step reads it (no group skips, or one clips).
    TORCH_CHECK(!found_inf.defined() || (found_inf.scalar_type() == at::kFloat && found_inf.numel() == 1 &&
                                         found_inf.device() == g.device()),
                name(), ": step_parameters: found_inf must be a float tensor of one element on the gradients' device (",
                g.device(), "; grad_check's flag), got ", found_inf.scalar_type(), " of shape ", found_inf.sizes(),
                " on ", found_inf.device());
    any_grad = true;
    if (!prepass[gi] || lamb_check[gi]) continue;
    auto d = std::find_if(devices.begin(), devices.end(), [&](const DeviceGrads& x) { return x.device == g.device(); });
    if (d == devices.end()) d = devices.insert(devices.end(), DeviceGrads{g.device(), {}, {}, {}, {}});
    d->grads.push_back(g);
    d->groups.push_back(static_cast<int64_t>(gi));
  }
  if (!any_grad) return;
  if (found_inf.defined() && !want_sumsq)
    for (DeviceGrads& d : devices) d.found_inf = found_inf.reshape({1});
  ++steps_called_;

  // ---- the step: recorded (then replayed once) where its inputs repeat the last step's, else as it comes.
  bool stepped_cpu = false;
  std::unique_ptr<ops::Recording> recording;
  if (graphs && inputs.recordable && step_graph_->repeats(inputs)) {
    refresh_lr();  // lr is written outside the recording: the replays read whatever it is then
    try {
      recording = ops::record(*inputs.device, [&] { enqueue_step(devices, want_sumsq, lamb_check, where, &stepped_cpu); });
    } catch (const std::exception& e) {
      TORCH_WARN("lowbit: ", name(), ": recording a step as a CUDA graph failed, so steps run as they come: ", e.what());
      step_graph_->give_up();
    }
  }
  if (recording) {
    recording->replay();
    step_graph_->keep(std::move(recording), std::move(inputs));
  } else {
    enqueue_step(devices, want_sumsq, lamb_check, where, &stepped_cpu);
    if (graphs) step_graph_->remember(std::move(inputs));
  }

  // ---- overflow: free to read on the CPU; GPU counters only every n steps if asked. A step of
  // GPU parameters alone skips the pass (over thousands of tensors it is a cache miss or two each).
  const bool interval_due = overflow_check_interval_ > 0 && steps_called_ % overflow_check_interval_ == 0;
  if (interval_due) check_overflow_on(false);
  else if (stepped_cpu) check_overflow_on(true, &where);
}

void LowbitOptimizer::enqueue_step(std::vector<DeviceGrads>& devices, bool want_sumsq,
                                   const std::vector<char>& lamb_check, const std::vector<Position>& where,
                                   bool* stepped_cpu) {
  // ---- pre-pass: one read of every gradient, on its device: is anything non-finite (then the
  // step is skipped for every group that skips), and each group's squared norm for clipping.
  const int64_t ngroups = static_cast<int64_t>(param_groups_.size());
  for (DeviceGrads& d : devices)
    if (!d.found_inf.defined()) std::tie(d.found_inf, d.sumsq) = ops::grad_check(d.grads, d.groups, ngroups, want_sumsq);

  // `where` is in group order: each group's positions.
  std::vector<std::pair<size_t, size_t>> range(param_groups_.size(), {0, 0});
  for (size_t next = 0; next < where.size();) {
    const size_t gi = where[next].first, first = next;
    while (next < where.size() && where[next].first == gi) ++next;
    range[gi] = {first, next};
  }
  // A group's op calls (states made where missing); they read the pre-pass through `devices`.
  const auto group_calls = [&](size_t gi) {
    auto& group = param_groups_[gi];
    GroupStep gs = group_step(gi);
    const bool prepass = gs.common.skip_nonfinite || gs.common.max_grad_norm > 0;
    gs.grad_checks = [&devices, gi, prepass](at::Device device) {
      const auto d = std::find_if(devices.begin(), devices.end(), [&](const DeviceGrads& x) { return x.device == device; });
      if (!prepass) return GradChecks{};  // this group neither skips nor clips: no pre-pass was asked for it
      TORCH_INTERNAL_ASSERT(d != devices.end(), "no gradient pre-pass on ", device);
      return GradChecks{d->found_inf, d->sumsq.defined() ? d->sumsq.narrow(0, static_cast<int64_t>(gi), 1) : at::Tensor()};
    };
    auto calls = std::make_unique<StepCalls>(std::move(gs), range[gi].second - range[gi].first);
    for (size_t k = range[gi].first; k < range[gi].second; ++k) {
      const size_t i = where[k].second;
      at::Tensor& p = group.params()[i];
      const at::Tensor& grad = p.grad();  // once: each grad() asks autograd whether p is a leaf
      if (!grad.defined()) continue;
      ParamState& st = ensure_state(p, group.options(), gi, i);
      *stepped_cpu |= p.is_cpu();
      calls->add(p, grad, st, 0, param_rng_key(gi, i));
    }
    return calls;
  };

  // ---- LAMB's first pass where the check rides on it (step_only: lamb_check; a step of CPU
  // parameters only), before any group steps: a non-finite gradient there skips every group that
  // skips, as the pre-pass's would.
  std::vector<std::unique_ptr<StepCalls>> first_passed(param_groups_.size());
  if (std::any_of(lamb_check.begin(), lamb_check.end(), [](char c) { return c != 0; })) {
    auto cpu = std::find_if(devices.begin(), devices.end(), [](const DeviceGrads& x) { return x.device.is_cpu(); });
    if (cpu == devices.end()) cpu = devices.insert(devices.end(), DeviceGrads{at::kCPU, {}, {}, at::zeros({1}), {}});
    const at::Tensor cpu_found = cpu->found_inf;
    bool found = false;
    for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
      if (!lamb_check[gi] || range[gi].first == range[gi].second) continue;
      first_passed[gi] = group_calls(gi);
      found |= first_passed[gi]->lamb_first_pass();
    }
    if (found) cpu_found.fill_(1.0f);
  }
  if (devices.size() > 1) {
    // Parameters on several devices: the skip and the norms cover all of them (cross-device copies;
    // the norm adds the devices' partial sums, so clipping may differ from one device in the last bit).
    at::Tensor found = devices[0].found_inf, sumsq = devices[0].sumsq;
    for (size_t k = 1; k < devices.size(); ++k) {
      found = at::maximum(found, devices[k].found_inf.to(found.device()));
      sumsq = sumsq + devices[k].sumsq.to(sumsq.device());
    }
    for (DeviceGrads& d : devices) {
      d.found_inf = found.to(d.device);
      d.sumsq = sumsq.to(d.device);
    }
  }
  // On the CPU the skip is decided here: skipped groups' state is not even created.
  const bool cpu_found = !devices.empty() && count_skipped(skipped_, devices[0].found_inf);

  // ---- the calls: per group, one per (device, state layout).
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    if (range[gi].first == range[gi].second) continue;  // no parameter of this group in the step
    if (common(param_groups_[gi].options()).skip_nonfinite && cpu_found) continue;
    if (!first_passed[gi]) first_passed[gi] = group_calls(gi);  // no first pass made them
    first_passed[gi]->step();
  }
}

GroupStep LowbitOptimizer::group_step(size_t group) {
  GroupStep g;
  const auto& options = param_groups_[group].options();
  g.config = config(options);
  g.common = common(options);
  g.seed = seed_;
  g.reference = path_ == StepPath::Reference;
  g.scalar_loop = path_ == StepPath::ScalarLoop;
  g.lr = [this, group](at::Device device) { return lr_tensor(group, device); };
  return g;
}

void LowbitOptimizer::state_changed() {
  ++state_epoch_;
  step_graph_->forget();
}

void LowbitOptimizer::set_step_graphs(bool on) { step_graph_->set_enabled(on); }

int64_t LowbitOptimizer::step_graph_replays() const { return step_graph_->replays(); }

}  // namespace optim
}  // namespace lowbit
