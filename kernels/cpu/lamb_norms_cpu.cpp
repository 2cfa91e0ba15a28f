// LAMB's first pass on the CPU (optim_step_cpu.h: lamb_norms_cpu): per block the sums of p^2 and
// r^2, r the update direction before the trust ratio, state untouched; then per parameter the block
// sums added in LAMB's order (lamb_add_block_sum_pairs: independent of threads).
#include <algorithm>
#include <vector>

#include "../common/optim_rules.h"
#include "cpu_features.h"
#include "optim_step_parts.h"

namespace lowbit {
namespace kernels {
namespace {

// One block's sums, kLambLanes partials each (optim_step_parts.h).
void lamb_norms_block(const ParamTask& t, int64_t block, float grad_scale, float* buf, double* sums) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  float* p = buf;
  float* g = buf + B;
  float* s[2] = {buf + 2 * B, buf + 3 * B};
  load_param_block(t, begin, len, p);
  load_block(t.grad, t.grad_type, begin, len, g);
  for (int k = 0; k < 2; ++k) decode_slot(t.slots[k], block, begin, len, s[k]);
  double pp[kLambLanes] = {}, rr[kLambLanes] = {};
  for (int64_t i = 0; i < len; ++i) {
    float gi = grad_scale != 1.0f ? g[i] * grad_scale : g[i];
    if (t.hyper.maximize) gi = -gi;
    const float st[2] = {s[0][i], s[1][i]};
    float m, v;
    const float r = lamb_direction(t.hyper, gi, p[i], st, &m, &v);
    pp[i % kLambLanes] += static_cast<double>(p[i]) * p[i];
    rr[i % kLambLanes] += static_cast<double>(r) * r;
  }
  add_lamb_partials(pp, rr, sums);
}

}  // namespace

void lamb_norms(const StepPlan& plan, double* out) {
  std::vector<double> sums(2 * plan.items);
  const bool avx512 = plan.vector_path && cpu_has_avx512();
  const bool avx2 = plan.vector_path && !avx512 && cpu_has_avx2();
  // Blocks handed out as threads come free, as the step's own chunks.
  const int64_t chunk = std::max<int64_t>(1, kThreadChunkElements / plan.max_block);
#pragma omp parallel
  {
    std::vector<float> buf(4 * plan.max_block, 0.0f);
#pragma omp for schedule(dynamic, chunk)
    for (int64_t item = 0; item < plan.items; ++item) {
      const int64_t t = plan.task_of(item);
      const int64_t block = item - plan.first_item[t];
#if LOWBIT_X86_AVX512_LOOPS
      if (avx512 && !has_correction(plan.tasks[t])) {
        lamb_norms_block_avx512(plan.tasks[t], block, plan.grad_scale, buf.data(), &sums[2 * item]);
        continue;
      }
#endif
#if LOWBIT_X86_AVX2_LOOPS
      if (avx2 && !has_correction(plan.tasks[t])) {
        lamb_norms_block_avx2(plan.tasks[t], block, plan.grad_scale, buf.data(), &sums[2 * item]);
        continue;
      }
#endif
      lamb_norms_block(plan.tasks[t], block, plan.grad_scale, buf.data(), &sums[2 * item]);
    }
  }
  (void)avx512;
  (void)avx2;
  for (int64_t t = 0; t < plan.num_tasks(); ++t) {
    lamb_add_block_sum_pairs(&sums[2 * plan.first_item[t]], plan.first_item[t + 1] - plan.first_item[t], &out[2 * t]);
  }
}

void lamb_norms_cpu(const StepLaunch& s, double* out) {
  const StepPlan plan(s);
  std::fill(out, out + 2 * s.n, 0.0);
  if (plan.items > 0) lamb_norms(plan, out);
}

}  // namespace kernels
}  // namespace lowbit
