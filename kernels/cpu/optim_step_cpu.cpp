// Fused optimizer step on the CPU. Unit of work = one block of one parameter: its values are read
// once, updated by the rule of kernels/common/optim_rules.h, quantized state re-encoded with a
// fresh absmax, and written once. Blocks are independent, so results do not depend on the thread
// count or on how parameters are grouped; threads take chunks of blocks as they come free.
//
// This file is the plan and the driver; per parameter it picks a loop (optim_step_parts.h): with
// AVX-512 or else AVX2 (also for what AVX-512 has no loop for), those of kernels/cpu/x86, else the
// scalar loop (StepLaunch::scalar_loop forces it, for tests). Every loop computes the same IEEE
// operations in the same order: the same bits.
#include "optim_step_cpu.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "cpu_features.h"
#include "optim_step_parts.h"

namespace lowbit {
namespace kernels {

StepPlan::StepPlan(const StepLaunch& s)
    : rule(s.config.rule), trust_given(s.lamb_norms != nullptr), vector_path(!s.scalar_loop), first_item(s.n + 1, 0) {
  // The launch's scalars as the GPU's prologue reads them: lr, then the gradient multiplier
  // (clipping with the group's squared norm, the AMP loss scale).
  const double lr = s.lr_is_double ? *static_cast<const double*>(s.lr)
                                   : static_cast<double>(*static_cast<const float*>(s.lr));
  const double sumsq = s.grad_sumsq ? *s.grad_sumsq : 0.0;
  const double loss_scale = s.grad_scale ? static_cast<double>(*s.grad_scale) : 1.0;
  grad_scale = grad_multiplier(s.grad_sumsq ? s.max_grad_norm : 0.0, sumsq, loss_scale);
  tasks.resize(s.n);
  steps.resize(s.n);
  for (int64_t i = 0; i < s.n; ++i) {
    const StepParamRef& r = s.params[i];
    ParamTask& t = tasks[i];
    steps[i] = r.counters[0] + 1;
    t.param = r.param;
    t.param_type = s.param_type;
    t.grad = r.grad;
    t.grad_type = r.grad_type;
    t.numel = r.numel;
    t.offset = r.offset;
    t.block_size = s.block_size;
    t.hyper = derive_hyper(s.config, steps[i], lr);
    if (s.lamb_norms) t.hyper.trust = lamb_trust(s.lamb_norms[2 * i], s.lamb_norms[2 * i + 1]);
    t.stochastic_round = s.stochastic_round && s.param_type == ElemType::BF16;
    t.seed = step_seed(s.seed, steps[i], r.rng_key);
    // The moment slots in use: a master-weight correction makes the launch's count kMaxSlots, with
    // the slots between the rule's last moment and the correction empty. Counted without them, a
    // corrected parameter whose moments are all quantized takes the vector loops' pipelined path.
    t.num_slots = std::min(s.num_slots, kMomentSlots);
    while (t.num_slots > 0 && s.slots[t.num_slots - 1].storage == SlotStorage::None) --t.num_slots;
    for (int k = 0; k < s.num_slots; ++k) {
      StateSlotRef& ref = t.slots[k];
      ref.storage = s.slots[k].storage;
      ref.format = s.slots[k].format;
      void* data = k < kMomentSlots ? r.slot[k] : r.correction;
      if (ref.storage == SlotStorage::Quant) {
        ref.codes = static_cast<uint8_t*>(data);
        ref.absmax = k < kMomentSlots ? r.absmax[k] : nullptr;
      } else if (ref.storage != SlotStorage::None) {
        ref.values = data;
      }
    }
    first_item[i + 1] = first_item[i] + num_blocks(t.numel, t.block_size);
    max_block = std::max(max_block, t.block_size);
  }
  items = first_item[s.n];
  if (items == 0) return;
  for (int f = 0; f < kNumQuantFormats; ++f) views[f] = format_tables(static_cast<QuantFormat>(f));
  for (auto& t : tasks)
    for (int k = 0; k < t.num_slots; ++k) t.slots[k].tables = &views[static_cast<int>(t.slots[k].format)];
}

TaskShape task_shape(const ParamTask& t) {
  TaskShape s;
  s.f32 = t.param_type == ElemType::F32 && t.grad_type == ElemType::F32;
  s.bf16 = t.param_type == ElemType::BF16 && t.grad_type == ElemType::BF16;
  if (s.bf16) s.corr = t.slots[kCorrectionSlot].storage;
  if (t.num_slots == 0 || !(s.f32 || s.bf16)) return s;
  const StateSlotRef& first = t.slots[0];
  bool quant = first.storage == SlotStorage::Quant && (!has_correction(t) || s.bf16);
  bool dense = (first.storage == SlotStorage::F32 || first.storage == SlotStorage::BF16) && !has_correction(t);
  s.float8 = s.pow8 = format_bits(first.format) == 8;
  for (int k = 0; k < t.num_slots; ++k) {
    const StateSlotRef& r = t.slots[k];
    quant &= r.storage == SlotStorage::Quant && format_bits(r.format) == format_bits(first.format);
    dense &= r.storage == first.storage;
    const CodebookKind kind = format_spec(r.format).codebook;
    s.float8 &= kind == CodebookKind::Float8;
    s.pow8 &= kind == CodebookKind::Power;
  }
  s.quant_bits = quant ? format_bits(first.format) : 0;
  s.float8 &= quant;
  s.pow8 &= quant;
  if (dense) s.dense = first.storage;
  return s;
}

namespace {

RangeFn pick_range_fn(Rule rule, const ParamTask& t, bool vector_path) {
#if LOWBIT_X86_AVX512_LOOPS
  if (vector_path && cpu_has_avx512())
    if (const RangeFn fn = avx512_range_fn(rule, t)) return fn;
#endif
#if LOWBIT_X86_AVX2_LOOPS
  if (vector_path && cpu_has_avx2()) return avx2_range_fn(rule, t);
#endif
  return scalar_range_fn(rule);
}

}  // namespace

void optim_step_cpu(const StepLaunch& s) {
  if (s.n == 0 || (s.found_inf && *s.found_inf != 0.0f)) return;
  StepPlan plan(s);
  std::vector<uint8_t> bad(plan.items, 0);
  if (plan.items > 0) {
    if (plan.rule == Rule::LAMB && !plan.trust_given) {
      // Pass 1 gives each parameter's trust ratio; pass 2 below is the ordinary fused update.
      std::vector<double> norms(2 * s.n);
      lamb_norms(plan, norms.data());
      for (int64_t t = 0; t < s.n; ++t) plan.tasks[t].hyper.trust = lamb_trust(norms[2 * t], norms[2 * t + 1]);
    }
    std::vector<RangeFn> fns(plan.tasks.size());
    for (size_t t = 0; t < plan.tasks.size(); ++t) fns[t] = pick_range_fn(plan.rule, plan.tasks[t], plan.vector_path);
    // Threads take chunks of blocks from a shared counter (kThreadChunkElements; at least 4 per thread).
    const int64_t threads = std::max(1, omp_get_max_threads());
    const int64_t chunk = std::max<int64_t>(
        1, std::min<int64_t>(kThreadChunkElements / plan.max_block, (plan.items + 4 * threads - 1) / (4 * threads)));
    std::atomic<int64_t> next_chunk{0};
#pragma omp parallel
    {
      // The pipelined loop carries one block into the next within a range. Buffers: p, g and three
      // state slots for the per-block loops, two blocks of three slots for the pipelined one; zeroed
      // so unused slots hold defined values.
      std::vector<float> buf(6 * plan.max_block, 0.0f);
      for (;;) {
        const int64_t lo = next_chunk.fetch_add(1, std::memory_order_relaxed) * chunk;
        if (lo >= plan.items) break;
        const int64_t hi = std::min(plan.items, lo + chunk);
        for (int64_t item = lo; item < hi;) {
          const int64_t t = plan.task_of(item);
          const int64_t end = std::min(hi, plan.first_item[t + 1]);
          fns[t](plan.tasks[t], item - plan.first_item[t], end - plan.first_item[t], plan.grad_scale, buf.data(),
                 &bad[item]);
          item = end;
        }
      }
    }
  }
  for (int64_t t = 0; t < s.n; ++t) {
    int64_t count = 0;
    for (int64_t item = plan.first_item[t]; item < plan.first_item[t + 1]; ++item) count += bad[item];
    int64_t* counters = s.params[t].counters;
    counters[0] = plan.steps[t];
    counters[1] += count;
  }
}

}  // namespace kernels
}  // namespace lowbit
