// The low-bit collectives (ShardedOptions::gradient_wire / update_wire) against one process that
// replays them with the ATen reference of the wire ops: each rank's flat gradient packed and
// decoded, the chunks added in rank order with the owner's exact, the update packed, decoded and
// added to every replica, with and without error feedback. Parameters and every fragment's state
// bit for bit, so the compressed modes are deterministic and the replicas identical; the bytes
// wire_stats() reports; bad options refused on every rank before any collective of the step.
#include "dist_util.h"

#include <lowbit/distributed/compressed_wire.h>
#include <lowbit/tensors/wire_ops.h>

namespace lowbit_test {
namespace {

using lowbit::QuantFormat;
using ld::WireCompression;

// One process replaying the sharded step's wire on the whole flat buffer (one bucket).
class WireReplay {
 public:
  WireReplay(const lo::LowbitOptimizer& ref, const std::vector<at::Tensor>& params, int world,
             const ld::ShardedOptions& so)
      : params_(params), world_(world), so_(so) {
    // The bucket's members: registration order without overlap, reverse with it (one bucket).
    for (size_t k = 0; k < params.size(); ++k) order_.push_back(so.overlap ? params.size() - 1 - k : k);
    std::vector<ld::FlatEntry> entries;
    for (size_t k : order_) entries.push_back({params[k].numel(), lo::FragmentAccess::layout(ref, 0, params[k]).block_size});
    layout_ = ld::plan_flat_layout(entries, world);
    offset_.resize(params.size());
    for (size_t i = 0; i < order_.size(); ++i) offset_[order_[i]] = layout_.offsets[i];
    grad_residual_.assign(world, at::zeros({layout_.total}, at::kFloat));
    update_residual_ = at::zeros({layout_.total}, at::kFloat);
  }

  at::Tensor flat(const std::vector<at::Tensor>& ts, at::ScalarType dtype) const {
    at::Tensor f = at::zeros({layout_.total}, dtype);
    for (size_t k = 0; k < ts.size(); ++k)
      if (ts[k].defined()) f.narrow(0, offset_[k], ts[k].numel()).copy_(ts[k].reshape(-1));
    return f;
  }

  // Every rank's gradients (grads[r][k]) -> the averaged gradient each parameter's owner steps with.
  std::vector<at::Tensor> mean_gradients(const std::vector<std::vector<at::Tensor>>& grads, at::ScalarType dtype) {
    const int64_t chunk = layout_.chunk;
    std::vector<at::Tensor> g(world_), decoded(world_);
    for (int r = 0; r < world_; ++r) g[r] = flat(grads[r], dtype);
    at::Tensor mean;
    if (!so_.gradient_wire || world_ == 1) {
      at::Tensor sum = at::zeros({layout_.total}, at::kFloat);
      for (int r = 0; r < world_; ++r) sum += g[r].to(at::kFloat);
      mean = dtype == at::kFloat ? sum.div_(world_) : sum.div_(world_).to(dtype);
    } else {
      const WireCompression& w = *so_.gradient_wire;
      const std::string fmt = lowbit::format_name(w.format);
      for (int r = 0; r < world_; ++r) {
        at::Tensor x = w.error_feedback ? at::add(g[r].to(at::kFloat), grad_residual_[r]) : g[r];
        const at::Tensor packed = at::zeros({world_, lowbit::ops::wire_row_bytes(w.format, chunk, block(w))}, at::kByte);
        lowbit::ops::wire_pack_reference(x, packed, fmt, w.block_size);
        decoded[r] = at::empty({layout_.total}, at::kFloat);
        lowbit::ops::wire_unpack_reference(packed, decoded[r], fmt, w.block_size);
        if (w.error_feedback) {
          grad_residual_[r] = x.to(at::kFloat) - decoded[r];
          grad_residual_[r].narrow(0, r * chunk, chunk).zero_();
        }
      }
      mean = wire_chunk_mean(g, decoded, chunk, dtype);
    }
    std::vector<at::Tensor> out;
    for (size_t k = 0; k < params_.size(); ++k)
      out.push_back(mean.narrow(0, offset_[k], params_[k].numel()).view(params_[k].sizes()));
    return out;
  }

  // After the reference's step: its parameters become what every replica holds.
  void replay_update(const at::Tensor& before_flat) {
    if (!so_.update_wire || world_ == 1) return;
    const WireCompression& w = *so_.update_wire;
    const std::string fmt = lowbit::format_name(w.format);
    const at::ScalarType dtype = params_[0].scalar_type();
    const at::Tensor now = flat(params_, dtype);
    const at::Tensor step = at::sub(now.to(at::kFloat), before_flat.to(at::kFloat));
    if (w.error_feedback) update_residual_.add_(step); else update_residual_.copy_(step);
    const at::Tensor packed = at::zeros({world_, lowbit::ops::wire_row_bytes(w.format, layout_.chunk, block(w))}, at::kByte);
    lowbit::ops::wire_pack_reference(update_residual_, packed, fmt, w.block_size);
    const at::Tensor decoded = at::empty({layout_.total}, at::kFloat);
    lowbit::ops::wire_unpack_reference(packed, decoded, fmt, w.block_size);
    const at::Tensor stored = at::add(before_flat.to(at::kFloat), decoded).to(dtype);
    if (w.error_feedback) update_residual_.add_(at::sub(before_flat.to(at::kFloat), stored.to(at::kFloat)));
    torch::NoGradGuard no_grad;
    for (size_t k = 0; k < params_.size(); ++k)
      params_[k].copy_(stored.narrow(0, offset_[k], params_[k].numel()).view(params_[k].sizes()));
  }

  int64_t chunk() const { return layout_.chunk; }

 private:
  static int64_t block(const WireCompression& w) {
    return w.block_size ? w.block_size : lowbit::default_block_size(w.format);
  }
  std::vector<at::Tensor> params_;
  int world_;
  ld::ShardedOptions so_;
  std::vector<size_t> order_;
  ld::FlatLayout layout_;
  std::vector<int64_t> offset_;
  std::vector<at::Tensor> grad_residual_;
  at::Tensor update_residual_;
};

// The sharded optimizer with `so` against the replay, `steps` steps, parameters and state bit for bit.
void expect_same_as_replay(const Factory& make, at::ScalarType dtype, const ld::ShardedOptions& so, int steps,
                           const GradFn& grad = default_grad) {
  const int rank = comm().rank(), world = comm().size();
  std::vector<at::Tensor> ref_params = make_params(dtype, at::kCPU), params = make_params(dtype, device());
  std::unique_ptr<lo::LowbitOptimizer> ref = make(ref_params);
  std::shared_ptr<lo::LowbitOptimizer> inner(make(params).release());
  ld::ShardedOptimizer sharded(inner, comm_ptr(), so);
  WireReplay replay(*ref, ref_params, world, so);
  for (int s = 1; s <= steps; ++s) {
    std::vector<std::vector<at::Tensor>> all(world);
    for (int r = 0; r < world; ++r)
      for (size_t k = 0; k < params.size(); ++k) all[r].push_back(grad(r, s, static_cast<int>(k), params[k].sizes(), dtype));
    const std::vector<at::Tensor> mean = replay.mean_gradients(all, dtype);
    for (size_t k = 0; k < params.size(); ++k) ref_params[k].mutable_grad() = mean[k].clone();
    if (so.overlap) {
      sharded.zero_grad();
      backward_with(params, all[rank]);
    } else {
      for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = all[rank][k].to(device());
    }
    sharded.step();
    const at::Tensor before = replay.flat(ref_params, dtype);
    ref->step();
    replay.replay_update(before);
  }
  std::vector<at::Tensor> on_device;
  for (const at::Tensor& p : params) on_device.push_back(p.cpu());
  expect_same_as(sharded, on_device, *ref, ref_params);
}

ld::ShardedOptions wires(std::optional<WireCompression> g, std::optional<WireCompression> u) {
  ld::ShardedOptions so;
  so.gradient_wire = g;
  so.update_wire = u;
  return so;
}

TEST(ShardedWire, GradientsInEightAndFourBitsMatchTheReplay) {
  for (QuantFormat f : {QuantFormat::Dyn8Signed, QuantFormat::DE4Signed, QuantFormat::FP8E4M3})
    for (bool ef : {false, true}) {
      SCOPED_TRACE(c10::str(lowbit::format_name(f), ef ? " with error feedback" : ""));
      const ld::ShardedOptions so = wires(WireCompression{f, 0, ef}, std::nullopt);
      for (StateFormat sf : {StateFormat::Q8, StateFormat::FP32})
        expect_same_as_replay([&](std::vector<at::Tensor>& p) {
          return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(sf));
        }, at::kFloat, so, 3);
    }
}

TEST(ShardedWire, UpdatesInEightBitsMatchTheReplayAndEveryReplicaIsTheSame) {
  for (bool ef : {true, false})
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      SCOPED_TRACE(c10::str(ef ? "error feedback " : "", dtype));
      const ld::ShardedOptions so = wires(std::nullopt, WireCompression{QuantFormat::Dyn8Signed, 64, ef});
      expect_same_as_replay([&](std::vector<at::Tensor>& p) {
        return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).weight_decay(0.1).state_format(StateFormat::Q8));
      }, dtype, so, 4);
    }
}

TEST(ShardedWire, BothLegsWithOverlapEveryRuleMatchTheReplay) {
  ld::ShardedOptions so = wires(WireCompression::gradients(), WireCompression::updates(QuantFormat::DE4Signed));
  so.overlap = true;
  so.bucket_bytes = int64_t{1} << 30;  // one bucket (the replay's)
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(rc.name);
    expect_same_as_replay([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q4, false); }, at::kFloat,
                          so, 2);
  }
  // bf16 gradients: summed in float32, divided once, rounded once.
  expect_same_as_replay([&](std::vector<at::Tensor>& p) { return rule_cases()[1].make(p, StateFormat::Q8, true); },
                        at::kBFloat16, so, 2);
}

TEST(ShardedWire, AnInfOnOneRankIsSkippedByEveryRank) {
  const int last = comm().size() - 1;
  const GradFn grad = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    at::Tensor g = rank_grad(r, s, k, shape, dtype);
    if (s == 2 && k == 3 && r == last) g.view(-1)[4100] = std::numeric_limits<float>::infinity();
    return g;
  };
  for (bool ef : {false, true}) {
    const ld::ShardedOptions so = wires(WireCompression{QuantFormat::Dyn8Signed, 0, ef}, WireCompression::updates());
    expect_same_as_replay([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).max_grad_norm(0.5).state_format(StateFormat::Q8));
    }, at::kFloat, so, 3, grad);
  }
}

TEST(ShardedWire, WireStatsCountTheBytesEachRankSends) {
  const int world = comm().size();
  const auto run = [&](const ld::ShardedOptions& so, at::ScalarType dtype) {
    std::vector<at::Tensor> params = make_params(dtype, device());
    std::shared_ptr<lo::LowbitOptimizer> inner = std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-2));
    ld::ShardedOptimizer sharded(inner, comm_ptr(), so);
    return sharded.wire_stats();
  };
  int64_t elements = 0;
  for (const auto& s : model_shapes()) elements += c10::multiply_integers(s);
  const ld::WireStats plain = run({}, at::kFloat), bf16 = run({}, at::kBFloat16);
  const ld::WireStats both = run(wires(WireCompression::gradients(), WireCompression::updates()), at::kFloat);
  ld::ShardedOptions z1;
  z1.zero1 = true;
  const ld::WireStats zero1 = run(z1, at::kFloat);
  EXPECT_EQ(plain.parameters, elements);
  EXPECT_EQ(both.parameters, elements);
  // One bucket: chunk elements per rank; a ring sends world - 1 chunks per leg, all-reduce twice that.
  ld::ShardedOptions so;
  std::vector<at::Tensor> ps = make_params(at::kFloat, at::kCPU);
  lo::AdamW probe(ps, lo::AdamWOptions(1e-2));
  WireReplay replay(probe, ps, world, so);
  const int64_t chunk = replay.chunk();
  EXPECT_EQ(plain.gradient_bytes, (world - 1) * chunk * 4);
  EXPECT_EQ(plain.parameter_bytes, (world - 1) * chunk * 4);
  EXPECT_EQ(bf16.gradient_bytes, (world - 1) * chunk * 2);
  EXPECT_EQ(zero1.gradient_bytes, 2 * (world - 1) * chunk * 4);
  const int64_t row = chunk + 4 * (chunk / 256);  // Dyn8Signed, blocks of 256
  EXPECT_EQ(both.gradient_bytes, (world - 1) * row);
  EXPECT_EQ(both.parameter_bytes, (world - 1) * row);
  if (world > 1) EXPECT_GT(plain.bytes_per_parameter() / both.bytes_per_parameter(), 3.9);
}

// The job's communicator with an all_to_all it refuses, as a backend without one would.
class NoAllToAll : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  const char* backend() const override { return "no-all-to-all"; }
  void all_to_all(const at::Tensor&, at::Tensor&) override { TORCH_CHECK(false, "all_to_all is not supported here"); }
};

TEST(ShardedWire, ACommunicatorWithoutAllToAllIsNamedWhenConstructed) {
  auto c = std::make_shared<NoAllToAll>(comm_ptr());
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  const auto make = [&](const ld::ShardedOptions& so) {
    return error_of([&] { ld::ShardedOptimizer s(std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-2)), c, so); });
  };
  const std::string e = make(wires(WireCompression::gradients(), std::nullopt));
  if (comm().size() > 1)
    EXPECT_NE(e.find("ShardedOptions::gradient_wire exchanges quantized chunks with all_to_all, which the no-all-to-all "
                     "communicator refused on rank " + std::to_string(comm().rank()) + ": all_to_all is not supported here"),
              std::string::npos)
        << e;
  else
    EXPECT_EQ(e, "");  // one rank exchanges nothing
  // The update leg all-gathers: no all_to_all needed.
  EXPECT_EQ(make(wires(std::nullopt, WireCompression::updates())), "");
}

TEST(ShardedWire, BadOptionsAreRefusedOnEveryRankNamingTheOptionAndTheRank) {
  const int rank = comm().rank(), world = comm().size();
  const auto error_with = [&](const ld::ShardedOptions& so) {
    std::vector<at::Tensor> params = make_params(at::kFloat, device());
    std::shared_ptr<lo::LowbitOptimizer> inner = std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-2));
    const at::Tensor before = params[0].detach().clone();
    const std::string e = error_of([&] { ld::ShardedOptimizer sharded(inner, comm_ptr(), so); });
    EXPECT_TRUE(bitwise_equal(params[0].detach(), before));
    return e;
  };
  ld::ShardedOptions z1 = wires(WireCompression::gradients(), std::nullopt);
  z1.zero1 = true;
  EXPECT_NE(error_with(z1).find("gradient_wire compresses the reduce-scatter; with zero1"), std::string::npos);
  EXPECT_NE(error_with(wires(WireCompression{QuantFormat::Dyn8Unsigned, 0, false}, std::nullopt)).find("unsigned"),
            std::string::npos);
  EXPECT_NE(error_with(wires(std::nullopt, WireCompression{QuantFormat::Dyn8Signed, 512, true}))
                .find("ShardedOptions::update_wire.block_size is 512"),
            std::string::npos);
  EXPECT_NE(error_with(wires(std::nullopt, WireCompression{static_cast<QuantFormat>(42), 0, true}))
                .find("not a QuantFormat"),
            std::string::npos);
  if (world > 1) {
    // The last rank asks for 4 bits, the others for 8: every rank refuses, naming it.
    const WireCompression w{rank == world - 1 ? QuantFormat::DE4Signed : QuantFormat::Dyn8Signed, 0, false};
    const std::string e = error_with(wires(w, std::nullopt));
    EXPECT_NE(e.find("ShardedOptions::gradient_wire.format: rank 0 has Dyn8Signed, rank " + std::to_string(world - 1) +
                     " has DE4Signed"),
              std::string::npos)
        << e;
    ld::ShardedOptions other;
    other.overlap = rank == world - 1;
    EXPECT_NE(error_with(other).find("ShardedOptions::overlap"), std::string::npos);
  }
  comm().barrier();  // the communicator still pairs up
}

}  // namespace
}  // namespace lowbit_test
