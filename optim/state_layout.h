// Which slots a parameter's optimizer state has and how each is stored: the decision of
// LowbitOptimizer::make_state, also exposed as the op lowbit::optim_state_layout so that Python
// users of torch.ops.lowbit (python/lowbit/optim.py) lay state out exactly as the C++ optimizers do.
#pragma once

#include <string>
#include <vector>

#include "../kernels/common/state_slots.h"

#include "state_format.h"

namespace lowbit {
namespace optim {

struct StateLayout {
  StateFormat format = StateFormat::FP32;     // after min_quant_numel
  int64_t block_size = 0;                     // quantization block (work block for dense state)
  std::vector<kernels::SlotType> slots;       // by the rule's slot index; unused ones None
};

// requested: the group's (or an override's) StateFormat; numel: the whole parameter's, so a shard
// never changes the decision; block_size 0: the format's default; master_weight_bits 32 / 24: slot
// kCorrectionSlot holds an int16 / int8 master-weight correction (0: none).
StateLayout state_layout(const kernels::StepConfig& config, StateFormat requested, int64_t numel, int64_t block_size,
                         int64_t min_quant_numel, QuantFormat fp8_second_moment, const char* who,
                         int64_t master_weight_bits = 0);

// What keeps state saved in layout `saved` from the layout this optimizer gives it (`want`), in
// words for a checkpoint loader's error; "" when nothing does. Stepping it as stored would quietly
// use what the user did not configure (another format, block size or float8 second moment).
std::string layout_difference(const StateLayout& saved, const StateLayout& want);

// The correction slot's type for master_weight_bits (None for 0); an error naming `who` otherwise.
kernels::SlotType correction_slot_type(int64_t master_weight_bits, const char* who);

}  // namespace optim
}  // namespace lowbit
