// FullyShardedModule: units of a module as buckets of a fully sharded ShardedOptimizer, gathered
// around each unit's forward and backward (fully_sharded_module.h).
#include "fully_sharded_module.h"

#include <torch/autograd.h>

#include "../kernels/common/state_slots.h"

#include <algorithm>
#include <cstdio>
#include <unordered_map>

namespace lowbit {
namespace distributed {

namespace {

constexpr const char* kModule = "FullyShardedModule";

// Identity in forward; in backward it first has the unit's parameters gathered again.
struct UnitBoundary : public torch::autograd::Function<UnitBoundary> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t module,
                            int64_t unit) {
    ctx->saved_data["module"] = module;
    ctx->saved_data["unit"] = unit;
    return x;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* m = reinterpret_cast<FullyShardedModule*>(ctx->saved_data["module"].toInt());
    m->before_backward(static_cast<size_t>(ctx->saved_data["unit"].toInt()));
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

FullyShardedModule::FullyShardedModule(std::shared_ptr<torch::nn::Module> root,
                                       std::vector<std::shared_ptr<torch::nn::Module>> units,
                                       std::shared_ptr<optim::LowbitOptimizer> optimizer,
                                       std::shared_ptr<Communicator> comm, FullyShardedOptions options)
    : root_(std::move(root)), options_(options) {
  TORCH_CHECK(root_, kModule, ": root is null");
  TORCH_CHECK(optimizer, kModule, ": optimizer is null");
  const auto floating = [](at::ScalarType t) { return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf; };
  TORCH_CHECK(!options_.param_dtype || floating(*options_.param_dtype), kModule,
              ": FullyShardedOptions::param_dtype is ", *options_.param_dtype,
              "; parameters compute in float32, bfloat16 or float16");
  TORCH_CHECK(!options_.reduce_dtype || floating(*options_.reduce_dtype), kModule,
              ": FullyShardedOptions::reduce_dtype is ", *options_.reduce_dtype,
              "; gradients are reduced in float32, bfloat16 or float16");
  // The optimizer's parameters, numbered as ShardedOptimizer numbers them: (group, index) order.
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (const auto& g : optimizer->param_groups())
    for (const at::Tensor& p : g.params()) index.emplace(p.unsafeGetTensorImpl(), index.size());
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : root_->named_parameters(true)) names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  const size_t n = units.size();
  std::vector<size_t> unit_of(index.size(), n);
  std::vector<ShardedOptimizer::Unit> in_forward(n + 1);
  for (size_t u = 0; u < n; ++u) {
    TORCH_CHECK(units[u], kModule, ": unit ", u, " is null");
    for (const auto& item : units[u]->named_parameters(true)) {
      const c10::TensorImpl* impl = item.value().unsafeGetTensorImpl();
      const auto name = names.find(impl);
      TORCH_CHECK(name != names.end(), kModule, ": parameter '", item.key(), "' of unit ", u,
                  " is not a parameter of the root module; units are submodules of it");
      const auto m = index.find(impl);
      if (m == index.end()) continue;  // not trained: stays whole
      TORCH_CHECK(unit_of[m->second] == n, kModule, ": parameter '", name->second, "' is in unit ", unit_of[m->second],
                  " and in unit ", u, "; a parameter belongs to one unit (leave a shared one to the root)");
      unit_of[m->second] = u;
      in_forward[u].members.push_back(m->second);
    }
    in_forward[u].name = c10::str("unit ", u);
  }
  for (size_t m = 0; m < unit_of.size(); ++m)
    if (unit_of[m] == n) in_forward[n].members.push_back(m);
  in_forward[n].name = "the root unit";
  // Reduced as backward completes them: the last unit first, the root (whose embedding's gradient
  // comes last) at the end.
  std::vector<ShardedOptimizer::Unit> reduce_order;
  for (size_t u = n; u-- > 0;) reduce_order.push_back(in_forward[u]);
  reduce_order.push_back(in_forward[n]);
  // FullyShardedOptions::initialize: by the parameter's name in the root module.
  ShardedOptimizer::ShardFill fill;
  if (options_.initialize) {
    std::vector<std::pair<std::string, at::Tensor>> named(index.size());
    for (const auto& g : optimizer->param_groups())
      for (const at::Tensor& p : g.params()) {
        const auto name = names.find(p.unsafeGetTensorImpl());
        TORCH_CHECK(name != names.end(), kModule, ": FullyShardedOptions::initialize fills parameters by their name in "
                    "the root module, and parameter ", index.at(p.unsafeGetTensorImpl()), " of the optimizer (shape ",
                    p.sizes(), ") is not one of its parameters");
        named[index.at(p.unsafeGetTensorImpl())] = {name->second, p};
      }
    fill = [init = options_.initialize, named = std::move(named)](size_t m, int64_t first, const at::Tensor& values) {
      init(named[m].first, named[m].second, first, values);
    };
  }
  ShardedOptions so;
  so.overlap = true;
  so.release_gradients = true;
  so.broadcast_parameters = options_.broadcast_parameters;
  so.gradient_wire = options_.gradient_wire;
  sharded_.reset(new ShardedOptimizer(std::move(optimizer), std::move(comm), so, std::move(reduce_order),
                                      options_.step_in_backward, options_.device,
                                      ShardedOptimizer::Precision{options_.param_dtype, options_.reduce_dtype},
                                      std::move(fill)));
  unit_buckets_.resize(n + 1);
  for (size_t b = 0; b < sharded_->buckets_.size(); ++b) {
    const size_t r = sharded_->buckets_[b].unit;  // in reduce order
    unit_buckets_[r < n ? n - 1 - r : n].push_back(b);
  }
  prefetched_.assign(n + 1, 0);
}

FullyShardedModule::~FullyShardedModule() = default;

void FullyShardedModule::gather_unit(size_t u) {
  for (size_t b : unit_buckets_[u]) sharded_->gather(b);
  if (prefetched_[u]) {
    // Only its own gathers: a reduce-scatter issued since runs on under this unit's compute.
    sharded_->communicator().order_after_collective(prefetched_[u]);
    prefetched_[u] = 0;
  }
}

void FullyShardedModule::prefetch_unit(size_t u) {
  Communicator& comm = sharded_->communicator();
  DeferredStreamWaits deferred(comm);
  for (size_t b : unit_buckets_[u]) {
    if (sharded_->buckets_[b].gathered) continue;
    sharded_->gather(b);
    prefetched_[u] = comm.collectives_issued();
  }
}

void FullyShardedModule::release_unit(size_t u) {
  if (prefetched_[u]) {  // its gather may still be writing the memory
    sharded_->communicator().order_after_collective(prefetched_[u]);
    prefetched_[u] = 0;
  }
  for (size_t b : unit_buckets_[u]) sharded_->release(b);
}

at::Tensor FullyShardedModule::forward(const std::function<at::Tensor()>& fn) {
  TORCH_CHECK(!in_forward_, kModule, ": forward() inside forward()");
  const bool grad = at::GradMode::is_enabled();
  {
    torch::NoGradGuard no_grad;  // gathering is not part of the graph
    gather_unit(root_unit());
  }
  in_forward_ = true;
  at::Tensor out;
  try {
    out = fn();
  } catch (...) {
    in_forward_ = false;
    throw;
  }
  in_forward_ = false;
  if (!grad) release_all();  // no backward will follow
  return out;
}

at::Tensor FullyShardedModule::unit(size_t u, const std::function<at::Tensor()>& fn) {
  TORCH_CHECK(in_forward_, kModule, ": unit(", u, ") outside forward(); run the units from forward()'s function");
  TORCH_CHECK(u < units(), kModule, ": unit ", u, " does not exist; there are ", units());
  const bool grad = at::GradMode::is_enabled();
  {
    torch::NoGradGuard no_grad;
    gather_unit(u);
    if (u + 1 < units()) prefetch_unit(u + 1);
  }
  at::Tensor out = fn();
  torch::NoGradGuard no_grad;
  if (options_.reshard_after_forward || !grad) release_unit(u);
  if (!grad || !out.defined() || !out.requires_grad()) return out;
  at::AutoGradMode enable(true);
  return UnitBoundary::apply(out, reinterpret_cast<int64_t>(this), static_cast<int64_t>(u));
}

void FullyShardedModule::before_backward(size_t u) {
  torch::NoGradGuard no_grad;
  // Backward has passed every later unit: their gradients are all in (a parameter without one on
  // this rank counts as zeros), so every rank reduces them before this gather, in the same order.
  if (!sharded_->accumulating()) {
    size_t later = 0;
    for (size_t v = u + 1; v < units(); ++v) later += unit_buckets_[v].size();
    sharded_->reduce_buckets_before(later);
  }
  gather_unit(u);
  if (u > 0) prefetch_unit(u - 1);
}

void FullyShardedModule::step() {
  TORCH_CHECK(!in_forward_, kModule, ": step() inside forward()");
  sharded_->step();
  release_all();
}

void FullyShardedModule::zero_grad(bool set_to_none) { sharded_->zero_grad(set_to_none); }

void FullyShardedModule::load(const std::string& prefix, const optim::LoadOptions& options) {
  TORCH_CHECK(!in_forward_, kModule, ": load() inside forward()");
  sharded_->load(prefix, options);  // the units come back released: the next use gathers the loaded shards
  std::fill(prefetched_.begin(), prefetched_.end(), 0);
}

void FullyShardedModule::set_accumulating(bool on) { sharded_->set_accumulating(on); }

void FullyShardedModule::gather_all() {
  torch::NoGradGuard no_grad;
  for (size_t u = 0; u < unit_buckets_.size(); ++u) gather_unit(u);
}

void FullyShardedModule::gather(size_t u) {
  TORCH_CHECK(u < unit_buckets_.size(), kModule, ": unit ", u, " does not exist; there are ", units(),
              " (and the root, ", units(), ")");
  torch::NoGradGuard no_grad;
  gather_unit(u);
}

void FullyShardedModule::release(size_t u) {
  TORCH_CHECK(u < unit_buckets_.size(), kModule, ": unit ", u, " does not exist; there are ", units(),
              " (and the root, ", units(), ")");
  release_unit(u);
}

void FullyShardedModule::release_all() {
  for (size_t u = 0; u < unit_buckets_.size(); ++u) release_unit(u);
}

FullyShardedMemory FullyShardedModule::memory_report() const {
  FullyShardedMemory r;
  for (const auto& p : sharded_->params_) r.parameters += p.param.numel();
  r.shard_bytes = shard_bytes();
  for (const auto& f : sharded_->fragments_)
    for (const optim::StateSlot& s : f.state.slots)
      (kernels::is_correction(s.type.storage) ? r.correction_bytes : r.state_bytes) += s.nbytes();
  const ShardedOptimizer::Transient now = sharded_->transient_now(), peak = sharded_->transient_peak_;
  r.gathered_bytes = now.gathered;
  r.gradient_bytes = now.gradients;
  r.gradient_shard_bytes = now.gradient_shards;
  r.peak_gathered_bytes = std::max(peak.gathered, now.gathered);
  r.peak_gradient_bytes = std::max(peak.gradients, now.gradients);
  r.peak_gradient_shard_bytes = std::max(peak.gradient_shards, now.gradient_shards);
  return r;
}

void FullyShardedModule::reset_memory_peaks() { sharded_->transient_peak_ = sharded_->transient_now(); }

std::string FullyShardedMemory::to_string() const {
  std::string out;
  const auto line = [&](const char* part, int64_t bytes) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%-28s %16lld B  (%.3f B/param)\n", part, static_cast<long long>(bytes),
                  parameters ? double(bytes) / double(parameters) : 0.0);
    out += buf;
  };
  line("weight shards", shard_bytes);
  line("state", state_bytes);
  line("correction", correction_bytes);
  line("persistent", persistent_bytes());
  line("gathered weights now / peak", gathered_bytes);
  line("", peak_gathered_bytes);
  line("gradient buffers now / peak", gradient_bytes);
  line("", peak_gradient_bytes);
  line("gradient shards now / peak", gradient_shard_bytes);
  line("", peak_gradient_shard_bytes);
  line("persistent + peaks", peak_bound_bytes());
  return out;
}

int64_t FullyShardedModule::shard_bytes() const {
  int64_t total = 0;
  for (const auto& b : sharded_->buckets_) total += b.shard.nbytes();
  return total;
}

int64_t FullyShardedModule::model_bytes() const {
  int64_t total = 0;
  for (const auto& b : sharded_->buckets_) total += b.layout.total * static_cast<int64_t>(c10::elementSize(b.dtype));
  return total;
}

int64_t FullyShardedModule::gathered_bytes() const {
  int64_t total = 0;
  for (const auto& b : sharded_->buckets_) total += static_cast<int64_t>(b.flat_param.storage().nbytes());
  return total;
}

bool FullyShardedModule::gathered(size_t u) const {
  TORCH_CHECK(u < unit_buckets_.size(), kModule, ": unit ", u, " does not exist; there are ", units(),
              " (and the root, ", units(), ")");
  for (size_t b : unit_buckets_[u])
    if (!sharded_->buckets_[b].gathered) return false;
  return true;
}

}  // namespace distributed
}  // namespace lowbit
