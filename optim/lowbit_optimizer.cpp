// LowbitOptimizer: state creation, the step (checks, skip on non-finite gradients, clipping, the
// fused CPU kernel or the ATen reference elsewhere), accounting and checkpoints.
#include "lowbit_optimizer.h"

#include <torch/serialize.h>

#include <algorithm>
#include <cmath>

#include <lowbit/kernels/common/stochastic_round.h>
#include <lowbit/tensors/blockwise_ops.h>
#include <lowbit/tensors/optim_ops.h>


namespace lowbit {
namespace optim {

namespace {

constexpr int64_t kCheckpointMagic = 0x6C6F7762697401;  // "lowbit" + 1
constexpr int64_t kDenseWorkBlock = 1024;               // unit of work for FP32/BF16 state

int64_t read_int(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  TORCH_CHECK(a.try_read(key, v), "lowbit checkpoint: missing entry '", key, "'");
  TORCH_CHECK(v.isInt(), "lowbit checkpoint: entry '", key, "' is not an integer");
  return v.toInt();
}

double read_double(torch::serialize::InputArchive& a, const std::string& key) {
  c10::IValue v;
  TORCH_CHECK(a.try_read(key, v), "lowbit checkpoint: missing entry '", key, "'");
  TORCH_CHECK(v.isDouble(), "lowbit checkpoint: entry '", key, "' is not a number");
  return v.toDouble();
}

at::Tensor read_tensor(torch::serialize::InputArchive& a, const std::string& key) {
  at::Tensor t;
  TORCH_CHECK(a.try_read(key, t), "lowbit checkpoint: missing tensor '", key, "'");
  return t;
}

std::string param_key(size_t g, size_t i) { return "param/" + std::to_string(g) + "/" + std::to_string(i); }

}  // namespace

int64_t StateSlot::nbytes() const {
  if (is_quantized(storage)) return quantized.nbytes();
  return dense.defined() ? static_cast<int64_t>(dense.nbytes()) : 0;
}

at::Tensor StateSlot::to_float() const {
  if (is_quantized(storage)) return quantized.defined() ? quantized.dequantize() : at::Tensor();
  return dense.defined() ? dense.to(at::kFloat) : at::Tensor();
}

LowbitOptimizer::LowbitOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                                 std::unique_ptr<torch::optim::OptimizerOptions> defaults)
    : torch::optim::Optimizer(std::move(groups), std::move(defaults)) {}

void LowbitOptimizer::override_state_format(const at::Tensor& param, StateFormat format) {
  TORCH_CHECK(states_.find(param.unsafeGetTensorImpl()) == states_.end(), name(),
              ": override_state_format must come before the parameter's first step");
  overrides_[param.unsafeGetTensorImpl()] = format;
}

const ParamState* LowbitOptimizer::state_of(const at::Tensor& param) const {
  auto it = states_.find(param.unsafeGetTensorImpl());
  return it == states_.end() ? nullptr : &it->second;
}

std::vector<at::Tensor> LowbitOptimizer::export_state_fp32(const at::Tensor& param) const {
  std::vector<at::Tensor> out;
  if (const ParamState* st = state_of(param))
    for (const auto& s : st->slots) {
      at::Tensor t = s.to_float();
      out.push_back(t.defined() ? t.view(param.sizes()) : t);
    }
  return out;
}

int64_t LowbitOptimizer::state_bytes() const {
  int64_t total = 0;
  for (const auto& kv : states_)
    for (const auto& s : kv.second.slots) total += s.nbytes();
  return total;
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

ParamState LowbitOptimizer::make_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                                       const std::vector<at::Tensor>& values) const {
  const CommonOptions c = common(options);
  ParamState st;
  auto ov = overrides_.find(p.unsafeGetTensorImpl());
  st.format = ov != overrides_.end() ? ov->second : c.state_format;
  // Decided on the whole parameter's numel, so a shard never changes a tensor's state format.
  if (is_quantized(st.format) && p.numel() < c.min_quant_numel) st.format = StateFormat::FP32;
  if (is_quantized(st.format)) {
    const QuantFormat probe = quant_format_for(st.format, true);
    st.block_size = resolve_block_size(probe, c.block_size, name());
  } else {
    st.block_size = kDenseWorkBlock;
  }
  const kernels::SlotSpec spec = kernels::rule_slots(rule(), hyper(options, 1));
  st.slots.resize(spec.count);
  const auto fopts = p.options().dtype(at::kFloat);
  for (int k = 0; k < spec.count; ++k) {
    StateSlot& s = st.slots[k];
    if (!slot_used(options, k)) continue;
    at::Tensor init = k < static_cast<int>(values.size()) && values[k].defined()
                          ? values[k].detach().to(p.device(), at::kFloat).reshape({p.numel()})
                          : at::full({p.numel()}, initial_state_value(options, k), fopts);
    s.storage = st.format;
    if (is_quantized(st.format)) {
      s.quantized = quantize(init, quant_format_for(st.format, spec.is_signed[k], c.fp8_second_moment), st.block_size);
    } else {
      s.dense = init.to(st.format == StateFormat::BF16 ? at::kBFloat16 : at::kFloat).clone();
    }
  }
  return st;
}

ParamState& LowbitOptimizer::ensure_state(const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                                          int64_t group, int64_t index) {
  auto it = states_.find(p.unsafeGetTensorImpl());
  if (it != states_.end()) {
    for (const auto& s : it->second.slots) {
      const at::Device d = is_quantized(s.storage) ? (s.quantized.defined() ? s.quantized.device() : p.device())
                                                  : (s.dense.defined() ? s.dense.device() : p.device());
      TORCH_CHECK(d == p.device(), name(), ": parameter ", index, " of group ", group, " is on ", p.device(),
                  " but its optimizer state is on ", d, "; move the parameter back or recreate the optimizer");
    }
    return it->second;
  }
  return states_.emplace(p.unsafeGetTensorImpl(), make_state(p, options, {})).first->second;
}

torch::Tensor LowbitOptimizer::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // One read of every gradient first: a non-finite one anywhere skips the whole step (parameters
  // and state stay as they are), and the sums of squares serve gradient clipping.
  bool want_sumsq = false;
  for (const auto& group : param_groups_) want_sumsq |= common(group.options()).max_grad_norm > 0;
  std::vector<at::Tensor> all_grads;
  std::vector<std::pair<size_t, size_t>> where;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& params = param_groups_[gi].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& g = params[i].grad();
      if (!g.defined()) continue;
      check_grad(params[i], g, gi, i);
      all_grads.push_back(g);
      where.emplace_back(gi, i);
    }
  }
  if (all_grads.empty()) return loss;
  const auto [finite, sq] = ops::grad_stats(all_grads, want_sumsq);
  if (!finite.all().item<bool>()) {
    ++skipped_steps_;
    return loss;
  }
  std::vector<double> group_sumsq(param_groups_.size(), 0.0);
  const double* sqd = sq.data_ptr<double>();
  for (size_t k = 0; k < where.size(); ++k) group_sumsq[where[k].first] += sqd[k];

  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    auto& group = param_groups_[gi];
    const auto& options = group.options();
    const CommonOptions c = common(options);
    double grad_scale = 1.0;
    if (c.max_grad_norm > 0) {
      // torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) when that is below 1.
      const double coef = c.max_grad_norm / (std::sqrt(group_sumsq[gi]) + 1e-6);
      if (coef < 1.0) grad_scale = static_cast<float>(coef);
    }
    // The arguments of lowbit::optim_step_ (tensors/optim_ops.h) for every parameter with a gradient.
    std::vector<at::Tensor> params, grads, states;
    std::vector<int64_t> kinds, blocks, seeds, flags;
    std::vector<double> hyper_values;
    for (size_t i = 0; i < group.params().size(); ++i) {
      at::Tensor& p = group.params()[i];
      if (!p.grad().defined()) continue;
      ParamState& st = ensure_state(p, options, gi, i);
      st.step += 1;
      params.push_back(p);
      grads.push_back(p.grad());
      for (size_t k = 0; k < 3; ++k) {
        const StateSlot* s = k < st.slots.size() ? &st.slots[k] : nullptr;
        if (s && is_quantized(s->storage) && s->quantized.defined()) {
          kinds.push_back(ops::kSlotQuantized + static_cast<int64_t>(s->quantized.format()));
          states.push_back(s->quantized.codes());
          states.push_back(s->quantized.absmax());
        } else if (s && s->dense.defined()) {
          kinds.push_back(s->storage == StateFormat::BF16 ? ops::kSlotBF16 : ops::kSlotF32);
          states.push_back(s->dense);
        } else {
          kinds.push_back(ops::kSlotNone);
        }
      }
      blocks.push_back(st.block_size);
      const size_t at = hyper_values.size();
      hyper_values.resize(at + kernels::kHyperFields);
      kernels::pack_hyper(hyper(options, st.step), hyper_values.data() + at);
      const uint64_t seed =
          kernels::mix64(seed_ ^ kernels::mix64(static_cast<uint64_t>(st.step) * 1000003u + gi * 7919u + i));
      seeds.push_back(static_cast<int64_t>(seed));
      flags.push_back(c.bf16_stochastic_round ? ops::kFlagStochasticRound : 0);
    }
    if (params.empty()) continue;
    const at::Tensor nonfinite = ops::optim_step(static_cast<int64_t>(rule()), params, grads, states, kinds, blocks,
                                                 hyper_values, seeds, flags, grad_scale, force_scalar_, force_reference_);
    // A state that overflowed cannot be stored (its blocks decode to NaN): say so rather than go on.
    const int64_t* bad = nonfinite.data_ptr<int64_t>();
    for (size_t k = 0, i = 0; k < params.size(); ++k, ++i) {
      while (!group.params()[i].grad().defined()) ++i;
      TORCH_CHECK(bad[k] == 0, name(), ": the state of parameter ", i, " of group ", gi, " (shape ", params[k].sizes(),
                  ") overflowed to Inf/NaN in ", bad[k], " block(s) at step ", state_of(params[k])->step,
                  "; the parameter is updated but that state is lost. Lower the learning rate, clip gradients "
                  "(max_grad_norm), or keep this parameter's state in FP32 (override_state_format)");
    }
  }
  return loss;
}

// ---- checkpoints --------------------------------------------------------------------------------
// Entries: magic, version, optimizer name, seed, skipped steps, per group its lr and parameter
// count, per parameter a fragment (element offset 0, numel), step, format, block size and each
// slot's storage with its tensors (codes + absmax for quantized state, never expanded).

void LowbitOptimizer::save(torch::serialize::OutputArchive& a) const {
  a.write("lowbit/magic", c10::IValue(kCheckpointMagic));
  a.write("lowbit/version", c10::IValue(kCheckpointVersion));
  a.write("lowbit/optimizer", c10::IValue(std::string(name())));
  a.write("lowbit/seed", c10::IValue(static_cast<int64_t>(seed_)));
  a.write("lowbit/skipped_steps", c10::IValue(skipped_steps_));
  a.write("lowbit/groups", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& group = param_groups_[gi];
    const std::string gk = "group/" + std::to_string(gi);
    a.write(gk + "/lr", c10::IValue(group.options().get_lr()));
    a.write(gk + "/params", c10::IValue(static_cast<int64_t>(group.params().size())));
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string k = param_key(gi, i);
      a.write(k + "/numel", c10::IValue(p.numel()));
      a.write(k + "/offset", c10::IValue(int64_t(0)));
      const ParamState* st = state_of(p);
      a.write(k + "/has_state", c10::IValue(int64_t(st ? 1 : 0)));
      if (!st) continue;
      a.write(k + "/step", c10::IValue(st->step));
      a.write(k + "/format", c10::IValue(static_cast<int64_t>(st->format)));
      a.write(k + "/block_size", c10::IValue(st->block_size));
      a.write(k + "/slots", c10::IValue(static_cast<int64_t>(st->slots.size())));
      for (size_t s = 0; s < st->slots.size(); ++s) {
        const StateSlot& slot = st->slots[s];
        const std::string sk = k + "/slot/" + std::to_string(s);
        const bool present = is_quantized(slot.storage) ? slot.quantized.defined() : slot.dense.defined();
        a.write(sk + "/storage", c10::IValue(present ? static_cast<int64_t>(slot.storage) : int64_t(-1)));
        if (!present) continue;
        if (is_quantized(slot.storage)) {
          a.write(sk + "/qformat", c10::IValue(static_cast<int64_t>(slot.quantized.format())));
          a.write(sk + "/codes", slot.quantized.codes().cpu());
          a.write(sk + "/absmax", slot.quantized.absmax().cpu());
        } else {
          a.write(sk + "/values", slot.dense.cpu());
        }
      }
    }
  }
}

void LowbitOptimizer::load_torch_adam(torch::serialize::InputArchive& a) {
  TORCH_CHECK(rule() == kernels::Rule::Adam || rule() == kernels::Rule::AdamW, name(),
              ": this is a libtorch optimizer checkpoint; only lowbit's Adam and AdamW read those (of "
              "torch::optim::Adam / AdamW)");
  torch::serialize::InputArchive groups_archive, state_archive;
  TORCH_CHECK(a.try_read("param_groups", groups_archive) && a.try_read("state", state_archive), name(),
              ": libtorch checkpoint without param_groups / state");
  at::Tensor ngroups;
  groups_archive.read("param_groups/size", ngroups);
  TORCH_CHECK(ngroups.item<int64_t>() == static_cast<int64_t>(param_groups_.size()), name(), ": the checkpoint has ",
              ngroups.item<int64_t>(), " parameter groups, this optimizer has ", param_groups_.size());
  std::unordered_map<c10::TensorImpl*, ParamState> states;
  std::vector<double> lrs;
  const auto state_keys = state_archive.keys();
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& group = param_groups_[gi];
    torch::serialize::InputArchive ga, opts;
    groups_archive.read("param_groups/" + std::to_string(gi), ga);
    at::Tensor n;
    ga.read("params/size", n);
    TORCH_CHECK(n.item<int64_t>() == static_cast<int64_t>(group.params().size()), name(), ": group ", gi,
                " of the checkpoint has ", n.item<int64_t>(), " parameters, this optimizer's has ", group.params().size());
    c10::IValue lr;
    ga.read("options", opts);
    lrs.push_back(opts.try_read("lr", lr) && lr.isDouble() ? lr.toDouble() : group.options().get_lr());
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      c10::IValue key;
      ga.read("params/" + std::to_string(i), key);
      if (std::find(state_keys.begin(), state_keys.end(), key.toStringRef()) == state_keys.end()) continue;
      torch::serialize::InputArchive ps;
      state_archive.read(key.toStringRef(), ps);
      c10::IValue step, m, v, vmax;
      TORCH_CHECK(ps.try_read("step", step) && ps.try_read("exp_avg", m) && ps.try_read("exp_avg_sq", v), name(),
                  ": parameter ", i, " of group ", gi, ": the libtorch state lacks step / exp_avg / exp_avg_sq");
      TORCH_CHECK(m.toTensor().numel() == p.numel() && v.toTensor().numel() == p.numel(), name(), ": parameter ", i,
                  " of group ", gi, " has ", p.numel(), " elements but its libtorch state has ", m.toTensor().numel());
      std::vector<at::Tensor> values = {m.toTensor(), v.toTensor()};
      if (ps.try_read("max_exp_avg_sq", vmax) && vmax.isTensor() && vmax.toTensor().defined())
        values.push_back(vmax.toTensor());
      ParamState st = make_state(p, group.options(), values);
      st.step = step.toInt();
      states.emplace(p.unsafeGetTensorImpl(), std::move(st));
    }
  }
  states_ = std::move(states);
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) param_groups_[gi].options().set_lr(lrs[gi]);
}

void LowbitOptimizer::load(torch::serialize::InputArchive& a) {
  c10::IValue torch_version;
  if (a.try_read("pytorch_version", torch_version)) return load_torch_adam(a);
  // Everything is read and checked into new containers first: a bad checkpoint leaves the
  // optimizer exactly as it was.
  c10::IValue magic;
  TORCH_CHECK(a.try_read("lowbit/magic", magic) && magic.isInt() && magic.toInt() == kCheckpointMagic, name(),
              ": not a lowbit optimizer checkpoint (no lowbit magic number)");
  const int64_t version = read_int(a, "lowbit/version");
  TORCH_CHECK(version == kCheckpointVersion, name(), ": checkpoint format version ", version,
              " is not supported (this build reads version ", kCheckpointVersion, ")");
  c10::IValue who;
  TORCH_CHECK(a.try_read("lowbit/optimizer", who) && who.isString(), "lowbit checkpoint: missing optimizer name");
  TORCH_CHECK(who.toStringRef() == name(), name(), ": the checkpoint was written by ", who.toStringRef());
  const int64_t groups = read_int(a, "lowbit/groups");
  TORCH_CHECK(groups == static_cast<int64_t>(param_groups_.size()), name(), ": the checkpoint has ", groups,
              " parameter groups, this optimizer has ", param_groups_.size());
  std::unordered_map<c10::TensorImpl*, ParamState> states;
  std::vector<double> lrs;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& group = param_groups_[gi];
    const std::string gk = "group/" + std::to_string(gi);
    lrs.push_back(read_double(a, gk + "/lr"));
    const int64_t n = read_int(a, gk + "/params");
    TORCH_CHECK(n == static_cast<int64_t>(group.params().size()), name(), ": group ", gi, " of the checkpoint has ", n,
                " parameters, this optimizer's has ", group.params().size());
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string k = param_key(gi, i);
      const int64_t numel = read_int(a, k + "/numel");
      TORCH_CHECK(numel == p.numel(), name(), ": parameter ", i, " of group ", gi, " has ", p.numel(),
                  " elements but the checkpoint's has ", numel);
      TORCH_CHECK(read_int(a, k + "/offset") == 0, name(), ": parameter fragments are not supported here");
      if (read_int(a, k + "/has_state") == 0) continue;
      ParamState st;
      st.step = read_int(a, k + "/step");
      const int64_t fmt = read_int(a, k + "/format");
      TORCH_CHECK(fmt >= 0 && fmt <= 4 && st.step >= 0, name(), ": corrupt checkpoint entry for ", k);
      st.format = static_cast<StateFormat>(fmt);
      st.block_size = read_int(a, k + "/block_size");
      const int64_t nslots = read_int(a, k + "/slots");
      TORCH_CHECK(nslots == kernels::rule_slots(rule(), hyper(group.options(), 1)).count, name(),
                  ": the checkpoint's state of ", k, " has ", nslots, " slots, expected ",
                  kernels::rule_slots(rule(), hyper(group.options(), 1)).count);
      st.slots.resize(nslots);
      for (int64_t s = 0; s < nslots; ++s) {
        const std::string sk = k + "/slot/" + std::to_string(s);
        const int64_t storage = read_int(a, sk + "/storage");
        if (storage < 0) continue;
        TORCH_CHECK(storage <= 4, name(), ": corrupt storage id in ", sk);
        StateSlot& slot = st.slots[s];
        slot.storage = static_cast<StateFormat>(storage);
        if (is_quantized(slot.storage)) {
          const int64_t qf = read_int(a, sk + "/qformat");
          TORCH_CHECK(is_valid_format(static_cast<int32_t>(qf)), name(), ": corrupt quantization format in ", sk);
          // The QTensor constructor checks that codes and absmax fit the shape and block size.
          slot.quantized = QTensor(read_tensor(a, sk + "/codes"), read_tensor(a, sk + "/absmax"), {numel},
                                   static_cast<QuantFormat>(qf), st.block_size)
                               .to(p.device());
        } else {
          at::Tensor v = read_tensor(a, sk + "/values");
          TORCH_CHECK(v.numel() == numel, name(), ": state ", sk, " has ", v.numel(), " values, expected ", numel);
          TORCH_CHECK(v.scalar_type() == (slot.storage == StateFormat::BF16 ? at::kBFloat16 : at::kFloat), name(),
                      ": state ", sk, " has dtype ", v.scalar_type());
          slot.dense = v.reshape({numel}).to(p.device()).clone();
        }
      }
      states.emplace(p.unsafeGetTensorImpl(), std::move(st));
    }
  }
  const int64_t seed = read_int(a, "lowbit/seed");
  const int64_t skipped = read_int(a, "lowbit/skipped_steps");
  // Commit.
  states_ = std::move(states);
  seed_ = static_cast<uint64_t>(seed);
  skipped_steps_ = skipped;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) param_groups_[gi].options().set_lr(lrs[gi]);
}

}  // namespace optim
}  // namespace lowbit
