// Fused optimizer step on the CPU. Unit of work = one block of one parameter: its values are read
// once, updated by the rule of kernels/common/optim_rules.h, quantized state re-encoded with a
// fresh absmax, and written once. Blocks are independent, so results do not depend on the thread
// count or on how parameters are grouped. Each thread runs one contiguous share of all blocks.
//
// This file is the plan and the driver; per parameter it picks a loop (optim_step_parts.h): with
// AVX-512, those of kernels/cpu/x86, else the scalar loop (OptimStep::vector_path = false forces
// it, for tests). Every loop computes the same IEEE operations in the same order: the same bits.
#include "optim_step_cpu.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu_features.h"
#include "optim_step_parts.h"

namespace lowbit {
namespace kernels {

StepPlan::StepPlan(const OptimStep& step)
    : first_item(step.num_tasks + 1, 0), tasks(step.tasks, step.tasks + step.num_tasks) {
  for (int64_t t = 0; t < step.num_tasks; ++t) {
    first_item[t + 1] = first_item[t] + num_blocks(tasks[t].numel, tasks[t].block_size);
    max_block = std::max(max_block, tasks[t].block_size);
  }
  items = first_item[step.num_tasks];
  if (items == 0) return;
  for (int f = 0; f < kNumQuantFormats; ++f) views[f] = format_tables(static_cast<QuantFormat>(f));
  for (auto& t : tasks)
    for (int k = 0; k < t.num_slots; ++k) t.slots[k].tables = &views[static_cast<int>(t.slots[k].format)];
}

namespace {

RangeFn pick_range_fn(Rule rule, const ParamTask& t, bool vector_path) {
#if LOWBIT_X86_AVX512_LOOPS
  if (vector_path && cpu_has_avx512() && !has_correction(t)) return avx512_range_fn(rule, t);
#endif
  return scalar_range_fn(rule);
}

}  // namespace

void optim_step_cpu(const OptimStep& step) {
  StepPlan plan(step);
  if (step.nonfinite_blocks) std::fill(step.nonfinite_blocks, step.nonfinite_blocks + step.num_tasks, 0);
  if (plan.items == 0) return;
  if (step.rule == Rule::LAMB && !step.trust_given) {
    // Pass 1 gives each parameter's trust ratio; pass 2 below is the ordinary fused update.
    std::vector<double> norms(2 * step.num_tasks);
    lamb_norms(plan, step, norms.data());
    for (int64_t t = 0; t < step.num_tasks; ++t) plan.tasks[t].hyper.trust = lamb_trust(norms[2 * t], norms[2 * t + 1]);
  }
  std::vector<RangeFn> fns(plan.tasks.size());
  for (size_t t = 0; t < plan.tasks.size(); ++t) fns[t] = pick_range_fn(step.rule, plan.tasks[t], step.vector_path);
  std::vector<uint8_t> bad(plan.items, 0);
#pragma omp parallel
  {
    // Each thread takes one contiguous share of the blocks and runs it parameter by parameter
    // (the pipelined loop carries one block into the next). Buffers: p, g and three state slots
    // for the per-block loops, two blocks of three slots for the pipelined one; zeroed so unused
    // slots hold defined values.
    std::vector<float> buf(6 * plan.max_block, 0.0f);
    const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t lo = plan.items * me / nt, hi = plan.items * (me + 1) / nt;
    for (int64_t item = lo; item < hi;) {
      const int64_t t = plan.task_of(item);
      const int64_t end = std::min(hi, plan.first_item[t + 1]);
      fns[t](plan.tasks[t], item - plan.first_item[t], end - plan.first_item[t], step.grad_scale, buf.data(),
             &bad[item]);
      item = end;
    }
  }
  if (step.nonfinite_blocks)
    for (int64_t t = 0; t < step.num_tasks; ++t) {
      int64_t count = 0;
      for (int64_t item = plan.first_item[t]; item < plan.first_item[t + 1]; ++item) count += bad[item];
      step.nonfinite_blocks[t] = count;
    }
}

}  // namespace kernels
}  // namespace lowbit
