// The one description of a parameter's optimizer state, from optim/ down to the kernels: up to
// kMaxSlots slots, each stored as nothing, fp32, bf16, codes + absmax of a QuantFormat, or a
// master-weight correction, and the one place (rule_slots) that says which slots a rule uses and
// whether each holds signed values. Slot kCorrectionSlot (the last) holds the master-weight
// correction of bf16 parameters (DESIGN.md, memory floor; master_weight.h), so that correction is
// one more slot, not a second concept.
#pragma once

#include <cstdint>
#include <string>

#include "format_table.h"
#include "host_device.h"
#include "step_config.h"

namespace lowbit {
namespace kernels {

constexpr int kMaxSlots = 4;
constexpr int kMomentSlots = 3;  // slots 0..2: the rules' moments and buffers
constexpr int kCorrectionSlot = kMaxSlots - 1;  // the master-weight correction (master_weight.h)

// Int16 / Int8: a master-weight correction (master_weight.h), only in slot kCorrectionSlot.
enum class SlotStorage : int32_t { None = 0, F32 = 1, BF16 = 2, Quant = 3, Int16 = 4, Int8 = 5 };

inline bool is_correction(SlotStorage s) { return s == SlotStorage::Int16 || s == SlotStorage::Int8; }

// How one slot is stored: the storage kind and, for Quant, the format of its codes.
struct SlotType {
  SlotStorage storage = SlotStorage::None;
  QuantFormat format = QuantFormat::Dyn8Signed;
  bool operator==(const SlotType& o) const {
    return storage == o.storage && (storage != SlotStorage::Quant || format == o.format);
  }
  bool operator!=(const SlotType& o) const { return !(*this == o); }
};

// "none", "fp32", "bf16", the format's name ("Dyn8Signed", ...), "int16_correction" or
// "int8_correction": the op's `slots` argument.
inline std::string slot_type_name(SlotType t) {
  switch (t.storage) {
    case SlotStorage::None: return "none";
    case SlotStorage::F32: return "fp32";
    case SlotStorage::BF16: return "bf16";
    case SlotStorage::Quant: return format_name(t.format);
    case SlotStorage::Int16: return "int16_correction";
    case SlotStorage::Int8: return "int8_correction";
  }
  return "?";
}

// Parses slot_type_name's names (case-insensitive; "" is "none"); false when unknown.
inline bool parse_slot_type(const std::string& name, SlotType* out) {
  const std::string n = ascii_lower(name);
  if (n.empty() || n == "none") *out = SlotType{SlotStorage::None};
  else if (n == "fp32" || n == "float32") *out = SlotType{SlotStorage::F32};
  else if (n == "bf16" || n == "bfloat16") *out = SlotType{SlotStorage::BF16};
  else if (n == "int16_correction") *out = SlotType{SlotStorage::Int16};
  else if (n == "int8_correction") *out = SlotType{SlotStorage::Int8};
  else {
    QuantFormat f;
    if (!parse_format(name, &f)) return false;
    *out = SlotType{SlotStorage::Quant, f};
  }
  return true;
}

// Which slots a rule uses and what they hold. used[k]: the slot exists; is_signed[k]: its values
// can be negative (chooses the quantized format: signed -> Dyn8Signed / DE4Signed / FP8E4M3,
// unsigned -> Dyn8Unsigned / Linear4Unsigned / the FP8 second-moment format).
struct RuleSlots {
  int count = 0;  // 1 + the last slot the rule can use (unused ones in between are None)
  bool used[kMaxSlots] = {};
  bool is_signed[kMaxSlots] = {};
  const char* names[kMaxSlots] = {};  // torch.optim's state names
};

// Whether slot k of rule r holds signed values (moments of g, momentum) or not (moments of g^2,
// sums): fixed by the rule alone, so kernels can know it at compile time.
LOWBIT_HD constexpr bool slot_is_signed(Rule r, int k) {
  switch (r) {
    case Rule::Adam:
    case Rule::AdamW:
    case Rule::LAMB: return k == 0;
    case Rule::SGD:
    case Rule::Lion: return true;
    case Rule::RMSprop: return k != 0;
    case Rule::Adagrad: return false;
    case Rule::AdEMAMix: return k != 2;
  }
  return true;
}

// Slots whose update keeps a non-negative value non-negative under config c (bit k): second
// moments s * beta2 + (1 - beta2) * g^2 (and amsgrad's maximum of two) when 0 <= beta2 <= 1.
// From a block of such values (an unsigned format, a valid absmax) the step makes no negative
// value, so a kernel may skip the search for one (encode.h: block_absmax flags them); NaN and Inf
// are found by the magnitudes as before. Rules whose coefficients are not bounded so (RMSprop's
// alpha, Adagrad's initial sum) get no bit.
inline int nonneg_update_slots(const StepConfig& c) {
  if (!(c.beta2 >= 0.0 && c.beta2 <= 1.0)) return 0;
  switch (c.rule) {
    case Rule::Adam:
    case Rule::AdamW: return 0b110;
    case Rule::LAMB: return 0b010;
    case Rule::AdEMAMix: return 0b100;
    default: return 0;
  }
}

// Whether a step of rule r can have n moment slots in use: rule_slots' count for some options, the
// unused slots at its end not counted (the step op admits no other layout). The CPU's specialized
// loops are compiled for these counts only; any other takes the per-block loop.
LOWBIT_HD constexpr bool rule_slot_count_possible(Rule r, int n) {
  switch (r) {
    case Rule::Adam:
    case Rule::AdamW: return n == 2 || n == 3;  // amsgrad's maximum in the third
    case Rule::LAMB: return n == 2;
    case Rule::SGD: return n == 0 || n == 1;    // momentum's buffer
    case Rule::Lion:
    case Rule::Adagrad: return n == 1;
    case Rule::RMSprop: return n >= 1 && n <= 3;  // momentum's buffer, centered's average
    case Rule::AdEMAMix: return n == 3;
  }
  return false;
}

// The most moment slots a step of rule r carries (every option on).
LOWBIT_HD constexpr int rule_max_slots(Rule r) {
  int n = kMomentSlots;
  while (n > 0 && !rule_slot_count_possible(r, n)) --n;
  return n;
}

inline RuleSlots rule_slots(const StepConfig& c) {
  RuleSlots s;
  const auto add = [&](int k, const char* name, bool used = true) {
    s.count = k + 1;
    s.used[k] = used;
    s.is_signed[k] = slot_is_signed(c.rule, k);
    s.names[k] = name;
  };
  switch (c.rule) {
    case Rule::Adam:
    case Rule::AdamW:
    case Rule::LAMB:
      add(0, "exp_avg");
      add(1, "exp_avg_sq");
      if (c.amsgrad && c.rule != Rule::LAMB) add(2, "max_exp_avg_sq");
      break;
    case Rule::SGD:
      if (c.momentum != 0.0) add(0, "momentum_buffer");
      break;
    case Rule::Lion: add(0, "exp_avg"); break;
    case Rule::RMSprop:
      add(0, "square_avg");
      add(1, "momentum_buffer", c.momentum > 0.0);
      add(2, "grad_avg", c.centered);
      break;
    case Rule::Adagrad: add(0, "sum"); break;
    case Rule::AdEMAMix:
      add(0, "exp_avg_fast");
      add(1, "exp_avg_slow");
      add(2, "exp_avg_sq");
      break;
  }
  return s;
}

}  // namespace kernels
}  // namespace lowbit
