// What the files of the CPU step (optim_step_cpu.h) share; internal, never installed:
//   optim_step_cpu.cpp          the plan and the driver: one OpenMP region, a loop picked per parameter
//   optim_step_scalar.cpp       the scalar loop, and the block I/O the other loops reuse
//   lamb_norms_cpu.cpp          LAMB's first pass (the sums behind the trust ratio)
//   x86/*_avx512.cpp            the AVX-512 loops, compiled for AVX-512 and run only where the CPU
//                               has it (cpu_features.h); built where LOWBIT_X86_AVX512_LOOPS is 1
//   x86/*_avx2.cpp              the AVX2 loops, the same for CPUs with AVX2 but not AVX-512;
//                               built where LOWBIT_X86_AVX2_LOOPS is 1
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "../common/step_values.h"
#include "block_ops.h"
#include "format_tables.h"
#include "optim_step_cpu.h"

namespace lowbit {
namespace kernels {

// ---- the plan --------------------------------------------------------------------------------

// One slot of one parameter as the loops see it.
struct StateSlotRef {
  SlotStorage storage = SlotStorage::None;
  QuantFormat format = QuantFormat::Dyn8Signed;  // Quant
  void* values = nullptr;    // F32: float*, BF16: bf16 bits (uint16_t*), Int16 / Int8: corrections; numel elements
  uint8_t* codes = nullptr;  // Quant: code_bytes(format, numel) bytes
  float* absmax = nullptr;   // Quant: one per block of the step's block size
  const FormatView* tables = nullptr;  // Quant: resolved once per launch
};

// One parameter (or a block-aligned range of one) at this step: its StepParamRef with the values
// derived for it.
struct ParamTask {
  void* param = nullptr;
  ElemType param_type = ElemType::F32;
  const void* grad = nullptr;
  ElemType grad_type = ElemType::F32;
  int64_t numel = 0;
  int64_t offset = 0;        // element of the whole parameter where this range starts (RNG index)
  int64_t block_size = 256;  // quantization block of the state; also the unit of work
  int num_slots = 0;         // moment slots (at most kMomentSlots)
  // slots[kCorrectionSlot]: the master-weight correction of a bf16 parameter (Int16 / Int8
  // storage, master_weight.h), or None.
  StateSlotRef slots[kMaxSlots];
  Hyper hyper;                    // this step's values (derive_hyper)
  bool stochastic_round = false;  // bf16 params: round the fp32 result stochastically
  uint64_t seed = 0;              // counter-based RNG: hash(seed, offset + element index)
};

// A launch as both passes take it: the tasks with each quantized slot's tables resolved, and
// (task, block) pairs flattened so one parallel loop covers every block of every parameter.
struct StepPlan {
  Rule rule = Rule::AdamW;
  float grad_scale = 1.0f;   // clipping / loss-scale factor, applied as the gradient is read
  bool trust_given = false;  // LAMB: the tasks' hyper.trust is set (whole-parameter norms); else pass 1 runs
  bool vector_path = true;   // false: the scalar loop even where AVX-512 or AVX2 is present (tests)
  std::vector<ParamTask> tasks;
  std::vector<int64_t> steps;  // per task: the step it takes (its counters' steps + 1)
  std::vector<int64_t> first_item;
  int64_t items = 0;
  int64_t max_block = 1;
  FormatView views[kNumQuantFormats];

  explicit StepPlan(const StepLaunch& s);
  StepPlan(const StepPlan&) = delete;
  StepPlan& operator=(const StepPlan&) = delete;

  int64_t num_tasks() const { return static_cast<int64_t>(tasks.size()); }
  int64_t task_of(int64_t item) const {
    return std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin() - 1;
  }
};

// Whether a parameter carries a master-weight correction (master_weight.h), in slot kCorrectionSlot.
inline bool has_correction(const ParamTask& t) { return is_correction(t.slots[kCorrectionSlot].storage); }

// ---- the loops ---------------------------------------------------------------------------------

// Blocks [b0, b1) of one parameter; bad[b - b0] = 1 where a quantized slot became non-finite.
using RangeFn = void (*)(const ParamTask&, int64_t b0, int64_t b1, float grad_scale, float* buf, uint8_t* bad);
// One block; returns 1 when a quantized slot of the block became non-finite.
using BlockFn = int (*)(const ParamTask&, int64_t block, float grad_scale, float* buf);

template <BlockFn F>
void each_block(const ParamTask& t, int64_t b0, int64_t b1, float grad_scale, float* buf, uint8_t* bad) {
  for (int64_t b = b0; b < b1; ++b) bad[b - b0] = static_cast<uint8_t>(F(t, b, grad_scale, buf));
}

// A task as the vector loops' choice sees it (optim_step_cpu.cpp): which of their specialized loops
// can take it.
struct TaskShape {
  bool f32 = false, bf16 = false;  // parameter and gradient both fp32, both bf16
  // bf16's master-weight correction: None, Int8 (the 24-bit mode) or Int16 (the 32-bit mode).
  SlotStorage corr = SlotStorage::None;
  // fp32, or bf16 with or without a correction, every moment slot quantized with codes this wide; else 0.
  int quant_bits = 0;
  bool float8 = false, pow8 = false;  // ... and every slot's codebook is FP8's / C8's
  // fp32 or bf16, no correction, every moment slot F32 or every one BF16; else None.
  SlotStorage dense = SlotStorage::None;
};
TaskShape task_shape(const ParamTask& t);

// Internal linkage for the two templates below: each vector file instantiates them with its own
// Loops, which GCC does not count as making the instance internal (a template template argument),
// so at -O1 both objects would export the same weak symbol and the linker could keep the AVX-512
// one for the AVX2 caller (x86_objects_isolated).
namespace {

// A vector file's specialized loop for rule R and a task with NS moment slots, nullptr where none
// applies (the file's per-block loop then): Loops<R, NS>::quant(shape) for quantized state, its
// dense<parameter type, state storage> for dense state.
template <template <Rule, int> class Loops, Rule R, int NS>
RangeFn pick_for_slots(const TaskShape& s) {
  using L = Loops<R, NS>;
  if (s.quant_bits != 0) return L::quant(s);
  if (s.dense == SlotStorage::None) return nullptr;
  constexpr ElemType F = ElemType::F32, H = ElemType::BF16;
  constexpr SlotStorage kF32 = SlotStorage::F32, kBF16 = SlotStorage::BF16;
  constexpr RangeFn kDense[2][2] = {{L::template dense<F, kF32>, L::template dense<F, kBF16>},
                                    {L::template dense<H, kF32>, L::template dense<H, kBF16>}};
  return kDense[s.bf16][s.dense == kBF16];
}

// pick_for_slots for the task's slot count, compiled only for the counts rule R can have
// (rule_slot_count_possible).
template <template <Rule, int> class Loops, Rule R>
RangeFn pick_specialized(const ParamTask& t) {
  const TaskShape s = task_shape(t);
  switch (t.num_slots) {
    case 1: if constexpr (rule_slot_count_possible(R, 1)) return pick_for_slots<Loops, R, 1>(s); break;
    case 2: if constexpr (rule_slot_count_possible(R, 2)) return pick_for_slots<Loops, R, 2>(s); break;
    case 3: if constexpr (rule_slot_count_possible(R, 3)) return pick_for_slots<Loops, R, 3>(s); break;
  }
  return nullptr;
}

}  // namespace

// pick(std::integral_constant<Rule, R>{}) for the rule named at run time: how a loop file hands out
// its loop for rule R.
template <typename Pick>
RangeFn with_rule(Rule rule, Pick&& pick) {
  switch (rule) {
    case Rule::Adam: return pick(std::integral_constant<Rule, Rule::Adam>{});
    case Rule::AdamW: return pick(std::integral_constant<Rule, Rule::AdamW>{});
    case Rule::SGD: return pick(std::integral_constant<Rule, Rule::SGD>{});
    case Rule::Lion: return pick(std::integral_constant<Rule, Rule::Lion>{});
    case Rule::RMSprop: return pick(std::integral_constant<Rule, Rule::RMSprop>{});
    case Rule::Adagrad: return pick(std::integral_constant<Rule, Rule::Adagrad>{});
    case Rule::AdEMAMix: return pick(std::integral_constant<Rule, Rule::AdEMAMix>{});
    case Rule::LAMB: return pick(std::integral_constant<Rule, Rule::LAMB>{});
  }
  return nullptr;
}

// The scalar loop of a rule: any parameter type, any state.
RangeFn scalar_range_fn(Rule rule);

// The AVX-512 loop of a rule for t where it has one (see task_shape), else nullptr: only where
// cpu_has_avx512().
RangeFn avx512_range_fn(Rule rule, const ParamTask& t);

// The AVX2 loop of a rule for t (any parameter type and state, corrections included): only where
// cpu_has_avx2().
RangeFn avx2_range_fn(Rule rule, const ParamTask& t);

// ---- block I/O (fp32 buffers of one block) ------------------------------------------------------

void load_block(const void* p, ElemType t, int64_t begin, int64_t len, float* out);
// The parameter's values, or with a correction slot its master values (master_weight.h).
void load_param_block(const ParamTask& t, int64_t begin, int64_t len, float* out);
void store_param(const ParamTask& t, int64_t begin, int64_t len, const float* v);
// A slot's values of the block; nothing for a correction slot (it goes with the parameter).
void decode_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, float* out);
// Quantized slots: scan the block's new values (in v) and encode them; dense slots: store.
int encode_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, float* v);
// absmax from the scan of the block's new values v, then the codes. Returns 1 when the new values
// were not representable (Inf or NaN: the absmax carries encode.h's flag), else 0.
int store_quantized_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, const float* v,
                         uint32_t max_bits, uint32_t negative);

// ---- LAMB's first pass --------------------------------------------------------------------------

// Per parameter of the plan, out[2 t] and out[2 t + 1] (optim_step_cpu.h: lamb_norms_cpu).
void lamb_norms(const StepPlan& plan, double* out);

// One block's sums of p^2 and r^2 (sums[0], sums[1]), in double: element i of the block goes to
// partial sum i mod kLambLanes (in element order); a block's sum is the partials added in order.
// Every loop and the ATen reference add in exactly this order.
constexpr int kLambLanes = 16;

// Work handed to threads as they come free, this many elements at a time (not one fixed share each:
// a thread on a shared core then delays only its own chunks). Large enough that taking one costs
// nothing and the loops run at speed.
constexpr int64_t kThreadChunkElements = 65536;
namespace {  // internal linkage: the AVX-512 and AVX2 objects include this too (x86_objects_isolated)
// Software prefetch of `len` elements from `begin` of every stream of t (parameter, gradient, state,
// correction), a few blocks ahead of the loop: with every core streaming several arrays the hardware
// prefetchers fall behind.
inline void prefetch_ahead(const ParamTask& t, int64_t begin, int64_t len) {
  if (begin >= t.numel) return;
  len = std::min(len, t.numel - begin);
  const int64_t pe = t.param_type == ElemType::F32 ? 4 : 2, ge = t.grad_type == ElemType::F32 ? 4 : 2;
  prefetch_range(static_cast<const char*>(t.param) + begin * pe, len * pe);
  prefetch_range(static_cast<const char*>(t.grad) + begin * ge, len * ge);
  for (int k = 0; k < kMaxSlots; ++k) {
    const StateSlotRef& s = t.slots[k];
    if (k >= t.num_slots && k != kCorrectionSlot) continue;
    if (s.storage == SlotStorage::Quant) {
      const bool four = format_bits(s.format) == 4;
      prefetch_range(s.codes + (four ? begin / 2 : begin), four ? (len + 1) / 2 : len);
    } else if (s.storage != SlotStorage::None) {
      const int64_t se = s.storage == SlotStorage::F32 ? 4 : s.storage == SlotStorage::Int8 ? 1 : 2;
      prefetch_range(static_cast<const char*>(s.values) + begin * se, len * se);
    }
  }
}
// The vector loops' start: block `block`'s range and its two state slots decoded into buf (2 x block_size).
struct LambBlock {
  int64_t begin, len;
  float* s[2];
};
inline LambBlock decode_lamb_block(const ParamTask& t, int64_t block, float* buf) {
  const int64_t begin = block * t.block_size;
  LambBlock b{begin, std::min(t.block_size, t.numel - begin), {buf, buf + t.block_size}};
  for (int k = 0; k < 2; ++k) decode_slot(t.slots[k], block, begin, b.len, b.s[k]);
  return b;
}
// A block's two sums from its partials, added in order: every loop's last step.
inline void add_lamb_partials(const double* pp, const double* rr, double* sums) {
  sums[0] = sums[1] = 0.0;
  for (int j = 0; j < kLambLanes; ++j) {
    sums[0] += pp[j];
    sums[1] += rr[j];
  }
}
}  // namespace
void lamb_norms_block_avx512(const ParamTask& t, int64_t block, float grad_scale, float* buf, double* sums);
void lamb_norms_block_avx2(const ParamTask& t, int64_t block, float grad_scale, float* buf, double* sums);

}  // namespace kernels
}  // namespace lowbit
