// state_layout (state_layout.h) and its op, lowbit::optim_state_layout.
#include "state_layout.h"

#include <torch/library.h>

#include "../tensors/quant_format.h"

namespace lowbit {
namespace optim {

namespace {
constexpr int64_t kDenseWorkBlock = 1024;  // unit of work for FP32/BF16 state
}

kernels::SlotType correction_slot_type(int64_t master_weight_bits, const char* who) {
  TORCH_CHECK(master_weight_bits == 0 || master_weight_bits == 24 || master_weight_bits == 32, who,
              ": master_weight_bits must be 0 (none), 24 (int8 correction) or 32 (int16 correction), got ",
              master_weight_bits);
  if (master_weight_bits == 0) return {kernels::SlotStorage::None};
  return {master_weight_bits == 32 ? kernels::SlotStorage::Int16 : kernels::SlotStorage::Int8};
}

StateLayout state_layout(const kernels::StepConfig& config, StateFormat requested, int64_t numel, int64_t block_size,
                         int64_t min_quant_numel, QuantFormat fp8_second_moment, const char* who,
                         int64_t master_weight_bits) {
  const kernels::SlotType correction = correction_slot_type(master_weight_bits, who);
  StateLayout l;
  l.format = requested;
  if (is_quantized(l.format) && numel < min_quant_numel) l.format = StateFormat::FP32;
  l.block_size = is_quantized(l.format) ? resolve_block_size(quant_format_for(l.format, true), block_size, who)
                                        : kDenseWorkBlock;
  const kernels::RuleSlots spec = kernels::rule_slots(config);
  l.slots.resize(spec.count);
  for (int k = 0; k < spec.count; ++k) {
    if (!spec.used[k]) continue;
    if (is_quantized(l.format)) {
      l.slots[k] = {kernels::SlotStorage::Quant, quant_format_for(l.format, spec.is_signed[k], fp8_second_moment)};
    } else {
      l.slots[k] = {l.format == StateFormat::BF16 ? kernels::SlotStorage::BF16 : kernels::SlotStorage::F32};
    }
  }
  if (correction.storage != kernels::SlotStorage::None) {
    l.slots.resize(kernels::kMaxSlots);
    l.slots[kernels::kCorrectionSlot] = correction;
  }
  return l;
}

namespace {

std::tuple<std::vector<std::string>, int64_t> state_layout_op(std::string_view rule, std::string_view state_format,
                                                              int64_t numel, int64_t block_size, int64_t min_quant_numel,
                                                              double momentum, bool centered, bool amsgrad,
                                                              std::string_view fp8_second_moment,
                                                              int64_t master_weight_bits) {
  const char* op = "lowbit::optim_state_layout";
  kernels::StepConfig c;
  bool found = false;
  for (int i = 0; i < kernels::kNumRules; ++i)
    if (ascii_lower(kernels::rule_name(static_cast<kernels::Rule>(i))) == ascii_lower(std::string(rule))) {
      c.rule = static_cast<kernels::Rule>(i);
      found = true;
    }
  TORCH_CHECK(found, op, ": unknown rule '", rule, "'");
  StateFormat f;
  TORCH_CHECK(parse_state_format(std::string(state_format), &f), op, ": unknown state_format '", state_format,
              "'; expected one of ", all_state_format_names());
  TORCH_CHECK(numel >= 0, op, ": numel must be >= 0, got ", numel);
  c.momentum = momentum;
  c.centered = centered;
  c.amsgrad = amsgrad;
  const QuantFormat fp8 = format_from_name(std::string(fp8_second_moment));
  const StateLayout l = state_layout(c, f, numel, block_size, min_quant_numel, fp8, op, master_weight_bits);
  std::vector<std::string> names;
  for (const auto& s : l.slots) names.push_back(kernels::slot_type_name(s));
  return {names, l.block_size};
}

}  // namespace
std::string layout_difference(const StateLayout& saved, const StateLayout& want) {
  const char* format = state_format_name(want.format);
  if (saved.format != want.format)
    return c10::str("the checkpoint holds its state in ", state_format_name(saved.format),
                    " but this optimizer keeps it in ", format);
  if (saved.block_size != want.block_size)
    return c10::str("the checkpoint holds its ", format, " state in blocks of ", saved.block_size,
                    " but this optimizer uses blocks of ", want.block_size);
  for (size_t k = 0; k < want.slots.size() && k < saved.slots.size() && k < size_t(kernels::kMomentSlots); ++k)
    if (saved.slots[k] != want.slots[k])
      return c10::str("the checkpoint stores slot ", k, " of its ", format, " state as ",
                      kernels::slot_type_name(saved.slots[k]), " but this optimizer stores it as ",
                      kernels::slot_type_name(want.slots[k]), " (fp8_second_moment)");
  return "";
}

}  // namespace optim
}  // namespace lowbit

TORCH_LIBRARY_FRAGMENT(lowbit, m) {
  // No tensor arguments: one kernel for every dispatch key.
  m.def(
      "optim_state_layout(str rule, str state_format, int numel, int block_size=0, int min_quant_numel=4096, "
      "float momentum=0.0, bool centered=False, bool amsgrad=False, str fp8_second_moment=\"FP8E4M3\", "
      "int master_weight_bits=0) "
      "-> (str[] slots, int block_size)",
      &lowbit::optim::state_layout_op);
}
