// Fused optimizer step on the CPU. Work item = one block of one parameter; a block is decoded into
// fp32 (L1-resident buffers), updated by the rule of kernels/common/optim_rules.h, re-quantized
// with a fresh absmax, and written back. Blocks are independent, so results do not depend on the
// thread count or on how parameters are grouped.
#include "optim_step_cpu.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cfloat>
#include <mutex>
#include <vector>

#include "../common/code_tables.h"
#include "../common/encode.h"
#include "../common/float_convert.h"
#include "../common/stochastic_round.h"
#include "block_ops.h"
#include "code_encoder.h"

namespace lowbit {
namespace kernels {
namespace {


float load(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::F32: return static_cast<const float*>(p)[i];
    case ElemType::BF16: return to_f32(static_cast<const bf16_t*>(p)[i]);
    case ElemType::F16: return to_f32(static_cast<const f16_t*>(p)[i]);
  }
  return 0.0f;
}

void load_block(const void* p, ElemType t, int64_t begin, int64_t len, float* out) {
  if (t == ElemType::F32) {
    std::copy(static_cast<const float*>(p) + begin, static_cast<const float*>(p) + begin + len, out);
  } else {
    for (int64_t i = 0; i < len; ++i) out[i] = load(p, t, begin + i);
  }
}

void decode_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, float* out) {
  switch (s.storage) {
    case SlotStorage::None: return;
    case SlotStorage::F32: load_block(s.values, ElemType::F32, begin, len, out); return;
    case SlotStorage::BF16: load_block(s.values, ElemType::BF16, begin, len, out); return;
    case SlotStorage::Quant: {
      const float* cb = cached_codebook(s.format);
      const float amax = s.absmax[block];
      if (format_bits(s.format) == 4) {
        const uint8_t* c = s.codes + begin / 2;
        decode4(cb, c, len & ~int64_t(1), amax, out);
        if (len % 2) out[len - 1] = decode_value(cb, c[len / 2] & 0xF, amax);
      } else {
        decode8(cb, s.codes + begin, len, amax, out);
      }
      return;
    }
  }
}

void encode_slot(const StateSlotRef& s, int64_t block, int64_t begin, int64_t len, float* v) {
  switch (s.storage) {
    case SlotStorage::None: return;
    case SlotStorage::F32: std::copy(v, v + len, static_cast<float*>(s.values) + begin); return;
    case SlotStorage::BF16: {
      bf16_t* out = static_cast<bf16_t*>(s.values) + begin;
      for (int64_t i = 0; i < len; ++i) out[i] = from_f32<bf16_t>(v[i]);
      return;
    }
    case SlotStorage::Quant: {
      uint32_t max_bits = 0, neg = 0;
      scan_block(v, len, v, &max_bits, &neg);
      const int64_t offset = format_bits(s.format) == 4 ? begin / 2 : begin;
      s.absmax[block] = encode_scanned_block(s.format, v, len, max_bits, neg, s.codes + offset);
      return;
    }
  }
}

void store_param(const ParamTask& t, int64_t begin, int64_t len, const float* v) {
  switch (t.param_type) {
    case ElemType::F32: std::copy(v, v + len, static_cast<float*>(t.param) + begin); return;
    case ElemType::BF16: {
      bf16_t* out = static_cast<bf16_t*>(t.param) + begin;
      if (t.stochastic_round) {
        for (int64_t i = 0; i < len; ++i) out[i] = bf16_stochastic(v[i], t.seed, static_cast<uint64_t>(begin + i));
      } else {
        for (int64_t i = 0; i < len; ++i) out[i] = from_f32<bf16_t>(v[i]);
      }
      return;
    }
    case ElemType::F16: {
      f16_t* out = static_cast<f16_t*>(t.param) + begin;
      for (int64_t i = 0; i < len; ++i) out[i] = from_f32<f16_t>(v[i]);
      return;
    }
  }
}

// The element loop, one instantiation per rule so it has no branch on the rule and vectorizes;
// compiled for AVX-512, AVX2 and baseline x86-64, picked at load time (same IEEE results on each:
// no contraction, and vector sqrt/div are correctly rounded).
template <Rule R>
__attribute__((target_clones("avx512f", "avx2", "default"))) void update_elements(const Hyper& h, int64_t len,
                                                                                   float* __restrict__ p,
                                                                                   const float* __restrict__ g,
                                                                                   float* __restrict__ s0,
                                                                                   float* __restrict__ s1,
                                                                                   float* __restrict__ s2) {
  for (int64_t i = 0; i < len; ++i) {
    float st[3] = {s0[i], s1[i], s2[i]};
    float pi = p[i];
    apply_rule(R, h, g[i], pi, st);
    p[i] = pi;
    s0[i] = st[0];
    s1[i] = st[1];
    s2[i] = st[2];
  }
}

void update_block(Rule rule, const Hyper& h, int64_t len, float* p, const float* g, float** s) {
  switch (rule) {
    case Rule::Adam: return update_elements<Rule::Adam>(h, len, p, g, s[0], s[1], s[2]);
    case Rule::AdamW: return update_elements<Rule::AdamW>(h, len, p, g, s[0], s[1], s[2]);
    case Rule::SGD: return update_elements<Rule::SGD>(h, len, p, g, s[0], s[1], s[2]);
    case Rule::Lion: return update_elements<Rule::Lion>(h, len, p, g, s[0], s[1], s[2]);
    case Rule::RMSprop: return update_elements<Rule::RMSprop>(h, len, p, g, s[0], s[1], s[2]);
    case Rule::Adagrad: return update_elements<Rule::Adagrad>(h, len, p, g, s[0], s[1], s[2]);
    case Rule::AdEMAMix: return update_elements<Rule::AdEMAMix>(h, len, p, g, s[0], s[1], s[2]);
    case Rule::LAMB: return update_elements<Rule::LAMB>(h, len, p, g, s[0], s[1], s[2]);
  }
}

// LAMB's first pass over a block: sums of p^2 and r^2 (in double, element order), state untouched.
void lamb_norms_block(const ParamTask& t, int64_t block, float grad_scale, float* buf, double* sums) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  float* p = buf;
  float* g = buf + B;
  float* s[2] = {buf + 2 * B, buf + 3 * B};
  load_block(t.param, t.param_type, begin, len, p);
  load_block(t.grad, t.grad_type, begin, len, g);
  for (int k = 0; k < 2; ++k) decode_slot(t.slots[k], block, begin, len, s[k]);
  double pp = 0.0, rr = 0.0;
  for (int64_t i = 0; i < len; ++i) {
    float gi = grad_scale != 1.0f ? g[i] * grad_scale : g[i];
    if (t.hyper.maximize) gi = -gi;
    const float st[2] = {s[0][i], s[1][i]};
    float m, v;
    const float r = lamb_direction(t.hyper, gi, p[i], st, &m, &v);
    pp += static_cast<double>(p[i]) * p[i];
    rr += static_cast<double>(r) * r;
  }
  sums[0] = pp;
  sums[1] = rr;
}

void step_block(Rule rule, const ParamTask& t, int64_t block, float grad_scale, float* buf) {
  const int64_t B = t.block_size;
  const int64_t begin = block * B;
  const int64_t len = std::min(B, t.numel - begin);
  float* p = buf;
  float* g = buf + B;
  float* s[3] = {buf + 2 * B, buf + 3 * B, buf + 4 * B};
  load_block(t.param, t.param_type, begin, len, p);
  load_block(t.grad, t.grad_type, begin, len, g);
  if (grad_scale != 1.0f)
    for (int64_t i = 0; i < len; ++i) g[i] = g[i] * grad_scale;
  for (int k = 0; k < t.num_slots; ++k) decode_slot(t.slots[k], block, begin, len, s[k]);
  update_block(rule, t.hyper, len, p, g, s);
  for (int k = 0; k < t.num_slots; ++k) encode_slot(t.slots[k], block, begin, len, s[k]);
  store_param(t, begin, len, p);
}

}  // namespace

void optim_step_cpu(const OptimStep& step) {
  // Flatten (task, block) pairs so one parallel loop covers every block of every parameter.
  std::vector<int64_t> first_item(step.num_tasks + 1, 0);
  int64_t max_block = 1;
  for (int64_t t = 0; t < step.num_tasks; ++t) {
    first_item[t + 1] = first_item[t] + num_blocks(step.tasks[t].numel, step.tasks[t].block_size);
    max_block = std::max(max_block, step.tasks[t].block_size);
  }
  const int64_t items = first_item[step.num_tasks];
  if (items == 0) return;
  std::vector<ParamTask> lamb_tasks;
  const ParamTask* tasks = step.tasks;
  if (step.rule == Rule::LAMB) {
    // Pass 1: per-block sums, added per parameter in block order (independent of threads), give
    // each parameter's trust ratio; pass 2 below is the ordinary fused update.
    std::vector<double> sums(2 * items);
#pragma omp parallel
    {
      std::vector<float> buf(5 * max_block, 0.0f);
#pragma omp for schedule(static)
      for (int64_t item = 0; item < items; ++item) {
        const int64_t t = std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin() - 1;
        lamb_norms_block(step.tasks[t], item - first_item[t], step.grad_scale, buf.data(), &sums[2 * item]);
      }
    }
    lamb_tasks.assign(step.tasks, step.tasks + step.num_tasks);
    for (int64_t t = 0; t < step.num_tasks; ++t) {
      double pp = 0.0, rr = 0.0;
      for (int64_t item = first_item[t]; item < first_item[t + 1]; ++item) {
        pp += sums[2 * item];
        rr += sums[2 * item + 1];
      }
      const double pn = std::sqrt(pp), rn = std::sqrt(rr);
      lamb_tasks[t].hyper.trust = (pn > 0.0 && rn > 0.0) ? static_cast<float>(pn / rn) : 1.0f;
    }
    tasks = lamb_tasks.data();
  }
#pragma omp parallel
  {
    // p, g and three state slots; zeroed so unused slots hold defined values.
    std::vector<float> buf(5 * max_block, 0.0f);
#pragma omp for schedule(static)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = std::upper_bound(first_item.begin(), first_item.end(), item) - first_item.begin() - 1;
      step_block(step.rule, tasks[t], item - first_item[t], step.grad_scale, buf.data());
    }
  }
}

}  // namespace kernels
}  // namespace lowbit
