// --sharded (parallel.h).
#include "parallel.h"

#include <lowbit/build_config.h>

#include <sstream>
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

class Sharded : public TrainOptimizer {
 public:
  Sharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer> opt, std::string what) {
    ld::ShardedOptions so;
    so.gradient_wire = wire(f.wire_gradients, false);
    so.update_wire = wire(f.wire_updates, true);
    inner_ = std::shared_ptr<lowbit::optim::LowbitOptimizer>(std::move(opt));
    sharded_ = std::make_unique<ld::ShardedOptimizer>(inner_, communicator(), so);
    std::ostringstream s;
    s << what << ", sharded over " << communicator()->size() << " ranks (" << communicator()->backend()
      << "), wire: gradients " << f.wire_gradients << ", updates " << f.wire_updates << ", "
      << sharded_->wire_stats().bytes_per_parameter() << " bytes sent per parameter per step";
    what_ = s.str();
  }
  void step() override { sharded_->step(); }
  void zero_grad() override { sharded_->zero_grad(); }
  void set_lr(double lr) override {
    for (auto& g : inner_->param_groups()) g.options().set_lr(lr);
  }
  int64_t state_bytes() const override { return sharded_->state_bytes(); }
  void save(const std::string&) override { throw std::invalid_argument("--save with --sharded"); }
  void load(const std::string&) override { throw std::invalid_argument("--resume with --sharded"); }
  std::string describe() const override { return what_; }

 private:
  std::shared_ptr<lowbit::optim::LowbitOptimizer> inner_;
  std::unique_ptr<ld::ShardedOptimizer> sharded_;
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
  communicator() = ld::init_from_env(io);
  j.rank = communicator()->rank();
  j.size = communicator()->size();
  j.local_rank = ld::launch_env().local_rank;
  return j;
}

std::unique_ptr<TrainOptimizer> make_sharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer> opt,
                                             std::string what) {
  job(f);
  return std::make_unique<Sharded>(f, std::move(opt), std::move(what));
}

#else

void Job::average(at::Tensor&) const {}

const Job& job(const Flags& f) {
  static const Job j;
  if (f.sharded) throw std::invalid_argument("--sharded: lowbit was built without MPI (LOWBIT_MPI=OFF)");
  return j;
}

std::unique_ptr<TrainOptimizer> make_sharded(const Flags& f, std::unique_ptr<lowbit::optim::LowbitOptimizer>,
                                             std::string) {
  job(f);
  return nullptr;
}

#endif

}  // namespace gpt
