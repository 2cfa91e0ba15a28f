// Checkpoints of lowbit's optimizers (torch::save / torch::load), and import of libtorch's Adam /
// AdamW checkpoints. Entries: magic, version, optimizer name, seed, skipped steps, per group its lr
// and parameter count, per parameter a fragment (element offset, numel), step, format, block size
// and each slot's storage with its tensors (codes + absmax for quantized state, never expanded).
// Loading reads and checks everything into new containers first: a bad checkpoint leaves the
// optimizer exactly as it was.
#include <torch/serialize.h>

#include <algorithm>

#include "lowbit_optimizer.h"
#include "state_layout.h"

namespace lowbit {
namespace optim {

namespace {

constexpr int64_t kCheckpointMagic = 0x6C6F7762697401;  // "lowbit" + 1

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

// A slot's storage id in checkpoints: the StateFormat of its family (FP32 = 0, BF16 = 1, a
// quantized one = the parameter's Q8 / Q4 / FP8, its QuantFormat beside it), or a master-weight
// correction (5: int16, 6: int8); -1 for an unused slot.
constexpr int64_t kStorageInt16Correction = 5, kStorageInt8Correction = 6;
int64_t storage_id(const StateSlot& s, StateFormat param_format) {
  switch (s.type.storage) {
    case kernels::SlotStorage::None: return -1;
    case kernels::SlotStorage::F32: return static_cast<int64_t>(StateFormat::FP32);
    case kernels::SlotStorage::BF16: return static_cast<int64_t>(StateFormat::BF16);
    case kernels::SlotStorage::Quant: return static_cast<int64_t>(param_format);
    case kernels::SlotStorage::Int16: return kStorageInt16Correction;
    case kernels::SlotStorage::Int8: return kStorageInt8Correction;
  }
  return -1;
}

}  // namespace

void LowbitOptimizer::save(torch::serialize::OutputArchive& a) const {
  // A state lost to overflow is reported before it is written (GPU counters are read here).
  check_overflow_on(false);
  a.write("lowbit/magic", c10::IValue(kCheckpointMagic));
  a.write("lowbit/version", c10::IValue(kCheckpointVersion));
  a.write("lowbit/optimizer", c10::IValue(std::string(name())));
  a.write("lowbit/seed", c10::IValue(static_cast<int64_t>(seed_)));
  a.write("lowbit/skipped_steps", c10::IValue(skipped_steps()));
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
      a.write(k + "/step", c10::IValue(st->step()));
      a.write(k + "/format", c10::IValue(static_cast<int64_t>(st->format)));
      a.write(k + "/block_size", c10::IValue(st->block_size));
      a.write(k + "/slots", c10::IValue(static_cast<int64_t>(st->slots.size())));
      for (size_t s = 0; s < st->slots.size(); ++s) {
        const StateSlot& slot = st->slots[s];
        const std::string sk = k + "/slot/" + std::to_string(s);
        a.write(sk + "/storage", c10::IValue(storage_id(slot, st->format)));
        if (!slot.defined()) continue;
        if (slot.type.storage == kernels::SlotStorage::Quant) {
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
      st.counters.fill_(0);
      st.counters[0] = step.toInt();
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
      const int64_t step = read_int(a, k + "/step");
      const int64_t fmt = read_int(a, k + "/format");
      TORCH_CHECK(fmt >= 0 && fmt <= 4 && step >= 0, name(), ": corrupt checkpoint entry for ", k);
      st.counters = at::zeros({2}, p.options().dtype(at::kLong));
      st.counters[0] = step;
      st.format = static_cast<StateFormat>(fmt);
      st.block_size = read_int(a, k + "/block_size");
      const int64_t nslots = read_int(a, k + "/slots");
      const kernels::RuleSlots spec = kernels::rule_slots(config(group.options()));
      // A master-weight correction is the last slot; the checkpoint's must be what the options ask.
      const kernels::SlotType correction = correction_slot_type(common(group.options()).master_weight_bits, name());
      const bool corrected = correction.storage != kernels::SlotStorage::None;
      const int64_t want_slots = corrected ? kernels::kMaxSlots : spec.count;
      TORCH_CHECK(nslots == want_slots || (nslots == kernels::kMaxSlots && !corrected), name(),
                  ": the checkpoint's state of ", k, " has ", nslots, " slots, expected ", want_slots);
      st.slots.resize(nslots);
      for (int64_t s = 0; s < nslots; ++s) {
        const std::string sk = k + "/slot/" + std::to_string(s);
        const int64_t storage = read_int(a, sk + "/storage");
        StateSlot& slot = st.slots[s];
        if (s == kernels::kCorrectionSlot) {
          const int64_t want = !corrected ? -1
                               : correction.storage == kernels::SlotStorage::Int16 ? kStorageInt16Correction
                                                                                   : kStorageInt8Correction;
          TORCH_CHECK(storage == want, name(), ": the checkpoint's ", k, " has ",
                      storage < 0 ? std::string("no master-weight correction")
                                  : "a master-weight correction of storage id " + std::to_string(storage),
                      " but master_weight_bits is ", common(group.options()).master_weight_bits);
          if (storage < 0) continue;
          at::Tensor v = read_tensor(a, sk + "/values");
          const at::ScalarType dt = storage == kStorageInt16Correction ? at::kShort : at::kChar;
          TORCH_CHECK(v.numel() == numel && v.scalar_type() == dt, name(), ": the correction ", sk, " must be ", dt,
                      " with ", numel, " values, got ", v.scalar_type(), " with ", v.numel());
          TORCH_CHECK(p.scalar_type() == at::kBFloat16, name(), ": ", k, " carries a master-weight correction but "
                      "the parameter is ", p.scalar_type(), ", not bfloat16");
          slot.type = correction;
          slot.dense = v.reshape({numel}).to(p.device()).clone();
          continue;
        }
        if (storage < 0) continue;
        TORCH_CHECK(storage <= 4, name(), ": corrupt storage id in ", sk);
        TORCH_CHECK(spec.used[s], name(), ": the checkpoint holds slot ", s, " of ", k, ", which ",
                    kernels::rule_name(rule()), " does not use with these options");
        if (is_quantized(static_cast<StateFormat>(storage))) {
          const int64_t qf = read_int(a, sk + "/qformat");
          TORCH_CHECK(is_valid_format(static_cast<int32_t>(qf)), name(), ": corrupt quantization format in ", sk);
          // The QTensor constructor checks that codes and absmax fit the shape and block size.
          slot.type = {kernels::SlotStorage::Quant, static_cast<QuantFormat>(qf)};
          slot.quantized = QTensor(read_tensor(a, sk + "/codes"), read_tensor(a, sk + "/absmax"), {numel},
                                   static_cast<QuantFormat>(qf), st.block_size)
                               .to(p.device());
        } else {
          at::Tensor v = read_tensor(a, sk + "/values");
          TORCH_CHECK(v.numel() == numel, name(), ": state ", sk, " has ", v.numel(), " values, expected ", numel);
          const bool bf16 = storage == static_cast<int64_t>(StateFormat::BF16);
          TORCH_CHECK(v.scalar_type() == (bf16 ? at::kBFloat16 : at::kFloat), name(), ": state ", sk, " has dtype ",
                      v.scalar_type());
          slot.type = {bf16 ? kernels::SlotStorage::BF16 : kernels::SlotStorage::F32};
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
  skipped_loaded_ = skipped;
  skipped_ = at::Tensor();
  for (size_t gi = 0; gi < param_groups_.size(); ++gi) param_groups_[gi].options().set_lr(lrs[gi]);
}

}  // namespace optim
}  // namespace lowbit
