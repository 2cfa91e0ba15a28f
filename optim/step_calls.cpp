// StepCalls, SkipCount and the state-range views (step_calls.h).
#include "step_calls.h"

#include <algorithm>
#include <cmath>

#include "../kernels/common/format_table.h"

namespace lowbit {
namespace optim {

void append_state_range(const ParamState& st, int64_t begin, int64_t len, std::vector<at::Tensor>& out) {
  const int64_t bs = st.block_size;
  TORCH_CHECK(bs > 0 && begin % bs == 0, "append_state_range: begin ", begin, " is not a multiple of the block size ",
              bs);
  for (const StateSlot& s : st.slots) {
    if (s.type.storage == kernels::SlotStorage::Quant) {
      const QuantFormat f = s.type.format;
      out.push_back(s.quantized.codes().narrow(0, code_bytes(f, begin), code_bytes(f, len)));
      out.push_back(s.quantized.absmax().narrow(0, begin / bs, (len + bs - 1) / bs));
    } else if (s.type.storage != kernels::SlotStorage::None) {
      out.push_back(s.dense.narrow(0, begin, len));
    }
  }
}

StepCalls::StepCalls(GroupStep group, size_t capacity) : group_(std::move(group)), capacity_(capacity) {}

StepCalls::Bucket& StepCalls::bucket_for(const at::Tensor& param, const ParamState& state) {
  // Compared slot by slot, no list built per item (thousands of small parameters make this loop
  // the host's cost of a step).
  auto b = std::find_if(buckets_.begin(), buckets_.end(), [&](const Bucket& x) {
    if (x.device != param.device() || x.block_size != state.block_size || x.slots.size() != state.slots.size())
      return false;
    for (size_t k = 0; k < state.slots.size(); ++k)
      if (x.slots[k] != state.slots[k].type) return false;
    return true;
  });
  if (b != buckets_.end()) return *b;
  std::vector<kernels::SlotType> slots;
  for (const StateSlot& s : state.slots) slots.push_back(s.type);
  Bucket& nb = buckets_.emplace_back(Bucket{param.device(), slots, state.block_size, {}, {}});
  const GradChecks checks = group_.grad_checks ? group_.grad_checks(param.device()) : GradChecks{};
  const CommonOptions& c = group_.common;
  ops::StepArgs& a = nb.args;
  a.config = group_.config;
  a.slots = slots;
  a.block_size = state.block_size;
  a.lr = group_.lr(param.device());
  a.seed = group_.seed;
  a.stochastic_round = c.bf16_stochastic_round;
  if (c.skip_nonfinite && checks.found_inf.defined()) a.found_inf = checks.found_inf;
  if (c.max_grad_norm > 0) {
    a.grad_sumsq = checks.grad_sumsq;
    a.max_grad_norm = c.max_grad_norm;
  }
  a.scalar_loop = group_.scalar_loop;
  a.params.reserve(capacity_);
  a.grads.reserve(capacity_);
  a.counters.reserve(capacity_);
  a.offsets.reserve(capacity_);
  a.rng_keys.reserve(capacity_);
  a.state.reserve(capacity_ * 2 * slots.size());
  return nb;
}

ops::StepArgs& StepCalls::add_item(const at::Tensor& param, const at::Tensor& grad, const ParamState& state,
                                   int64_t offset, int64_t rng_key, const at::Tensor& lamb_norms) {
  Bucket& b = bucket_for(param, state);
  ops::StepArgs& a = b.args;
  a.params.push_back(param);
  a.grads.push_back(grad);
  a.counters.push_back(state.counters);
  a.offsets.push_back(offset);
  a.rng_keys.push_back(rng_key);
  if (lamb_norms.defined()) b.norms.push_back(lamb_norms);
  return a;
}

void StepCalls::add(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, int64_t offset,
                    int64_t rng_key, const at::Tensor& lamb_norms) {
  ops::StepArgs& a = add_item(param, grad, state, offset, rng_key, lamb_norms);
  for (const StateSlot& s : state.slots) {
    if (s.type.storage == kernels::SlotStorage::Quant) {
      a.state.push_back(s.quantized.codes());
      a.state.push_back(s.quantized.absmax());
    } else if (s.type.storage != kernels::SlotStorage::None) {
      a.state.push_back(s.dense);
    }
  }
}

void StepCalls::add_range(const at::Tensor& param, const at::Tensor& grad, const ParamState& state,
                          int64_t state_begin, int64_t offset, int64_t rng_key) {
  ops::StepArgs& a = add_item(param, grad, state, offset, rng_key, at::Tensor());
  append_state_range(state, state_begin, param.numel(), a.state);
}

void StepCalls::step() {
  for (Bucket& b : buckets_) {
    if (!b.norms.empty()) b.args.lamb_norms = at::cat(b.norms);
    ops::optim_step(std::move(b.args), group_.reference);
  }
  buckets_.clear();
}

at::Tensor StepCalls::lamb_norms() {
  TORCH_CHECK(buckets_.size() == 1, "StepCalls::lamb_norms: the items need ", buckets_.size(),
              " calls; LAMB's norms are taken over items of one state layout on one device");
  at::Tensor out = ops::optim_lamb_norms(std::move(buckets_[0].args), group_.reference);
  buckets_.clear();
  return out;
}

bool StepCalls::lamb_first_pass() {
  bool found = false;
  for (Bucket& b : buckets_) {
    TORCH_CHECK(b.norms.empty() && !b.args.lamb_norms, "StepCalls::lamb_first_pass: the norms are given already");
    at::Tensor rows = ops::optim_lamb_norms(b.args, group_.reference);  // the args are copied: step() needs them
    const at::Tensor host = rows.cpu();
    const double* r = host.const_data_ptr<double>();
    bool finite_rows = true;
    for (size_t i = 0; i < b.args.grads.size(); ++i) {
      if (std::isfinite(r[2 * i]) && std::isfinite(r[2 * i + 1])) continue;
      finite_rows = false;
      const at::Tensor& g = b.args.grads[i];
      const at::Tensor flag = std::get<0>(ops::grad_check({g}, {0}, 1, false));
      found |= flag.cpu().const_data_ptr<float>()[0] != 0.0f;
    }
    if (finite_rows) b.args.lamb_norms = rows;
  }
  return found;
}

bool count_skipped(at::Tensor& skipped, const at::Tensor& found_inf) {
  if (!skipped.defined()) skipped = at::zeros({1}, found_inf.options().dtype(at::kLong));
  if (found_inf.is_cpu() && skipped.is_cpu()) {
    const bool found = found_inf.data_ptr<float>()[0] != 0.0f;
    if (found) skipped += 1;
    return found;
  }
  skipped.add_(found_inf.to(skipped.device()).to(at::kLong));
  return false;
}

Overflow fresh_overflow(const ParamState& st) {
  const at::Tensor c = st.counters.is_cpu() ? st.counters : st.counters.cpu();  // .cpu() dispatches even on the CPU
  const int64_t blocks = c.data_ptr<int64_t>()[1];
  const Overflow fresh{blocks - st.overflow_reported, c.data_ptr<int64_t>()[0]};
  st.overflow_reported = blocks;
  return fresh;
}

}  // namespace optim
}  // namespace lowbit
