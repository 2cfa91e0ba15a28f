// ShardedOptimizer: flat buffers, the sharded step (reduce-scatter -> fused update of the owned
// range -> all-gather), accounting. Checkpoints: sharded_checkpoint.cpp.
#include "sharded_optimizer.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/engine.h>

#include "../kernels/common/step_config.h"
#include "../optim/fragment_access.h"
#include "../optim/grad_hooks.h"
#include "../optim/step_calls.h"
#include "../tensors/optim_ops.h"
#include "rank_agreement.h"
#include "serial_worker.h"
#include "storage_residency.h"


namespace lowbit {
namespace distributed {

using optim::FragmentAccess;

namespace {

constexpr const char* kSharded = "ShardedOptimizer";
// step() all-gathers the buckets in groups of at least this many bytes (one NCCL group each):
// smaller all-gathers run well under the bus bandwidth (32 MiB ones took 0.10 ms against 0.058 ms
// at the rate of one 1 GiB all-gather, 2 x H200), while a group's all-gather still overlaps the
// next group's update.
constexpr int64_t kGatherBytes = int64_t{128} << 20;

}  // namespace

ShardedOptimizer::ShardedOptimizer(std::shared_ptr<optim::LowbitOptimizer> optimizer,
                                   std::shared_ptr<Communicator> comm, ShardedOptions options)
    : ShardedOptimizer(std::move(optimizer), std::move(comm), options, {}, false, std::nullopt, {}, nullptr) {}

ShardedOptimizer::ShardedOptimizer(std::shared_ptr<optim::LowbitOptimizer> optimizer,
                                   std::shared_ptr<Communicator> comm, ShardedOptions options,
                                   std::vector<Unit> units, bool step_in_backward,
                                   std::optional<at::Device> device, Precision precision, ShardFill fill)
    : optimizer_(std::move(optimizer)),
      comm_(std::move(comm)),
      options_(options),
      units_(std::move(units)),
      step_in_backward_(step_in_backward),
      precision_(precision) {
  TORCH_CHECK(optimizer_, kSharded, ": optimizer is null");
  TORCH_CHECK(comm_, kSharded, ": communicator is null");
  TORCH_CHECK(options_.bucket_bytes >= 0, kSharded,
              ": ShardedOptions::bucket_bytes must be >= 0 (0: the default), got ", options_.bucket_bytes);
  TORCH_CHECK(!options_.overlap_thread.value_or(false) || options_.overlap, kSharded,
              ": ShardedOptions::overlap_thread is true without overlap; the thread runs the overlap's hooks (set "
              "overlap, or leave overlap_thread unset)");
  const char* grad_wire_option = gradient_wire_option();
  if (options_.gradient_wire) {
    check_wire_compression(*options_.gradient_wire, grad_wire_option);
    TORCH_CHECK(!options_.zero1, kSharded, ": ShardedOptions::gradient_wire compresses the reduce-scatter; with zero1 "
                "the gradients are all-reduced, which it does not compress (unset one of the two)");
    TORCH_CHECK(!fully_sharded() || !options_.gradient_wire->error_feedback, "FullyShardedModule: ", grad_wire_option,
                " with error_feedback would keep on every rank what quantization lost of each unit's whole gradient "
                "(4 bytes per parameter of the model), the memory full sharding exists to save; set error_feedback "
                "false");
  }
  if (options_.update_wire) check_wire_compression(*options_.update_wire, "ShardedOptions::update_wire");
  TORCH_INTERNAL_ASSERT(!fully_sharded() || (options_.overlap && options_.release_gradients && !options_.zero1 &&
                                             !options_.update_wire));
  TORCH_INTERNAL_ASSERT(!step_in_backward_ || fully_sharded());
  TORCH_INTERNAL_ASSERT(!device || fully_sharded());
  TORCH_INTERNAL_ASSERT((!precision_.compute && !precision_.reduce) || fully_sharded());
  TORCH_INTERNAL_ASSERT(!fill || fully_sharded());
  filled_ = static_cast<bool>(fill);
  if (step_in_backward_) check_step_in_backward();
  torch::NoGradGuard no_grad;
  const int rank = comm_->rank();
  auto& groups = optimizer_->param_groups();
  bool first = true;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    for (size_t i = 0; i < groups[gi].params().size(); ++i) {
      const at::Tensor& p = groups[gi].params()[i];
      const auto where = [&] { return c10::str("parameter ", i, " of group ", gi, " (shape ", p.sizes(), ")"); };
      TORCH_CHECK(p.defined() && p.layout() == at::kStrided, kSharded, ": ", where(), " is not a dense tensor");
      const auto t = p.scalar_type();
      TORCH_CHECK(t == at::kFloat || t == at::kBFloat16 || t == at::kHalf, kSharded, ": ", where(), " has dtype ", t,
                  "; supported: float32, bfloat16, float16");
      if (first) device_ = device ? *device : p.device();
      first = false;
      // Fully sharded onto a device: the parameters may start on the host (a model larger than one
      // device is built there and sharded onto the devices).
      TORCH_CHECK(p.device() == device_ || (device && p.is_cpu()), kSharded, ": ", where(), " is on ", p.device(),
                  " but parameter 0 is on ", device_, "; shard parameters of one device per optimizer");
      TORCH_CHECK(compute_dtype(t) == t || FragmentAccess::group_step(*optimizer_, gi).common.master_weight_bits == 0,
                  "FullyShardedModule: FullyShardedOptions::param_dtype ", *precision_.compute, " with group ", gi,
                  "'s master_weight_bits ", FragmentAccess::group_step(*optimizer_, gi).common.master_weight_bits,
                  ": ", where(), " stays a float32 shard, its own master weight; set master_weight_bits 0 (or "
                  "build the model in bfloat16 for a bfloat16 shard with a correction)");
      TORCH_CHECK(!optimizer_->state_of(p), kSharded, ": ", where(),
                  " already has optimizer state; wrap a fresh optimizer and load checkpoints into the ShardedOptimizer");
      params_.push_back(Param{gi, i, p, 0, 0, -1, FragmentAccess::layout(*optimizer_, gi, p), at::Tensor()});
    }
  }
  std::vector<size_t> unit_of(params_.size(), units_.size());
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t m : units_[u].members) {
      TORCH_INTERNAL_ASSERT(m < params_.size() && unit_of[m] == units_.size());
      unit_of[m] = u;
    }
  TORCH_INTERNAL_ASSERT(std::count(unit_of.begin(), unit_of.end(), units_.size()) == 0 || units_.empty());
  check_ranks_agree();
  if (options_.gradient_wire && comm_->size() > 1) {
    // The wire's exchange, tried once on every rank (the same backend refuses on every rank).
    at::Tensor probe = at::zeros({comm_->size()}, at::TensorOptions().dtype(at::kByte).device(device_));
    at::Tensor out = at::empty_like(probe);
    try {
      comm_->all_to_all(probe, out);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, fully_sharded() ? "FullyShardedModule" : kSharded, ": ", grad_wire_option,
                  " exchanges quantized chunks with all_to_all, which the ",
                  comm_->backend(), " communicator refused on rank ", comm_->rank(), ": ", e.what_without_backtrace());
    }
  }
  // Fully sharded, the units' all-gathers are issued from backward()'s thread: the reductions stay
  // there too, so that every rank issues them all in one order.
  if (options_.overlap && !fully_sharded() && options_.overlap_thread.value_or(!device_.is_cpu()))
    worker_ = std::make_unique<SerialWorker>();
  // The hooks check every parameter before any collective, so a refusal is the same on every rank
  // and leaves the parameters as they were. They fire only in backward(), never before the end of
  // this constructor.
  if (options_.overlap) {
    std::vector<at::Tensor> ps;
    for (const Param& pr : params_) ps.push_back(pr.param);
    hooks_ = std::make_unique<optim::GradHooks>(
        c10::str(kSharded, " (ShardedOptions::overlap)"), std::move(ps), [this](size_t m) { return name(m); },
        [this](size_t m, const at::Tensor& param) { on_gradient(m, param); });
  }
  // Buckets: the parameters are copied in, made identical on every rank (or each rank fills what
  // it owns), then become views.
  std::vector<std::vector<size_t>> planned = plan_buckets();
  int64_t float_chunks = 0;
  for (const std::vector<size_t>& members : planned) {
    if (options_.zero1 || step_in_backward_ || reduce_dtype(params_[members[0]].param.scalar_type()) != at::kFloat)
      continue;
    float_chunks += layout_of(members).chunk;
  }
  // FullyShardedOptions::initialize: every bucket's own range filled first, and the ranks agree that
  // it went well before any parameter becomes a view of the buckets (a refusal changes nothing).
  std::vector<at::Tensor> filled = fill ? fill_own_ranges(planned, fill) : std::vector<at::Tensor>{};
  if (float_chunks > 0) float_shards_ = at::zeros({float_chunks}, at::TensorOptions().dtype(at::kFloat).device(device_));
  int64_t float_used = 0;
  for (std::vector<size_t>& members : planned) {
    Bucket b;
    b.dtype = params_[members[0]].param.scalar_type();
    b.compute = compute_dtype(b.dtype);
    b.reduce = reduce_dtype(b.dtype);
    b.members = std::move(members);
    b.layout = layout_of(b.members);
    const auto opts = at::TensorOptions().dtype(b.dtype).device(device_);
    // ZeRO-1/2: the parameters live in flat_param and are all-gathered into it every step, in memory
    // the communicator gathers into fastest (gather_buffer); fully sharded: a transient buffer.
    b.flat_param = fully_sharded() ? at::zeros({b.layout.total}, opts) : comm_->gather_buffer(b.layout.total, opts).zero_();
    // ZeRO-1/2: in memory the communicator reduces from fastest (gather_buffer); fully sharded: transient.
    b.flat_grad = fully_sharded() ? at::zeros({b.layout.total}, opts.dtype(b.reduce))
                                  : comm_->gather_buffer(b.layout.total, opts.dtype(b.reduce)).zero_();
    if (options_.zero1) {
      b.grad_shard = b.flat_grad.narrow(0, rank * b.layout.chunk, b.layout.chunk);
    } else if (b.reduce == at::kFloat && !step_in_backward_) {
      b.grad_shard = float_shards_.narrow(0, float_used, b.layout.chunk);
      b.sum_only = true;
      float_used += b.layout.chunk;
    } else {
      // step_in_backward: a shard of its own, held only from the bucket's reduction to its step;
      // float32 summed and divided by the world size as the shared buffer is.
      b.grad_shard = at::zeros({b.layout.chunk}, opts.dtype(b.reduce));
      b.sum_only = step_in_backward_ && b.reduce == at::kFloat;
    }
    for (size_t k = 0; k < b.members.size(); ++k) {
      Param& pr = params_[b.members[k]];
      pr.bucket = buckets_.size();
      pr.flat_offset = b.layout.offsets[k];
      pr.in_flat_grad = b.flat_grad.narrow(0, pr.flat_offset, pr.param.numel()).view(pr.param.sizes());
      if (!fill) b.flat_param.narrow(0, pr.flat_offset, pr.param.numel()).view(pr.param.sizes()).copy_(pr.param);
    }
    // Filled: the whole buffer is released below, unread; the filled range becomes the shard.
    if (!fill && options_.broadcast_parameters) comm_->broadcast(b.flat_param, 0);
    for (size_t m : b.members) {
      Param& pr = params_[m];
      pr.param.set_data(b.flat_param.narrow(0, pr.flat_offset, pr.param.numel()).view(pr.param.sizes()));
    }
    if (fully_sharded()) {
      // The shard persists; the whole buffers get memory only while in use.
      b.unit = unit_of[b.members[0]];
      // Filled: the shard is the filled range itself (no second copy of it: at the memory floor
      // every rank's shards are most of what it holds).
      b.shard = fill ? std::move(filled[buckets_.size()])
                     : b.flat_param.narrow(0, rank * b.layout.chunk, b.layout.chunk).clone();
      // Mixed precision: the parameters compute (and are gathered) in b.compute from here on.
      if (b.compute != b.dtype) b.flat_param = at::zeros({b.layout.total}, opts.dtype(b.compute));
      int64_t end = 0;
      for (size_t k = 0; k < b.members.size(); ++k) {
        if (b.layout.offsets[k] > end) b.padding.push_back({end, b.layout.offsets[k] - end});
        end = b.layout.offsets[k] + params_[b.members[k]].param.numel();
      }
      if (b.layout.total > end) b.padding.push_back({end, b.layout.total - end});
      b.released = unreadable_like(
          b.flat_param, c10::str("FullyShardedModule: this parameter of ", units_[b.unit].name,
                                 " is released (only this rank's shard lives between the unit's uses); read it "
                                 "inside forward() or backward(), or after gather_all()"));
      release(b);
      release_storage(b.flat_grad);
    }
    b.waiting = b.members.size();
    make_wire_buffers(b);
    buckets_.push_back(std::move(b));
  }
  // This rank's fragments, in (group, index) order (params_ is in that order).
  for (size_t m = 0; m < params_.size(); ++m) {
    Param& pr = params_[m];
    Bucket& b = buckets_[pr.bucket];
    const size_t k = static_cast<size_t>(std::find(b.members.begin(), b.members.end(), m) - b.members.begin());
    const auto range = b.layout.owned(k, rank, pr.param.numel());
    if (range.first == range.second) continue;
    pr.fragment = static_cast<int>(fragments_.size());
    b.fragments.push_back(fragments_.size());
    Fragment f;
    f.group = pr.group;
    f.index = pr.index;
    f.offset = range.first;
    f.numel = range.second - range.first;
    f.param_numel = pr.param.numel();
    fragments_.push_back(std::move(f));
    fragment_param_.push_back(m);
    fragment_params_.push_back(fully_sharded()
                                   ? b.shard.narrow(0, pr.flat_offset + range.first - rank * b.layout.chunk,
                                                    range.second - range.first)
                                   : b.flat_param.narrow(0, pr.flat_offset + range.first, range.second - range.first));
    fragment_grads_.push_back(
        b.grad_shard.narrow(0, pr.flat_offset + range.first - rank * b.layout.chunk, range.second - range.first));
  }
  if (step_in_backward_)  // the views above made: memory from each reduction to its step only
    for (Bucket& b : buckets_) release_storage(b.grad_shard);
  // Fully sharded: the state is made now, not in the first step, so that what a rank keeps for the
  // whole run is allocated before the units' transient buffers come and go around it (a first step
  // that allocated both interleaved could leave the allocator's free memory in pieces), and a model
  // whose state does not fit fails here rather than in its first backward.
  if (fully_sharded()) ensure_states();
}

ShardedOptimizer::~ShardedOptimizer() {
  hooks_.reset();
  // What the hooks handed the worker is issued, as the hooks would have issued it themselves: the
  // other ranks wait for these collectives.
  if (worker_) try {
      worker_->drain();
    } catch (...) {  // a failed collective: the communicator has reported it
    }
}

std::vector<at::Tensor> ShardedOptimizer::fill_own_ranges(const std::vector<std::vector<size_t>>& planned,
                                                          const ShardFill& fill) {
  const int rank = comm_->rank();
  std::vector<at::Tensor> out;
  std::string error;
  try {
    for (const std::vector<size_t>& members : planned) {
      const FlatLayout layout = layout_of(members);
      out.push_back(at::zeros({layout.chunk}, at::TensorOptions().dtype(params_[members[0]].param.scalar_type()).device(device_)));
      for (size_t k = 0; k < members.size(); ++k) {
        const auto range = layout.owned(k, rank, params_[members[k]].param.numel());
        if (range.first < range.second)
          fill(members[k], range.first,
               out.back().narrow(0, layout.offsets[k] + range.first - rank * layout.chunk, range.second - range.first));
      }
    }
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt).device(device_));
  comm_->all_reduce(failed, ReduceOp::Sum);
  const int64_t failures = failed.cpu().item<int64_t>();
  TORCH_CHECK(error.empty(), "FullyShardedModule: FullyShardedOptions::initialize failed on rank ", rank, ": ", error,
              " (nothing was changed)");
  TORCH_CHECK(failures == 0, "FullyShardedModule: FullyShardedOptions::initialize failed on ", failures,
              " other rank(s) (nothing was changed)");
  return out;
}

FlatLayout ShardedOptimizer::layout_of(const std::vector<size_t>& members) const {
  std::vector<FlatEntry> entries;
  for (size_t m : members) entries.push_back({params_[m].param.numel(), params_[m].layout.block_size});
  return plan_flat_layout(entries, comm_->size());
}

std::string ShardedOptimizer::name(size_t m) const {
  return c10::str("parameter ", params_[m].index, " of group ", params_[m].group);
}

at::ScalarType ShardedOptimizer::compute_dtype(at::ScalarType param) const {
  return precision_.compute && param == at::kFloat ? *precision_.compute : param;
}

at::ScalarType ShardedOptimizer::reduce_dtype(at::ScalarType param) const {
  return precision_.reduce ? *precision_.reduce : compute_dtype(param);
}

void ShardedOptimizer::check_ranks_agree() {
  // What every rank must share, each with the name an error gives it.
  std::vector<AgreedValue> v = {
      {"ShardedOptions::zero1", options_.zero1},
      {"ShardedOptions::overlap", options_.overlap},
      {"ShardedOptions::bucket_bytes", options_.bucket_bytes},
      {"ShardedOptions::release_gradients", options_.release_gradients},
      {"ShardedOptions::broadcast_parameters", options_.broadcast_parameters},
      {"FullyShardedOptions::initialize (set or not)", filled_},
  };
  const auto format = [](int64_t x) { return std::string(format_name(static_cast<QuantFormat>(x))); };
  for (const auto& [what, w] : {std::make_pair(gradient_wire_option(), &options_.gradient_wire),
                                std::make_pair("ShardedOptions::update_wire", &options_.update_wire)}) {
    const WireCompression c = w->value_or(WireCompression{});
    const std::string name = what;
    v.push_back({name + " (set or not)", w->has_value()});
    v.push_back({name + ".format", static_cast<int64_t>(c.format), format});
    v.push_back({name + ".block_size", c.block_size});
    v.push_back({name + ".error_feedback", c.error_feedback});
  }
  // Mixed precision: -1 where unset.
  v.push_back({"FullyShardedOptions::param_dtype", precision_.compute ? static_cast<int64_t>(*precision_.compute) : -1});
  v.push_back({"FullyShardedOptions::reduce_dtype", precision_.reduce ? static_cast<int64_t>(*precision_.reduce) : -1});
  int64_t elements = 0;
  for (const Param& pr : params_) elements += pr.param.numel();
  v.push_back({"the number of parameters", static_cast<int64_t>(params_.size())});
  v.push_back({"the parameters' total number of elements", elements});
  v.push_back({"the number of units (the root's included)", static_cast<int64_t>(units_.size())});
  // Then, where the counts agree (so every rank sends as many), each unit and each parameter: a
  // model built otherwise on one rank shows first in the unit it changed.
  std::vector<AgreedValue> detail;
  for (const Unit& unit : units_) {
    int64_t numel = 0;
    for (size_t m : unit.members) numel += params_[m].param.numel();
    detail.push_back({"the number of parameters of " + unit.name, static_cast<int64_t>(unit.members.size())});
    detail.push_back({"the number of elements of " + unit.name, numel});
  }
  for (size_t m = 0; m < params_.size(); ++m)
    detail.push_back({c10::str("the number of elements of ", name(m)), params_[m].param.numel()});
  const std::string who = fully_sharded() ? "FullyShardedModule" : kSharded;
  const std::string advice = "every rank must construct its " + who + " with the same options, units and parameters";
  for (const auto* list : {&v, &detail}) require_ranks_agree(*comm_, device_, *list, who, advice);
}

void ShardedOptimizer::make_wire_buffers(Bucket& b) {
  const int world = comm_->size();
  const int64_t chunk = b.layout.chunk, elt = static_cast<int64_t>(c10::elementSize(b.dtype));
  wire_stats_.parameters += [&] {
    int64_t n = 0;
    for (size_t m : b.members) n += params_[m].param.numel();
    return n;
  }();
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(device_);
  const auto floats = at::TensorOptions().dtype(at::kFloat).device(device_);
  const bool grad_wire = options_.gradient_wire && world > 1, update_wire = options_.update_wire && world > 1;
  if (grad_wire) {
    const int64_t row = wire_row_bytes(*options_.gradient_wire, chunk);
    b.grad_send = at::zeros({world, row}, bytes);
    b.grad_recv = at::zeros({world, row}, bytes);
    if (fully_sharded()) {  // memory only from the bucket's reduction to its sum (sum_received_chunks)
      release_storage(b.grad_send);
      release_storage(b.grad_recv);
    }
    if (options_.gradient_wire->error_feedback) b.grad_residual = at::zeros({b.layout.total}, floats);
    wire_stats_.gradient_bytes += (world - 1) * row;
  } else {
    wire_stats_.gradient_bytes += (options_.zero1 ? 2 : 1) * (world - 1) * chunk * elt;
  }
  if (update_wire) {
    const int64_t row = wire_row_bytes(*options_.update_wire, chunk);
    b.update_rows = at::zeros({world, row}, bytes);
    b.before = at::zeros({chunk}, at::TensorOptions().dtype(b.dtype).device(device_));
    b.update_residual = at::zeros({chunk}, floats);
    wire_stats_.parameter_bytes += (world - 1) * row;
  } else {
    wire_stats_.parameter_bytes += (world - 1) * chunk * elt;
  }
  if ((grad_wire || update_wire) && (!wire_scratch_.defined() || wire_scratch_.numel() < chunk))
    wire_scratch_ = at::zeros({chunk}, floats);
}

std::vector<std::vector<size_t>> ShardedOptimizer::plan_buckets() const {
  std::vector<std::vector<size_t>> out;
  if (fully_sharded()) {  // one bucket per (unit, dtype), in the units' order
    for (const Unit& unit : units_) {
      const size_t first = out.size();
      for (size_t m : unit.members) {
        const auto t = params_[m].param.scalar_type();
        auto b = std::find_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                              [&](const std::vector<size_t>& x) { return params_[x[0]].param.scalar_type() == t; });
        if (b == out.end()) b = out.insert(out.end(), std::vector<size_t>{});
        b->push_back(m);
      }
    }
    return out;
  }
  // One open bucket per dtype, closed once it holds bucket_bytes; a bucket's number is the order it
  // closes in. With overlap the parameters go in reverse registration order, the order backward()
  // completes them, and the buckets still open at the end close in the order of their last member.
  // Without, in registration order, and those still open close in the order of their first member:
  // a model under bucket_bytes has one bucket per dtype, laid out as the parameters were registered.
  struct Open {
    at::ScalarType dtype;
    std::vector<size_t> members;
    int64_t bytes = 0;
  };
  std::vector<Open> open;
  const int64_t bucket_bytes = options_.bucket_bytes > 0 ? options_.bucket_bytes
                               : options_.overlap     ? kDefaultOverlapBucketBytes
                                                      : kDefaultStepBucketBytes;
  const size_t count = params_.size();
  for (size_t k = 0; k < count; ++k) {
    const size_t m = options_.overlap ? count - 1 - k : k;
    const at::Tensor& p = params_[m].param;
    auto o = std::find_if(open.begin(), open.end(), [&](const Open& x) { return x.dtype == p.scalar_type(); });
    if (o == open.end()) o = open.insert(open.end(), Open{p.scalar_type(), {}, 0});
    o->members.push_back(m);
    o->bytes += p.numel() * static_cast<int64_t>(p.element_size());
    if (o->bytes >= bucket_bytes) {
      out.push_back(std::move(o->members));
      open.erase(o);
    }
  }
  std::sort(open.begin(), open.end(), [&](const Open& a, const Open& b) {
    return options_.overlap ? a.members.back() > b.members.back() : a.members.front() < b.members.front();
  });
  for (Open& o : open) out.push_back(std::move(o.members));
  return out;
}

// ---- gradients into the buckets, reduced in bucket order ----------------------------------------

void ShardedOptimizer::set_accumulating(bool on) {
  TORCH_CHECK(options_.overlap, kSharded, ": set_accumulating is for ShardedOptions::overlap (without it, gradients "
              "add up in .grad until step() as usual)");
  accumulating_ = on;
}

void ShardedOptimizer::on_gradient(size_t m, const at::Tensor& param) {
  if (accumulating_ || !param.grad().defined()) return;
  TORCH_CHECK(!params_[m].taken, kSharded, ": ", name(m), " received a second gradient before step(); with "
              "ShardedOptions::overlap call set_accumulating(true) before every backward() of a step but the last");
  torch::NoGradGuard no_grad;
  if (!worker_) {
    take_gradient(m, param.grad());
    reduce_ready_buckets();
    return;
  }
  // The checks and the flags here, the copy and the collectives on the worker, on the stream
  // backward() runs on now (after the kernels that made the gradient). The last hook's work is
  // issued before backward() returns (the engine's final callback waits for the worker), so a
  // change to .grad after backward() is never seen, as without the worker.
  at::Tensor g = param.grad();
  check_gradient(m, g);
  mark_taken(m);
  if (!drain_queued_) {
    torch::autograd::Engine::get_default_engine().queue_callback([this] {
      drain_queued_ = false;
      worker_->drain();
    });
    drain_queued_ = true;
  }
  const c10::Stream stream = c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
  worker_->post([this, m, g = std::move(g), stream] {
    c10::StreamGuard on_stream(stream);
    torch::NoGradGuard no_grad;
    copy_gradient(m, g);
    reduce_ready_buckets();
  });
}

void ShardedOptimizer::check_gradient(size_t m, const at::Tensor& g) const {
  TORCH_CHECK(g.sizes() == params_[m].param.sizes() && !g.is_sparse(), kSharded, ": the gradient of ", name(m),
              " has shape ", g.sizes(), "; expected ", params_[m].param.sizes());
}

void ShardedOptimizer::copy_gradient(size_t m, const at::Tensor& g) {
  Param& pr = params_[m];
  Bucket& b = buckets_[pr.bucket];
  ensure_flat_grad(b);
  pr.in_flat_grad.copy_(g);
  --b.waiting;
}

void ShardedOptimizer::mark_taken(size_t m) {
  Param& pr = params_[m];
  pr.taken = pr.had = true;
  if (options_.release_gradients) pr.param.mutable_grad().reset();
}

void ShardedOptimizer::take_gradient(size_t m, at::Tensor g) {  // g by value: .grad may be reset below
  check_gradient(m, g);
  copy_gradient(m, g);
  mark_taken(m);
}

void ShardedOptimizer::reduce_ready_buckets() {
  // Strictly in bucket order: every rank then issues the same collectives in the same order,
  // whatever order its backward() completed the buckets in.
  // The caller's stream is not held up by the reductions (backward goes on); step() orders it
  // after them before the first read of a gradient shard.
  DeferredStreamWaits deferred(*comm_);
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].waiting == 0) {
    // Fully sharded over the low-bit wire, the previous bucket's chunks are summed now: its
    // exchange has had this bucket's backward to finish.
    sum_received_chunks(next_bucket_);
    // step_in_backward steps a bucket when the next one is reduced (or backward ends): its
    // reduction has had backward's compute since to finish. Stepped at once, the update would hold
    // the caller's stream, and the next unit's backward with it, until the reduction finished.
    if (step_in_backward_) step_reduced_buckets(next_bucket_);
    Bucket& b = buckets_[next_bucket_++];
    if (step_in_backward_) allocate_transient(b.grad_shard);
    if (options_.zero1)
      comm_->all_reduce(b.flat_grad, ReduceOp::Avg);
    else if (b.grad_send.defined()) {
      allocate_transient(b.grad_send);
      allocate_transient(b.grad_recv);
      send_gradient_chunks(*comm_, *options_.gradient_wire, b.flat_grad, b.grad_residual, b.grad_send, b.grad_recv);
    } else {
      comm_->reduce_scatter(b.flat_grad, b.grad_shard, b.sum_only ? ReduceOp::Sum : ReduceOp::Avg);
    }
    b.reduced_by = comm_->collectives_issued();
    if (fully_sharded()) {
      // Every gradient of the bucket is in: backward() has no more use for its parameters. Over
      // the low-bit wire the own chunk of flat_grad is summed with the others' later.
      if (!b.grad_send.defined()) release_transient(b.flat_grad);
      release(b);
    }
  }
  if (next_bucket_ == buckets_.size()) {
    sum_received_chunks(next_bucket_);
    if (step_in_backward_) step_reduced_buckets(next_bucket_);
  }
}

void ShardedOptimizer::sum_chunks(Bucket& b) {
  const int rank = comm_->rank();
  const int64_t chunk = b.layout.chunk;
  const at::Tensor own = b.flat_grad.narrow(0, rank * chunk, chunk);
  const at::Tensor scratch = wire_scratch_.narrow(0, 0, chunk);
  if (b.sum_only) {
    sum_gradient_chunks(*options_.gradient_wire, rank, own, b.grad_recv, b.grad_shard, scratch);
  } else {  // summed in float32, divided once, rounded once to the bucket's dtype
    const at::Tensor sum = at::empty({chunk}, scratch.options());
    sum_gradient_chunks(*options_.gradient_wire, rank, own, b.grad_recv, sum, scratch);
    b.grad_shard.copy_(sum.div_(comm_->size()));
  }
}

void ShardedOptimizer::sum_received_chunks(size_t end) {
  if (!fully_sharded()) return;  // ZeRO: step() sums every bucket's chunks
  while (next_to_sum_ < end) {
    Bucket& b = buckets_[next_to_sum_++];
    if (!b.grad_send.defined()) continue;
    comm_->order_after_collective(b.reduced_by);
    sum_chunks(b);
    release_transient(b.grad_send);
    release_transient(b.grad_recv);
    release_transient(b.flat_grad);
  }
}

void ShardedOptimizer::step_reduced_buckets(size_t end) {
  while (next_to_step_ < end) step_bucket(buckets_[next_to_step_++]);
}

void ShardedOptimizer::check_step_in_backward() {
  const auto& groups = optimizer_->param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const optim::GroupStep gs = FragmentAccess::group_step(*optimizer_, gi);
    TORCH_CHECK(gs.common.max_grad_norm == 0, "FullyShardedModule: FullyShardedOptions::step_in_backward steps each "
                "unit as soon as its gradients are reduced, before the others have theirs, so global-norm clipping "
                "cannot work: group ", gi, " has max_grad_norm ", gs.common.max_grad_norm, "; set it to 0");
    TORCH_CHECK(gs.config.rule != kernels::Rule::LAMB, "FullyShardedModule: FullyShardedOptions::step_in_backward "
                "with LAMB (group ", gi, ") is not supported yet: its trust ratios need the norms of whole parameters "
                "across units");
  }
}

ShardedOptimizer::GradientAgreement ShardedOptimizer::agree_on_gradients(const std::vector<size_t>& frags,
                                                                         const std::vector<size_t>& members,
                                                                         const std::vector<char>& had, bool prepass,
                                                                         bool want_sumsq, bool count_ranks) {
  const int64_t ngroups = static_cast<int64_t>(optimizer_->param_groups().size());
  const auto on_device = at::TensorOptions().device(device_);
  at::Tensor found_local = at::zeros({1}, on_device.dtype(at::kFloat));
  at::Tensor sumsq_local = at::zeros({ngroups}, on_device.dtype(at::kDouble));
  std::vector<at::Tensor> grads;
  std::vector<int64_t> gids;
  for (size_t f : frags) {
    if (!prepass) break;
    grads.push_back(fragment_grads_[f]);
    gids.push_back(static_cast<int64_t>(fragments_[f].group));
  }
  if (!grads.empty()) std::tie(found_local, sumsq_local) = ops::grad_check(grads, gids, ngroups, want_sumsq);
  std::vector<at::Tensor> parts{found_local.to(at::kDouble), sumsq_local};
  // How many ranks had each member's gradient. Which parameters step is a host decision, but only a
  // rank that missed some gradient itself needs the others' counts (a gradient of its own makes a
  // count >= 1), so only such a rank copies its flags up and reads the counts back, and waits for
  // its stream; the others add ones made on the device and never wait.
  const int64_t n = static_cast<int64_t>(members.size());
  bool missed_any = false;
  if (count_ranks) {
    for (size_t m : members) missed_any |= !had[m];
    if (missed_any) {
      at::Tensor h = at::empty({n}, at::TensorOptions().dtype(at::kDouble));
      for (int64_t k = 0; k < n; ++k) h.data_ptr<double>()[k] = had[members[static_cast<size_t>(k)]];
      parts.push_back(h.to(device_));
    } else {
      parts.push_back(at::ones({n}, on_device.dtype(at::kDouble)));
    }
  }
  at::Tensor both = at::cat(parts);
  comm_->all_reduce(both, ReduceOp::Sum);
  // Read below on the caller's stream: under DeferredStreamWaits (step_in_backward, in backward)
  // the all_reduce did not order it.
  comm_->order_after_collective(comm_->collectives_issued());
  GradientAgreement a;
  a.stepped.assign(params_.size(), 1);
  if (missed_any) {
    const at::Tensor counts = both.narrow(0, 1 + ngroups, n).cpu();
    for (int64_t k = 0; k < n; ++k) a.stepped[members[static_cast<size_t>(k)]] = counts.data_ptr<double>()[k] > 0;
  }
  if (prepass) {
    a.found_inf = both.narrow(0, 0, 1).gt(0).to(at::kFloat);  // the same decision on every rank
    a.sumsq = both.narrow(0, 1, ngroups);
  }
  return a;
}

void ShardedOptimizer::step_bucket(Bucket& b) {
  check_step_in_backward();  // options edited since construction
  comm_->order_after_collective(b.reduced_by);  // the shard is reduced (later collectives run on)
  if (b.sum_only && comm_->size() > 1) b.grad_shard.div_(comm_->size());  // float32: the Avg, as step() divides
  const auto& groups = optimizer_->param_groups();
  bool prepass = false;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    prepass |= FragmentAccess::group_step(*optimizer_, gi).common.skip_nonfinite;
  // Every rank's pieces of the bucket: any non-finite gradient, and which members some rank had.
  std::vector<char> had(params_.size());
  for (size_t m : b.members) had[m] = params_[m].had;
  GradientAgreement a = agree_on_gradients(b.fragments, b.members, had, prepass, false, true);
  const std::vector<char>& stepped = a.stepped;
  const at::Tensor& found_inf = a.found_inf;
  if (prepass) backward_found_ = backward_found_.defined() ? at::maximum(backward_found_, found_inf) : found_inf;
  const bool cpu_found = found_inf.defined() && found_inf.is_cpu() && found_inf.item<float>() != 0.0f;
  for (size_t fi : b.fragments) {
    Fragment& f = fragments_[fi];
    if (!f.state.counters.defined())
      f.state = FragmentAccess::make_state(*optimizer_, f.group, params_[fragment_param_[fi]].param, f.numel);
  }
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    if (FragmentAccess::group_step(*optimizer_, gi).common.skip_nonfinite && cpu_found) continue;
    std::vector<size_t> frags;
    for (size_t fi : b.fragments)
      if (fragments_[fi].group == gi && stepped[fragment_param_[fi]]) frags.push_back(fi);
    if (!frags.empty()) update(gi, frags, found_inf, at::Tensor(), {});
  }
  release_transient(b.grad_shard);  // in stream order after the update
}

void ShardedOptimizer::reduce_buckets_before(size_t end) {
  // Bucket by bucket, each reduced once its gradients are in.
  for (size_t bi = next_bucket_; bi < end; ++bi) {
    Bucket& b = buckets_[bi];
    for (size_t m : b.members) {
      Param& pr = params_[m];
      if (pr.taken) continue;
      const at::Tensor g = pr.param.grad();
      if (g.defined()) {
        take_gradient(m, g);
        continue;
      }
      ensure_flat_grad(b);
      pr.in_flat_grad.zero_();  // overlap: zeros from this rank
      pr.taken = true;
      --b.waiting;
    }
    reduce_ready_buckets();
  }
}

void ShardedOptimizer::ensure_flat_grad(Bucket& b) {
  if (storage_resident(b.flat_grad)) return;
  allocate_transient(b.flat_grad);
  for (const auto& [begin, len] : b.padding) b.flat_grad.narrow(0, begin, len).zero_();
}

void ShardedOptimizer::gather(size_t bucket) {
  Bucket& b = buckets_[bucket];
  if (b.gathered) return;
  allocate_transient(b.flat_param);
  // Mixed precision: the shard rounded to the compute dtype (round to nearest even) is what travels.
  comm_->all_gather(b.compute == b.dtype ? b.shard : b.shard.to(b.compute), b.flat_param);
  point_members_at(b, b.flat_param);
  b.gathered = true;
}

ShardedOptimizer::Transient ShardedOptimizer::transient_now() const {
  Transient t;
  // Each storage once: the float32 buckets' gradient shards are views of one (float_shards_).
  std::unordered_set<const c10::StorageImpl*> seen;
  const auto bytes = [&](const at::Tensor& x) {
    if (!x.defined()) return int64_t(0);
    const c10::StorageImpl* s = x.storage().unsafeGetStorageImpl();
    return seen.insert(s).second ? static_cast<int64_t>(s->nbytes()) : int64_t(0);
  };
  for (const Bucket& b : buckets_) {
    if (!fully_sharded()) break;
    t.gathered += bytes(b.flat_param);
    t.gradients += bytes(b.flat_grad) + bytes(b.grad_send) + bytes(b.grad_recv);
    t.gradient_shards += bytes(b.grad_shard);
  }
  return t;
}

void ShardedOptimizer::note_transient() {
  // A sum over the buckets per allocation: a few per unit and step, against the unit's compute.
  const Transient t = transient_now();
  transient_peak_.gathered = std::max(transient_peak_.gathered, t.gathered);
  transient_peak_.gradients = std::max(transient_peak_.gradients, t.gradients);
  transient_peak_.gradient_shards = std::max(transient_peak_.gradient_shards, t.gradient_shards);
}

void ShardedOptimizer::allocate_transient(const at::Tensor& t) {
  if (storage_resident(t)) return;
  while (releases_pending_.size() > kReleasesAhead) {
    comm_->wait_for_collective(releases_pending_.front());
    releases_pending_.pop_front();
  }
  allocate_storage(t);
  note_transient();
}

void ShardedOptimizer::release_transient(const at::Tensor& t) {
  if (!storage_resident(t)) return;
  release_storage(t);
  releases_pending_.push_back(comm_->collectives_issued());
}

void ShardedOptimizer::release(Bucket& b) {
  if (!b.gathered) return;
  point_members_at(b, b.released);
  release_transient(b.flat_param);
  b.gathered = false;
}

void ShardedOptimizer::point_members_at(Bucket& b, const at::Tensor& flat) {
  for (size_t m : b.members) {
    Param& pr = params_[m];
    pr.param.set_data(flat.narrow(0, pr.flat_offset, pr.param.numel()).view(pr.param.sizes()));
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
  optim::GroupStep gs = FragmentAccess::group_step(*optimizer_, group);
  gs.grad_checks = [&](at::Device) {
    return optim::GradChecks{found_inf, sumsq.defined() ? sumsq.narrow(0, static_cast<int64_t>(group), 1) : at::Tensor()};
  };
  for (size_t m = 0; m < params_.size(); ++m) {
    const Param& pr = params_[m];
    if (pr.group != group || pr.fragment < 0) continue;
    const Fragment& f = fragments_[pr.fragment];
    const int64_t bs = f.state.block_size;
    // One item per block: the op adds a parameter's blocks in order, so per-block sums let the
    // blocks of all ranks be added in that same order below.
    optim::StepCalls calls(gs, static_cast<size_t>((f.numel + bs - 1) / bs));
    for (int64_t b = 0; b < f.numel; b += bs) {
      const int64_t len = std::min(bs, f.numel - b);
      calls.add_range(fragment_params_[pr.fragment].narrow(0, b, len), fragment_grads_[pr.fragment].narrow(0, b, len),
                      f.state, b, f.offset + b, optim::param_rng_key(pr.group, pr.index));
    }
    const at::Tensor part = calls.lamb_norms();
    sums.narrow(0, base[m] + f.offset / bs, part.size(0)).copy_(part);
  }
  comm_->all_reduce(sums, ReduceOp::Sum);
  // Each piece's whole parameter: its blocks' sums added in LAMB's order, where they lie (no trip
  // to the host).
  std::vector<int64_t> first, count;
  for (size_t fi : frags) {
    const size_t m = fragment_param_[fi];
    const int64_t bs = params_[m].layout.block_size;
    first.push_back(base[m]);
    count.push_back((params_[m].param.numel() + bs - 1) / bs);
  }
  return ops::lamb_add_block_sums(sums, first, count);
}

void ShardedOptimizer::update(size_t gi, const std::vector<size_t>& frags, const at::Tensor& found_inf,
                              const at::Tensor& sumsq, const std::vector<at::Tensor>& lamb_rows) {
  // One op call per state layout among `frags`, all of group gi.
  optim::GroupStep gs = FragmentAccess::group_step(*optimizer_, gi);
  const bool lamb = gs.config.rule == kernels::Rule::LAMB;
  gs.grad_checks = [&](at::Device) {
    return optim::GradChecks{found_inf, sumsq.defined() ? sumsq.narrow(0, static_cast<int64_t>(gi), 1) : at::Tensor()};
  };
  optim::StepCalls calls(std::move(gs), frags.size());
  for (size_t fi : frags) {
    const Fragment& f = fragments_[fi];
    calls.add(fragment_params_[fi], fragment_grads_[fi], f.state, f.offset, optim::param_rng_key(f.group, f.index),
              lamb ? lamb_rows[fi] : at::Tensor());
  }
  calls.step();
}

at::Tensor ShardedOptimizer::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Options edited since the last step are held to their ranges before anything moves (every rank
  // holds the same options, so every rank refuses together).
  optimizer_->check_groups();
  if (worker_) worker_->drain();  // a backward() that threw left the worker busy (and its callback unrun)
  drain_queued_ = false;
  const int rank = comm_->rank();
  // ---- the gradients no hook took (all of them without overlap) into the buckets, checked before
  // any collective; then the buckets not reduced yet, in order.
  for (size_t m = 0; m < params_.size(); ++m) {
    const Param& pr = params_[m];
    if (pr.taken) continue;
    const at::Tensor& g = pr.param.grad();
    TORCH_CHECK(g.defined() || options_.overlap, kSharded, ": ", name(m),
                " has no gradient; every rank needs a gradient for every parameter (zero it where unused, or "
                "use ShardedOptions::overlap, which counts a missing gradient as zeros)");
    if (g.defined()) check_gradient(m, g);
  }
  reduce_buckets_before(buckets_.size());
  comm_->order_after_collectives();
  for (Bucket& b : buckets_)
    if (b.grad_send.defined() && !fully_sharded()) sum_chunks(b);  // fully sharded: summed in backward
  if (float_shards_.defined() && comm_->size() > 1) float_shards_.div_(comm_->size());  // the Avg (see float_shards_)
  TORCH_INTERNAL_ASSERT(next_bucket_ == buckets_.size());
  std::vector<char> had(params_.size());
  for (size_t m = 0; m < params_.size(); ++m) {
    had[m] = params_[m].had;
    params_[m].taken = params_[m].had = false;
  }
  for (Bucket& b : buckets_) b.waiting = b.members.size();
  TORCH_INTERNAL_ASSERT(!fully_sharded() || next_to_sum_ == buckets_.size());
  next_bucket_ = next_to_step_ = next_to_sum_ = 0;
  if (step_in_backward_) {  // every bucket stepped as it was reduced
    if (backward_found_.defined()) optim::count_skipped(skipped_, backward_found_);
    backward_found_ = at::Tensor();
    report_overflow();
    return loss;
  }
  ensure_states();

  // ---- one small all_reduce: (any non-finite, each group's sum of squares) over the owned pieces,
  // and with overlap how many ranks had each parameter's gradient.
  const auto& groups = optimizer_->param_groups();
  bool want_sumsq = false, prepass = false;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const optim::CommonOptions c = FragmentAccess::group_step(*optimizer_, gi).common;
    want_sumsq |= c.max_grad_norm > 0;
    prepass |= c.skip_nonfinite || c.max_grad_norm > 0;
  }
  at::Tensor found_inf, sumsq;
  bool cpu_found = false;
  std::vector<char> stepped(params_.size(), 1);
  if (prepass || options_.overlap) {
    std::vector<size_t> all_frags(fragments_.size()), all_params(params_.size());
    std::iota(all_frags.begin(), all_frags.end(), size_t{0});
    std::iota(all_params.begin(), all_params.end(), size_t{0});
    GradientAgreement a = agree_on_gradients(all_frags, all_params, had, prepass, want_sumsq, options_.overlap);
    found_inf = a.found_inf;
    sumsq = a.sumsq;
    stepped = std::move(a.stepped);
    if (prepass) cpu_found = optim::count_skipped(skipped_, found_inf);
  }

  // ---- LAMB's per-parameter norms: collective, every rank for every LAMB group, before any update.
  std::vector<at::Tensor> lamb_rows(fragments_.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const optim::GroupStep gs = FragmentAccess::group_step(*optimizer_, gi);
    if (gs.config.rule != kernels::Rule::LAMB || (gs.common.skip_nonfinite && cpu_found)) continue;
    std::vector<size_t> all;
    for (size_t fi = 0; fi < fragments_.size(); ++fi)
      if (fragments_[fi].group == gi) all.push_back(fi);
    const at::Tensor norms = lamb_norms(gi, all, found_inf, sumsq);
    for (size_t j = 0; j < all.size(); ++j) lamb_rows[all[j]] = norms.narrow(0, static_cast<int64_t>(j), 1);
  }

  // ---- bucket by bucket: the update of the owned pieces (per group, one op call per (dtype,
  // state layout)), then every rank's updated range to every rank (the parameters are views of
  // flat_param). An asynchronous communicator overlaps bucket k's all-gather with k+1's update
  // (which touches only bucket k+1); the caller's stream is ordered after all of them at the end.
  {
    DeferredStreamWaits deferred(*comm_);
    std::vector<at::Tensor> mine, whole;
    int64_t gathering = 0;
    for (Bucket& b : buckets_) {
      if (b.update_rows.defined()) b.before.copy_(b.flat_param.narrow(0, rank * b.layout.chunk, b.layout.chunk));
      for (size_t gi = 0; gi < groups.size(); ++gi) {
        if (FragmentAccess::group_step(*optimizer_, gi).common.skip_nonfinite && cpu_found) continue;
        std::vector<size_t> frags;
        for (size_t fi : b.fragments)
          if (fragments_[fi].group == gi && stepped[fragment_param_[fi]]) frags.push_back(fi);
        if (!frags.empty()) update(gi, frags, found_inf, sumsq, lamb_rows);
      }
      if (fully_sharded()) continue;  // the next forward gathers the updated shards
      const at::Tensor own = b.flat_param.narrow(0, rank * b.layout.chunk, b.layout.chunk);
      if (b.update_rows.defined()) {
        pack_update(*options_.update_wire, rank, own, b.before, b.update_residual, b.update_rows);
        mine.push_back(b.update_rows.narrow(0, rank, 1));
        whole.push_back(b.update_rows);
      } else {
        mine.push_back(own);
        whole.push_back(b.flat_param);
      }
      gathering += whole.back().nbytes();
      if (gathering >= kGatherBytes || &b == &buckets_.back()) {
        comm_->all_gather_many(mine, whole);
        mine.clear();
        whole.clear();
        gathering = 0;
      }
    }
  }
  comm_->order_after_collectives();
  for (Bucket& b : buckets_)
    if (b.update_rows.defined())
      apply_updates(*options_.update_wire, rank, b.flat_param, b.before, b.update_residual, b.update_rows,
                    wire_scratch_.narrow(0, 0, b.layout.chunk));
  report_overflow();
  return loss;
}

void ShardedOptimizer::report_overflow() {
  // Overflow of quantized state (CPU: free to read): reported once per piece, as a warning, since
  // only the owning rank sees it and an error there would leave the others waiting.
  for (Fragment& f : fragments_) {
    if (!f.state.counters.defined() || !f.state.counters.is_cpu()) continue;
    const optim::Overflow fresh = optim::fresh_overflow(f.state);
    if (fresh.blocks == 0) continue;
    TORCH_WARN(kSharded, ": rank ", comm_->rank(), ": the state of parameter ", f.index, " of group ", f.group,
               " (elements ", f.offset, "..", f.offset + f.numel, ") overflowed to Inf/NaN in ", fresh.blocks,
               " block(s) at step ", fresh.step);
  }
}

}  // namespace distributed
}  // namespace lowbit
