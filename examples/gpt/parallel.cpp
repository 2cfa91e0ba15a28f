// --sharded (parallel.h).
#include "parallel.h"

#include <lowbit/build_config.h>

#if LOWBIT_WITH_NCCL
#include <lowbit/distributed/nccl_communicator.h>
#endif

#include "model.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <unordered_map>
#include <stdexcept>

namespace gpt {

#if LOWBIT_WITH_MPI
namespace ld = lowbit::distributed;

namespace {

std::shared_ptr<ld::Communicator>& communicator() {
  static std::shared_ptr<ld::Communicator> c;
  return c;
}

std::optional<ld::WireCompression> wire(const std::string& name, bool updates) {
  if (name == "none") return std::nullopt;
  lowbit::QuantFormat q;
  if (!lowbit::parse_format(name, &q)) throw std::invalid_argument("--wire-*: unknown format " + name);
  return updates ? ld::WireCompression::updates(q) : ld::WireCompression::gradients(q);
}

// Over NCCL, where its collectives run (", NCCL's kernels (automatic: ...)"); "" elsewhere.
std::string copy_engines_in_use() {
#if LOWBIT_WITH_NCCL
  if (const auto* n = dynamic_cast<const ld::NcclCommunicator*>(communicator().get()))
    return ", " + n->copy_engines().describe();
#endif
  return "";
}

class Sharded : public TrainOptimizer {
 public:
  Sharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer> opt, std::string what) {
    ld::ShardedOptions so;
    so.gradient_wire = wire(f.wire_gradients, false);
    so.update_wire = wire(f.wire_updates, true);
    so.overlap = f.overlap;
    if (f.overlap_thread != "auto") so.overlap_thread = f.overlap_thread == "on";
    inner_ = std::shared_ptr<lowbit::optim::LowbitOptimizer>(std::move(opt));
    sharded_ = std::make_unique<ld::ShardedOptimizer>(inner_, communicator(), so);
    std::ostringstream s;
    s << what << ", sharded over " << communicator()->size() << " ranks (" << communicator()->backend()
      << "), wire: gradients " << f.wire_gradients << ", updates " << f.wire_updates << ", "
      << sharded_->wire_stats().bytes_per_parameter() << " bytes sent per parameter per step"
      << copy_engines_in_use()
      << (f.overlap ? c10::str(", overlap in ", sharded_->buckets(), " buckets (hooks on ", f.overlap_thread, ")") : "");
    what_ = s.str();
  }
  void step() override { sharded_->step(); }
  void zero_grad() override { sharded_->zero_grad(); }
  void set_lr(double lr) override {
    for (auto& g : inner_->param_groups()) g.options().set_lr(lr);
  }
  int64_t state_bytes() const override { return sharded_->state_bytes(); }
  void save(const std::string& prefix) override { sharded_->save(prefix); }
  void load(const std::string& prefix) override { sharded_->load(prefix); }
  bool saves_weights() const override { return true; }
  std::string describe() const override { return what_; }

 private:
  std::shared_ptr<lowbit::optim::LowbitOptimizer> inner_;
  std::unique_ptr<ld::ShardedOptimizer> sharded_;
  std::string what_;
};

// --fully-sharded: the model's blocks are the units; the embeddings, the final norm and the tied
// head are the root.
class FullySharded : public TrainOptimizer {
 public:
  FullySharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer> opt, std::string what, GPTImpl& model)
      : model_(model) {
    inner_ = std::shared_ptr<lowbit::optim::LowbitOptimizer>(std::move(opt));
    std::shared_ptr<torch::nn::Module> root = model.shared_from_this();
    ld::FullyShardedOptions fo;
    fo.device = at::Device(f.device);
    fo.step_in_backward = f.gradient_release;
    const auto dtype = [](const std::string& d) { return d == "bf16" ? at::kBFloat16 : at::kFloat; };
    if (!f.param_dtype.empty()) fo.param_dtype = dtype(f.param_dtype);
    if (!f.reduce_dtype.empty()) fo.reduce_dtype = dtype(f.reduce_dtype);
    fo.gradient_wire = wire(f.wire_gradients, false);
    if (f.init == "keyed")
      fo.initialize = [&model](const std::string& name, const at::Tensor&, int64_t first, const at::Tensor& values) {
        model.init_values(name, first, values);
      };
    fsdp_ = std::make_unique<ld::FullyShardedModule>(root, model.block_modules(), inner_, communicator(), fo);
    model.run_through([this](const GPTImpl::Fn& fn) { return fsdp_->forward(fn); },
                      [this](size_t b, const GPTImpl::Fn& fn) { return fsdp_->unit(b, fn); });
    std::ostringstream s;
    s << what << ", fully sharded over " << communicator()->size() << " ranks (" << communicator()->backend() << ", "
      << fsdp_->units() << " units + the root" << (f.gradient_release ? ", each stepped in backward" : "")
      << (f.param_dtype.empty() ? "" : ", computing in " + f.param_dtype)
      << (f.wire_gradients == "none" ? "" : ", gradients over the wire in " + f.wire_gradients)
      << (f.reduce_dtype.empty() ? "" : ", reducing in " + f.reduce_dtype)
      << (f.init == "keyed" ? ", each rank filling its own shards" : "")
      << "): " << fsdp_->shard_bytes() << " of " << fsdp_->model_bytes() << " parameter bytes held per rank";
    what_ = s.str();
  }
  // Never gathers here (a destructor run by an error, out of memory say, must not allocate or
  // start a collective): the model only stops running through the sharding.
  ~FullySharded() override { model_.run_through(nullptr, nullptr); }
  void step() override { fsdp_->step(); }
  void zero_grad() override { fsdp_->zero_grad(); }
  void set_lr(double lr) override {
    for (auto& g : inner_->param_groups()) g.options().set_lr(lr);
  }
  int64_t state_bytes() const override { return fsdp_->sharded().state_bytes(); }
  int64_t weight_bytes(const std::vector<at::Tensor>&) const override {
    const ld::FullyShardedMemory m = fsdp_->memory_report();
    return m.shard_bytes + m.peak_gathered_bytes;
  }
  int64_t gradient_bytes(const std::vector<at::Tensor>&) const override {
    const ld::FullyShardedMemory m = fsdp_->memory_report();
    return m.peak_gradient_bytes + m.peak_gradient_shard_bytes;
  }
  // This rank's parts (rank 0's is printed), the transient ones' high-water marks over the run.
  std::string memory_report() const override { return fsdp_->memory_report().to_string(); }
  void save(const std::string& prefix) override { fsdp_->save(prefix); }
  void load(const std::string& prefix) override { fsdp_->load(prefix); }
  bool saves_weights() const override { return true; }
  std::string describe() const override { return what_; }
  bool fully_sharded() const override { return true; }
  std::vector<at::Tensor> whole_parameters(const std::vector<at::Tensor>& params) override {
    std::unordered_map<const c10::TensorImpl*, size_t> index;
    for (size_t k = 0; k < params.size(); ++k) index.emplace(params[k].unsafeGetTensorImpl(), k);
    std::vector<at::Tensor> out(params.size());
    const bool keep = communicator()->rank() == 0;
    const auto take = [&](const at::Tensor& p) {
      const auto it = index.find(p.unsafeGetTensorImpl());
      // A copy (cpu() of a host tensor is the tensor itself, whose memory release() drops).
      if (it != index.end() && keep && !out[it->second].defined())
        out[it->second] = p.is_cpu() ? p.detach().clone() : p.detach().cpu();
    };
    const auto blocks = model_.block_modules();
    for (size_t u = 0; u <= fsdp_->units(); ++u) {  // the root last: its parameters are what is left
      fsdp_->gather(u);
      if (u < blocks.size())
        for (const at::Tensor& p : blocks[u]->parameters()) take(p);
      else
        for (size_t k = 0; k < params.size(); ++k)
          if (!out[k].defined()) take(params[k]);
      fsdp_->release(u);
    }
    return out;
  }

 private:
  GPTImpl& model_;
  std::shared_ptr<lowbit::optim::LowbitOptimizer> inner_;
  std::unique_ptr<ld::FullyShardedModule> fsdp_;
  std::string what_;
};

}  // namespace

void Job::average(at::Tensor& t) const {
  if (size > 1) communicator()->all_reduce(t, ld::ReduceOp::Avg);
}

const Job& job(const Flags& f) {
  static Job j;
  if (!f.sharded || communicator()) return j;
  ld::InitOptions io;
  io.device_type = at::Device(f.device).type();
  if (f.copy_engines != "auto") {
    io.copy_engine_gathers = f.copy_engines != "off";
    io.copy_engine_reductions = f.copy_engines == "all";
  }
  // --fully-sharded --init torch: rank 0 builds the whole model on the host before the first
  // collective, which takes minutes at tens of billions of parameters; the others wait in that
  // collective meanwhile. With --init keyed every rank fills its own shards (seconds).
  if (f.fully_sharded && f.init != "keyed") io.timeout_s = std::max(io.timeout_s, 1800.0);
  communicator() = ld::init_from_env(io);
  j.rank = communicator()->rank();
  j.size = communicator()->size();
  j.local_rank = ld::launch_env().local_rank;
  return j;
}

void end_job_on_error(const Flags& f, const std::string& what) {
  if (f.sharded && communicator() && communicator()->size() > 1) ld::abort_job(1, "gpt: " + what);
}

#if LOWBIT_WITH_NCCL
namespace {
ld::NcclCommunicator* nccl_of(const Flags& f) {
  return f.sharded ? dynamic_cast<ld::NcclCommunicator*>(communicator().get()) : nullptr;
}
}  // namespace

void timeline_start(const Flags& f) {
  if (auto* n = nccl_of(f)) n->start_timeline();
}

void timeline_mark(const Flags& f, const std::string& label) {
  if (auto* n = nccl_of(f)) n->mark(label);
}

void timeline_print(const Flags& f) {
  auto* n = nccl_of(f);
  if (!n) return;
  const auto entries = n->timeline();
  if (n->rank() != 0) return;
  // Collectives run one after another on the communicator's stream: their busy time is a sum.
  double busy = 0, busy_in_backward = 0, backward_end = 0;
  for (const auto& e : entries)
    if (e.numel == 0 && e.what == "backward") backward_end = e.end_ms;
  std::printf("timeline of step %lld (rank 0, ms on the GPU from the step's start; marks: the loop's calls "
              "returned and their work reached the stream):\n", static_cast<long long>(f.timeline));
  for (const auto& e : entries) {
    if (e.numel == 0) {
      std::printf("  %9.3f            mark %s\n", e.start_ms, e.what.c_str());
      continue;
    }
    busy += e.end_ms - e.start_ms;
    if (e.end_ms <= backward_end) busy_in_backward += e.end_ms - e.start_ms;
    std::printf("  %9.3f %9.3f  %-14s %lld elements\n", e.start_ms, e.end_ms, e.what.c_str(),
                static_cast<long long>(e.numel));
  }
  std::printf("collectives busy %.3f ms, %.3f of them finished by the backward mark (%.3f ms)\n", busy,
              busy_in_backward, backward_end);
  std::fflush(stdout);
}
#else
void timeline_start(const Flags&) {}
void timeline_mark(const Flags&, const std::string&) {}
void timeline_print(const Flags&) {}
#endif

std::unique_ptr<TrainOptimizer> make_sharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer> opt,
                                             std::string what, GPTImpl* model) {
  job(f);
  if (f.fully_sharded) {
    if (!model) throw std::invalid_argument("--fully-sharded: this mode of the example has no model to shard");
    return std::make_unique<FullySharded>(f, std::move(opt), std::move(what), *model);
  }
  return std::make_unique<Sharded>(f, std::move(opt), std::move(what));
}

#else

void timeline_start(const Flags&) {}
void timeline_mark(const Flags&, const std::string&) {}
void timeline_print(const Flags&) {}

void Job::average(at::Tensor&) const {}

const Job& job(const Flags& f) {
  static const Job j;
  if (f.sharded) throw std::invalid_argument("--sharded: lowbit was built without MPI (LOWBIT_MPI=OFF)");
  return j;
}

void end_job_on_error(const Flags&, const std::string&) {}

std::unique_ptr<TrainOptimizer> make_sharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer>,
                                             std::string, GPTImpl*) {
  job(f);
  return nullptr;
}

#endif

}  // namespace gpt
