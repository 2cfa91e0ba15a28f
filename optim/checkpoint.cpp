// Checkpoints of lowbit's optimizers (torch::save / torch::load), and import of libtorch's Adam /
// AdamW checkpoints. Entries: magic, version, optimizer name, seed, skipped steps, per group its lr
// and parameter count, per parameter a fragment (element offset, numel), step, format, block size
// and each slot's storage with its tensors (codes + absmax for quantized state, never expanded).
// Version 2 adds a digest per tensor and one over the header (checkpoint_reader.h); version 1
// still loads. A bad checkpoint is refused before anything is assigned, and so is state in another
// layout than this optimizer's (format, block size, slot formats) unless the caller asks to convert
// it (LoadOptions).
#include <torch/serialize.h>

#include <algorithm>
#include <map>

#include "../tensors/quant_format.h"

#include "checkpoint_reader.h"
#include "lowbit_optimizer.h"
#include "state_layout.h"

namespace lowbit {
namespace optim {

namespace {

std::string param_key(size_t g, size_t i) { return "param/" + std::to_string(g) + "/" + std::to_string(i); }

// A slot's storage id in checkpoints (checkpoint_reader.h: storage_id_of): its state format's (FP32,
// BF16, or for a quantized one the parameter's Q8 / Q4 / FP8 / C8, its QuantFormat beside it), or
// a master-weight correction (5: int16, 6: int8); -1 for an unused slot.
int64_t storage_id(const StateSlot& s, StateFormat param_format) {
  switch (s.type.storage) {
    case kernels::SlotStorage::None: return -1;
    case kernels::SlotStorage::F32: return storage_id_of(StateFormat::FP32);
    case kernels::SlotStorage::BF16: return storage_id_of(StateFormat::BF16);
    case kernels::SlotStorage::Quant: return storage_id_of(param_format);
    case kernels::SlotStorage::Int16: return kStorageInt16Correction;
    case kernels::SlotStorage::Int8: return kStorageInt8Correction;
  }
  return -1;
}

// Collects the entries, then writes them with version 2's digests: one per tensor, one over the header.
class Writer {
 public:
  void put(const std::string& key, c10::IValue v) { entries_.emplace(key, std::move(v)); }
  void put(const std::string& key, const at::Tensor& t) {
    tensors_.emplace(key, t.cpu());
    entries_.emplace(key + "/digest", c10::IValue(tensor_digest(key, tensors_.at(key))));
  }
  void write(torch::serialize::OutputArchive& a) const {
    for (const auto& [k, v] : entries_) a.write(k, v);
    for (const auto& [k, t] : tensors_) a.write(k, t);
    a.write("lowbit/header_digest", c10::IValue(header_digest(entries_)));
  }

 private:
  std::map<std::string, c10::IValue> entries_;
  std::map<std::string, at::Tensor> tensors_;
};

}  // namespace

void LowbitOptimizer::save(torch::serialize::OutputArchive& a) const {
  // A state lost to overflow is reported before it is written (GPU counters are read here).
  check_overflow_on(false);
  Writer w;
  w.put("lowbit/magic", c10::IValue(kCheckpointMagic));
  w.put("lowbit/version", c10::IValue(kCheckpointVersion));
  w.put("lowbit/optimizer", c10::IValue(std::string(name())));
  w.put("lowbit/seed", c10::IValue(static_cast<int64_t>(seed_)));
  w.put("lowbit/skipped_steps", c10::IValue(skipped_steps()));
  w.put("lowbit/groups", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& group = param_groups_[gi];
    const std::string gk = "group/" + std::to_string(gi);
    w.put(gk + "/lr", c10::IValue(group.options().get_lr()));
    w.put(gk + "/params", c10::IValue(static_cast<int64_t>(group.params().size())));
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const std::string k = param_key(gi, i);
      w.put(k + "/numel", c10::IValue(p.numel()));
      w.put(k + "/offset", c10::IValue(int64_t(0)));
      const ParamState* st = state_of(p);
      w.put(k + "/has_state", c10::IValue(int64_t(st ? 1 : 0)));
      if (!st) continue;
      w.put(k + "/step", c10::IValue(st->step()));
      w.put(k + "/format", c10::IValue(static_cast<int64_t>(st->format)));
      w.put(k + "/block_size", c10::IValue(st->block_size));
      w.put(k + "/slots", c10::IValue(static_cast<int64_t>(st->slots.size())));
      for (size_t s = 0; s < st->slots.size(); ++s) {
        const StateSlot& slot = st->slots[s];
        const std::string sk = k + "/slot/" + std::to_string(s);
        w.put(sk + "/storage", c10::IValue(storage_id(slot, st->format)));
        if (!slot.defined()) continue;
        if (slot.type.storage == kernels::SlotStorage::Quant) {
          w.put(sk + "/qformat", c10::IValue(static_cast<int64_t>(slot.quantized.format())));
          w.put(sk + "/codes", slot.quantized.codes());
          w.put(sk + "/absmax", slot.quantized.absmax());
        } else {
          w.put(sk + "/values", slot.dense);
        }
      }
    }
  }
  w.write(a);
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
      st.counters.fill_(0);
      st.counters[0] = step.toInt();
      states.emplace(p.unsafeGetTensorImpl(), std::move(st));
    }
  }
  states_ = std::move(states);
  state_changed();
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) param_groups_[gi].options().set_lr(lrs[gi]);
}

namespace {

// "parameter 1 of group 0 (param/0/1, shape [300])": how the loader names a parameter.
std::string param_where(size_t g, size_t i, const at::Tensor& p) {
  return c10::str("parameter ", i, " of group ", g, " (", param_key(g, i), ", shape ", p.sizes(), ")");
}

// The layout a checkpoint's state is stored in, for layout_difference.
StateLayout stored_layout(const ParamState& stored) {
  StateLayout l;
  l.format = stored.format;
  l.block_size = stored.block_size;
  for (const StateSlot& slot : stored.slots) l.slots.push_back(slot.type);
  return l;
}

}  // namespace

ParamState LowbitOptimizer::stored_state(const CheckpointParam& cp, const at::Tensor& p, size_t gi, size_t i) const {
  const auto& options = param_groups_[gi].options();
  const kernels::RuleSlots spec = kernels::rule_slots(config(options));
  const std::string k = param_key(gi, i);
  // A master-weight correction is the last slot; the checkpoint's must be what the options ask.
  const int64_t master_bits = common(options).master_weight_bits;
  const kernels::SlotType correction = correction_slot_type(master_bits, name());
  const bool corrected = correction.storage != kernels::SlotStorage::None;
  const int64_t nslots = static_cast<int64_t>(cp.slots.size());
  TORCH_CHECK(nslots == spec.count || nslots == kernels::kMaxSlots, name(), ": the checkpoint's state of ", k,
              " has ", nslots, " slots, expected ", corrected ? kernels::kMaxSlots : spec.count);
  const int64_t stored_correction = nslots == kernels::kMaxSlots ? cp.slots[kernels::kCorrectionSlot].storage : -1;
  const int64_t want_correction = !corrected ? -1
                                  : correction.storage == kernels::SlotStorage::Int16 ? kStorageInt16Correction
                                                                                      : kStorageInt8Correction;
  TORCH_CHECK(stored_correction == want_correction, name(), ": the checkpoint's ", k, " has ",
              stored_correction < 0 ? std::string("no master-weight correction")
                                    : "a master-weight correction (storage id " + std::to_string(stored_correction) + ")",
              " but master_weight_bits is ", master_bits);
  TORCH_CHECK(!corrected || p.scalar_type() == at::kBFloat16, name(), ": ", k,
              " carries a master-weight correction but the parameter is ", p.scalar_type(), ", not bfloat16");
  for (int64_t s = spec.count; s < nslots; ++s)
    TORCH_CHECK(s == kernels::kCorrectionSlot || cp.slots[s].storage < 0, name(), ": the checkpoint's ", k,
                "/slot/", s, " is stored, but ", kernels::rule_name(rule()), " does not use it");
  const auto format = static_cast<StateFormat>(cp.format);
  // Dense state: the work block every writer of this format used.
  if (!is_quantized(format)) {
    const int64_t want = state_layout(config(options), format, p.numel(), 0, 0, QuantFormat::FP8E4M3, name()).block_size;
    TORCH_CHECK(cp.block_size == want, name(), ": the checkpoint's ", k, "/block_size is ", cp.block_size, " for ",
                state_format_name(format), " state, expected ", want);
  }
  ParamState st;
  st.counters = at::zeros({2}, p.options().dtype(at::kLong));
  st.counters[0] = cp.step;
  st.format = format;
  st.block_size = cp.block_size;
  st.slots.resize(cp.slots.size());
  if (corrected) {
    StateSlot& slot = st.slots[kernels::kCorrectionSlot];
    slot.type = correction;
    slot.dense = cp.slots[kernels::kCorrectionSlot].values.reshape({cp.numel}).to(p.device()).clone();
  }
  for (int64_t s = 0; s < spec.count; ++s) {
    const CheckpointSlot& cs = cp.slots[s];
    const std::string sk = k + "/slot/" + std::to_string(s);
    TORCH_CHECK(spec.used[s] == (cs.storage >= 0), name(), ": the checkpoint's ", sk, " is ",
                cs.storage >= 0 ? "stored" : "absent", ", but ", kernels::rule_name(rule()),
                spec.used[s] ? " uses it" : " does not use it", " with these options");
    if (cs.storage < 0) continue;
    TORCH_CHECK(!is_correction_storage(cs.storage), name(), ": the checkpoint's ", sk,
                " holds a master-weight correction, which belongs in the last slot only");
    // Every slot in the parameter's format; a quantized one in the QuantFormat of its sign
    // (unsigned FP8 states may be in either float8 format: fp8_second_moment).
    const StateFormat storage = state_format_of_storage(cs.storage);
    TORCH_CHECK(storage == format, name(), ": the checkpoint's ", sk, " is stored as ", state_format_name(storage),
                " but the parameter's state is ", state_format_name(format));
    StateSlot& slot = st.slots[s];
    if (is_quantized(storage)) {
      const auto qf = static_cast<QuantFormat>(cs.qformat);
      const bool fits = qf == quant_format_for(format, spec.is_signed[s]) ||
                        (format == StateFormat::FP8 && !spec.is_signed[s] && qf == QuantFormat::FP8E5M2);
      TORCH_CHECK(fits, name(), ": the checkpoint's ", sk, " is quantized as ", format_name(qf), ", which is not a ",
                  spec.is_signed[s] ? "signed " : "unsigned ", state_format_name(format), " format");
      slot.type = {kernels::SlotStorage::Quant, qf};
      // Copies: the state never shares memory with the archive's tensors.
      slot.quantized = QTensor(cs.codes.to(p.device()).clone(), cs.absmax.to(p.device()).clone(), {cp.numel}, qf,
                               cp.block_size);
    } else {
      slot.type = {storage == StateFormat::BF16 ? kernels::SlotStorage::BF16 : kernels::SlotStorage::F32};
      slot.dense = cs.values.reshape({cp.numel}).to(p.device()).clone();
    }
  }
  return st;
}

// Each moment expanded to fp32 and quantized again by make_state, exactly as a fresh state in this
// optimizer's layout would be from those values; the step count and the master-weight correction
// (which does not depend on the moments' format) as stored.
ParamState LowbitOptimizer::converted_state(const ParamState& stored, const at::Tensor& p,
                                            const torch::optim::OptimizerOptions& options) const {
  std::vector<at::Tensor> values;
  for (size_t k = 0; k < stored.slots.size() && k < size_t(kernels::kMomentSlots); ++k)
    values.push_back(stored.slots[k].to_float());
  ParamState st = make_state(p, options, values);
  st.counters = stored.counters;
  if (st.slots.size() > size_t(kernels::kCorrectionSlot) &&
      kernels::is_correction(st.slots[kernels::kCorrectionSlot].type.storage))
    st.slots[kernels::kCorrectionSlot] = stored.slots[kernels::kCorrectionSlot];
  return st;
}

void LowbitOptimizer::load(torch::serialize::InputArchive& a) { load(a, LoadOptions()); }

void LowbitOptimizer::load(torch::serialize::InputArchive& a, const LoadOptions& options) {
  c10::IValue torch_version;
  if (a.try_read("pytorch_version", torch_version)) return load_torch_adam(a);
  // Everything is read and checked (checkpoint_reader.h) and then checked against this optimizer's
  // parameters and options into new containers: a bad checkpoint leaves the optimizer exactly as it was.
  const CheckpointContents c = read_checkpoint(a, name());
  TORCH_CHECK(c.optimizer == name(), name(), ": the checkpoint was written by ", c.optimizer);
  TORCH_CHECK(c.groups.size() == param_groups_.size(), name(), ": the checkpoint has ", c.groups.size(),
              " parameter groups, this optimizer has ", param_groups_.size());
  std::unordered_map<c10::TensorImpl*, ParamState> states;
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) {
    const auto& group = param_groups_[gi];
    const CheckpointGroup& cg = c.groups[gi];
    TORCH_CHECK(cg.params.size() == group.params().size(), name(), ": group ", gi, " of the checkpoint has ",
                cg.params.size(), " parameters, this optimizer's has ", group.params().size());
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& p = group.params()[i];
      const CheckpointParam& cp = cg.params[i];
      TORCH_CHECK(cp.numel == p.numel(), name(), ": parameter ", i, " of group ", gi, " has ", p.numel(),
                  " elements but the checkpoint's has ", cp.numel);
      if (!cp.has_state) continue;
      ParamState st = stored_state(cp, p, gi, i);
      const std::string difference = layout_difference(stored_layout(st), layout_of(p, group.options()));
      if (!difference.empty()) {
        TORCH_CHECK(options.convert_state_format(), name(), ": ", param_where(gi, i, p), ": ", difference,
                    ". To convert it on purpose, load with lowbit::optim::load_checkpoint(optimizer, path, "
                    "LoadOptions().convert_state_format(true)) (the state is expanded to fp32 and requantized into "
                    "this optimizer's layout), or configure this optimizer as the checkpoint's (state_format, "
                    "override_state_format, min_quant_numel, block_size, fp8_second_moment)");
        st = converted_state(st, p, group.options());
      }
      states.emplace(p.unsafeGetTensorImpl(), std::move(st));
    }
  }
  // Commit.
  states_ = std::move(states);
  state_changed();
  seed_ = static_cast<uint64_t>(c.seed);
  skipped_loaded_ = c.skipped_steps;
  skipped_ = at::Tensor();
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) param_groups_[gi].options().set_lr(c.groups[gi].lr);
}

void load_checkpoint(LowbitOptimizer& optimizer, const std::string& path, const LoadOptions& options) {
  torch::serialize::InputArchive archive;
  load_checkpoint_archive(path, archive);
  optimizer.load(archive, options);
}

}  // namespace optim
}  // namespace lowbit
