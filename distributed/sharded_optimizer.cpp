// ShardedOptimizer: flat buffers, the sharded step (reduce-scatter -> fused update of the owned
// range -> all-gather), accounting. Checkpoints: sharded_checkpoint.cpp.
#include "sharded_optimizer.h"

#include <algorithm>

#include <lowbit/optim/fragment_access.h>
#include <lowbit/tensors/optim_ops.h>

#include "fragment_state.h"

namespace lowbit {
namespace distributed {

using optim::FragmentAccess;

namespace {

constexpr const char* kWho = "ShardedOptimizer";

bool same_slots(const std::vector<kernels::SlotType>& a, const optim::ParamState& st) {
  if (a.size() != st.slots.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (a[k] != st.slots[k].type) return false;
  return true;
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(std::shared_ptr<optim::LowbitOptimizer> optimizer,
                                   std::shared_ptr<Communicator> comm, ShardedOptions options)
    : optimizer_(std::move(optimizer)), comm_(std::move(comm)), options_(options) {
  TORCH_CHECK(optimizer_, kWho, ": optimizer is null");
  TORCH_CHECK(comm_, kWho, ": communicator is null");
  torch::NoGradGuard no_grad;
  const int rank = comm_->rank();
  auto& groups = optimizer_->param_groups();
  bool first = true;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (size_t i = 0; i < groups[gi].params().size(); ++i) {
      const at::Tensor& p = groups[gi].params()[i];
      const auto where = [&] { return c10::str("parameter ", i, " of group ", gi, " (shape ", p.sizes(), ")"); };
      TORCH_CHECK(p.defined() && p.layout() == at::kStrided, kWho, ": ", where(), " is not a dense tensor");
      const auto t = p.scalar_type();
      TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, kWho, ": ", where(), " has dtype ", t,
                  "; supported: float32, bfloat16, float16");
      if (first) device_ = p.device();
      first = false;
      TORCH_CHECK(p.device() == device_, kWho, ": ", where(), " is on ", p.device(), " but parameter 0 is on ",
                  device_, "; shard parameters of one device per optimizer");
      TORCH_CHECK(!FragmentAccess::state(*optimizer_, p), kWho, ": ", where(),
                  " already has optimizer state; wrap a fresh optimizer and load checkpoints into the ShardedOptimizer");
      Param pr{gi, i, p, 0, 0, -1, FragmentAccess::layout(*optimizer_, gi, p)};
      auto b = std::find_if(buffers_.begin(), buffers_.end(), [&](const Buffer& x) { return x.dtype == t; });
      if (b == buffers_.end()) b = buffers_.insert(buffers_.end(), Buffer{t, {}, {}, {}, {}, {}});
      pr.buffer = static_cast<size_t>(b - buffers_.begin());
      b->members.push_back(params_.size());
      params_.push_back(std::move(pr));
    }
  }
  // Flat buffers: the parameters are copied in, made identical on every rank, then become views.
  for (Buffer& b : buffers_) {
    std::vector<FlatEntry> entries;
    for (size_t m : b.members) entries.push_back({params_[m].param.numel(), params_[m].layout.block_size});
    b.layout = plan_flat_layout(entries, comm_->size());
    const auto opts = at::TensorOptions().dtype(b.dtype).device(device_);
    b.flat_param = at::zeros({b.layout.total}, opts);
    b.flat_grad = at::zeros({b.layout.total}, opts);
    b.grad_shard = options_.zero1 ? b.flat_grad.narrow(0, rank * b.layout.chunk, b.layout.chunk)
                                  : at::zeros({b.layout.chunk}, opts);
    for (size_t k = 0; k < b.members.size(); ++k) {
      Param& pr = params_[b.members[k]];
      pr.flat_offset = b.layout.offsets[k];
      b.flat_param.narrow(0, pr.flat_offset, pr.param.numel()).view(pr.param.sizes()).copy_(pr.param);
    }
    if (options_.broadcast_parameters) comm_->broadcast(b.flat_param, 0);
    for (size_t k = 0; k < b.members.size(); ++k) {
      Param& pr = params_[b.members[k]];
      pr.param.set_data(b.flat_param.narrow(0, pr.flat_offset, pr.param.numel()).view(pr.param.sizes()));
    }
  }
  // This rank's fragments, in (group, index) order (params_ is in that order).
  for (size_t m = 0; m < params_.size(); ++m) {
    Param& pr = params_[m];
    const Buffer& b = buffers_[pr.buffer];
    const size_t k = static_cast<size_t>(std::find(b.members.begin(), b.members.end(), m) - b.members.begin());
    const auto range = b.layout.owned(k, rank, pr.param.numel());
    if (range.first == range.second) continue;
    pr.fragment = static_cast<int>(fragments_.size());
    Fragment f;
    f.group = pr.group;
    f.index = pr.index;
    f.offset = range.first;
    f.numel = range.second - range.first;
    f.param_numel = pr.param.numel();
    fragments_.push_back(std::move(f));
    fragment_params_.push_back(b.flat_param.narrow(0, pr.flat_offset + range.first, range.second - range.first));
    fragment_grads_.push_back(
        b.grad_shard.narrow(0, pr.flat_offset + range.first - rank * b.layout.chunk, range.second - range.first));
  }
}

void ShardedOptimizer::ensure_states() {
  for (const Param& pr : params_) {
    if (pr.fragment < 0) continue;
    Fragment& f = fragments_[pr.fragment];
    if (!f.state.counters.defined()) f.state = FragmentAccess::make_state(*optimizer_, pr.group, pr.param, f.numel);
  }
}

void ShardedOptimizer::zero_grad(bool set_to_none) { optimizer_->zero_grad(set_to_none); }

int64_t ShardedOptimizer::state_bytes() const {
  int64_t total = 0;
  for (const Fragment& f : fragments_)
    for (const auto& s : f.state.slots) total += s.nbytes();
  return total;
}

int64_t ShardedOptimizer::skipped_steps() const {
  return skipped_loaded_ + (skipped_.defined() ? skipped_.item<int64_t>() : 0);
}

at::Tensor ShardedOptimizer::lamb_norms(size_t group, const std::vector<size_t>& frags, const at::Tensor& found_inf,
                                        const at::Tensor& sumsq) {
  // Every rank lays out the group's blocks the same way (from params_, not from what it owns), so
  // the all_reduce matches on every rank; a block's sums come from its one owner (others add 0).
  std::vector<int64_t> base(params_.size(), -1);
  int64_t blocks = 0;
  for (size_t m = 0; m < params_.size(); ++m) {
    if (params_[m].group != group) continue;
    base[m] = blocks;
    const int64_t bs = params_[m].layout.block_size;
    blocks += (params_[m].param.numel() + bs - 1) / bs;
  }
  at::Tensor sums = at::zeros({blocks, 2}, at::TensorOptions().dtype(at::kDouble).device(device_));
  const optim::CommonOptions c = FragmentAccess::common(*optimizer_, group);
  for (size_t m = 0; m < params_.size(); ++m) {
    const Param& pr = params_[m];
    if (pr.group != group || pr.fragment < 0) continue;
    const Fragment& f = fragments_[pr.fragment];
    const int64_t bs = f.state.block_size;
    ops::StepArgs a;
    a.config = FragmentAccess::config(*optimizer_, group);
    for (const auto& s : f.state.slots) a.slots.push_back(s.type);
    a.block_size = bs;
    a.lr = FragmentAccess::lr_tensor(*optimizer_, group, device_);
    a.seed = FragmentAccess::seed(*optimizer_);
    a.stochastic_round = c.bf16_stochastic_round;
    if (c.max_grad_norm > 0) {
      a.grad_sumsq = sumsq.narrow(0, static_cast<int64_t>(group), 1);
      a.max_grad_norm = c.max_grad_norm;
    }
    if (c.skip_nonfinite) a.found_inf = found_inf;
    // One entry per block: the op adds a parameter's blocks in order, so per-block sums let the
    // blocks of all ranks be added in that same order below.
    for (int64_t b = 0; b < f.numel; b += bs) {
      const int64_t len = std::min(bs, f.numel - b);
      a.params.push_back(fragment_params_[pr.fragment].narrow(0, b, len));
      a.grads.push_back(fragment_grads_[pr.fragment].narrow(0, b, len));
      a.counters.push_back(f.state.counters);
      a.offsets.push_back(f.offset + b);
      a.rng_keys.push_back(FragmentAccess::rng_key(pr.group, pr.index));
      append_state_range(f.state, b, len, a.state);
    }
    const at::Tensor part = ops::optim_lamb_norms(a, FragmentAccess::reference_path(*optimizer_));
    sums.narrow(0, base[m] + f.offset / bs, part.size(0)).copy_(part);
  }
  comm_->all_reduce(sums, ReduceOp::Sum);
  const at::Tensor host = sums.cpu();
  const double* s = host.data_ptr<double>();
  at::Tensor out = at::zeros({static_cast<int64_t>(frags.size()), 2}, at::TensorOptions().dtype(at::kDouble));
  double* o = out.data_ptr<double>();
  for (size_t j = 0; j < frags.size(); ++j) {
    const auto it = std::find_if(params_.begin(), params_.end(), [&](const Param& p) { return p.fragment == static_cast<int>(frags[j]); });
    const size_t m = static_cast<size_t>(it - params_.begin());
    const int64_t bs = params_[m].layout.block_size, nb = (params_[m].param.numel() + bs - 1) / bs;
    double pp = 0.0, rr = 0.0;
    for (int64_t b = 0; b < nb; ++b) {
      pp += s[2 * (base[m] + b)];
      rr += s[2 * (base[m] + b) + 1];
    }
    o[2 * j] = pp;
    o[2 * j + 1] = rr;
  }
  return out.to(device_);
}

at::Tensor ShardedOptimizer::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  const int rank = comm_->rank();
  // ---- gradients into the flat buffers, then averaged over the ranks.
  for (const Param& pr : params_) {
    const at::Tensor& g = pr.param.grad();
    TORCH_CHECK(g.defined(), kWho, ": parameter ", pr.index, " of group ", pr.group,
                " has no gradient; every rank needs a gradient for every parameter (zero it where unused)");
    TORCH_CHECK(g.sizes() == pr.param.sizes() && !g.is_sparse(), kWho, ": the gradient of parameter ", pr.index,
                " of group ", pr.group, " has shape ", g.sizes(), "; expected ", pr.param.sizes());
    buffers_[pr.buffer].flat_grad.narrow(0, pr.flat_offset, pr.param.numel()).view(pr.param.sizes()).copy_(g);
  }
  for (Buffer& b : buffers_) {
    if (options_.zero1)
      comm_->all_reduce(b.flat_grad, ReduceOp::Avg);
    else
      comm_->reduce_scatter(b.flat_grad, b.grad_shard, ReduceOp::Avg);
  }
  ensure_states();

  // ---- one small all_reduce: (any non-finite, each group's sum of squares) over the owned pieces.
  const auto& groups = optimizer_->param_groups();
  const int64_t ngroups = static_cast<int64_t>(groups.size());
  bool want_sumsq = false, prepass = false;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const optim::CommonOptions c = FragmentAccess::common(*optimizer_, gi);
    want_sumsq |= c.max_grad_norm > 0;
    prepass |= c.skip_nonfinite || c.max_grad_norm > 0;
  }
  at::Tensor found_inf, sumsq;
  bool cpu_found = false;
  if (prepass) {
    std::vector<at::Tensor> grads;
    std::vector<int64_t> gids;
    for (size_t f = 0; f < fragments_.size(); ++f) {
      grads.push_back(fragment_grads_[f]);
      gids.push_back(static_cast<int64_t>(fragments_[f].group));
    }
    at::Tensor found_local, sumsq_local;
    if (!grads.empty()) {
      std::tie(found_local, sumsq_local) = ops::grad_check(grads, gids, ngroups, want_sumsq);
    } else {
      found_local = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device_));
      sumsq_local = at::zeros({ngroups}, at::TensorOptions().dtype(at::kDouble).device(device_));
    }
    at::Tensor both = at::cat({found_local.to(at::kDouble), sumsq_local});
    comm_->all_reduce(both, ReduceOp::Sum);
    found_inf = both.narrow(0, 0, 1).gt(0).to(at::kFloat);  // the same decision on every rank
    sumsq = both.narrow(0, 1, ngroups);
    if (!skipped_.defined()) skipped_ = at::zeros({1}, at::TensorOptions().dtype(at::kLong).device(device_));
    if (device_.is_cpu()) {
      cpu_found = found_inf.data_ptr<float>()[0] != 0.0f;
      if (cpu_found) skipped_ += 1;
    } else {
      skipped_.add_(found_inf.to(at::kLong));
    }
  }

  // ---- the update of the owned pieces: per group, one op call per (dtype, state layout).
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const optim::CommonOptions c = FragmentAccess::common(*optimizer_, gi);
    if (c.skip_nonfinite && cpu_found) continue;
    const kernels::StepConfig cfg = FragmentAccess::config(*optimizer_, gi);
    struct Call {
      at::ScalarType dtype;
      std::vector<kernels::SlotType> slots;
      int64_t block_size;
      ops::StepArgs args;
      std::vector<size_t> frags;
    };
    std::vector<Call> calls;
    for (size_t fi = 0; fi < fragments_.size(); ++fi) {
      const Fragment& f = fragments_[fi];
      if (f.group != gi) continue;
      const at::ScalarType dtype = fragment_params_[fi].scalar_type();
      auto call = std::find_if(calls.begin(), calls.end(), [&](const Call& x) {
        return x.dtype == dtype && x.block_size == f.state.block_size && same_slots(x.slots, f.state);
      });
      if (call == calls.end()) {
        std::vector<kernels::SlotType> slots;
        for (const auto& s : f.state.slots) slots.push_back(s.type);
        call = calls.insert(calls.end(), Call{dtype, slots, f.state.block_size, {}, {}});
        ops::StepArgs& a = call->args;
        a.config = cfg;
        a.slots = slots;
        a.block_size = f.state.block_size;
        a.lr = FragmentAccess::lr_tensor(*optimizer_, gi, device_);
        a.seed = FragmentAccess::seed(*optimizer_);
        a.stochastic_round = c.bf16_stochastic_round;
        if (c.skip_nonfinite && prepass) a.found_inf = found_inf;
        if (c.max_grad_norm > 0) {
          a.grad_sumsq = sumsq.narrow(0, static_cast<int64_t>(gi), 1);
          a.max_grad_norm = c.max_grad_norm;
        }
        a.scalar_loop = FragmentAccess::scalar_loop(*optimizer_);
      }
      ops::StepArgs& a = call->args;
      a.params.push_back(fragment_params_[fi]);
      a.grads.push_back(fragment_grads_[fi]);
      a.counters.push_back(f.state.counters);
      a.offsets.push_back(f.offset);
      a.rng_keys.push_back(FragmentAccess::rng_key(f.group, f.index));
      append_state_range(f.state, 0, f.numel, a.state);
      call->frags.push_back(fi);
    }
    if (cfg.rule == kernels::Rule::LAMB) {
      // Collective: every rank runs it for every LAMB group, whatever it owns.
      std::vector<size_t> all;
      for (const Call& call : calls) all.insert(all.end(), call.frags.begin(), call.frags.end());
      const at::Tensor norms = lamb_norms(gi, all, found_inf, sumsq);
      int64_t row = 0;
      for (Call& call : calls) {
        const int64_t n = static_cast<int64_t>(call.frags.size());
        call.args.lamb_norms = norms.narrow(0, row, n);
        row += n;
      }
    }
    for (const Call& call : calls) ops::optim_step(call.args, FragmentAccess::reference_path(*optimizer_));
  }

  // ---- every rank's updated range to every rank: the parameters are views of flat_param.
  for (Buffer& b : buffers_) {
    at::Tensor mine = b.flat_param.narrow(0, rank * b.layout.chunk, b.layout.chunk);
    comm_->all_gather(mine, b.flat_param);
  }
  // Overflow of quantized state (CPU: free to read): reported once per piece, as a warning, since
  // only the owning rank sees it and an error there would leave the others waiting.
  for (Fragment& f : fragments_) {
    if (!f.state.counters.is_cpu()) continue;
    const int64_t blocks = f.state.counters.data_ptr<int64_t>()[1];
    if (blocks == f.state.overflow_reported) continue;
    TORCH_WARN(kWho, ": rank ", rank, ": the state of parameter ", f.index, " of group ", f.group, " (elements ",
               f.offset, "..", f.offset + f.numel, ") overflowed to Inf/NaN in ", blocks - f.state.overflow_reported,
               " block(s)");
    f.state.overflow_reported = blocks;
  }
  return loss;
}

}  // namespace distributed
}  // namespace lowbit
