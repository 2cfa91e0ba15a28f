// FullyShardedModule against one unsharded process fed the averaged gradients: parameters and every
// rank's state bit for bit (every rule and state format, bf16 with stochastic rounding or a master
// correction, clipping and the non-finite skip, micro-batches, parameters a rank does not use),
// memory released where the module says, and its misuses as clear errors.
#include "dist_util.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include <lowbit/distributed/compressed_wire.h>
#include <lowbit/distributed/flat_layout.h>
#include <lowbit/optim/step_calls.h>
#include <lowbit/tensors/keyed_random.h>
#include <lowbit/tensors/wire_ops.h>

namespace lowbit_test {
namespace {

using lowbit::QuantFormat;

// A unit whose parameter k receives exactly the gradient grad(rank, step, k): its forward adds
// sum(p * g) to the running value; 0 * sum(p * p) adds nothing but makes backward read p (it must
// have been gathered again).
struct CraftedUnitImpl : torch::nn::Module {
  std::vector<int> ks;
  std::vector<at::Tensor> ps;
  CraftedUnitImpl(const std::vector<int>& k, const std::vector<at::Tensor>& all) : ks(k) {
    for (int i : ks) ps.push_back(register_parameter("p" + std::to_string(i), all[static_cast<size_t>(i)]));
  }
  at::Tensor forward(at::Tensor x, const GradFn& grad, int rank, int step) {
    for (size_t j = 0; j < ps.size(); ++j) {
      const at::Tensor g = grad(rank, step, ks[j], ps[j].sizes(), ps[j].scalar_type());
      if (!g.defined()) continue;  // unused on this rank
      const at::Tensor term = (ps[j] * g.to(ps[j].device())).sum().to(at::kFloat) + 0 * (ps[j] * ps[j]).sum().to(at::kFloat);
      x = x.defined() ? x + term : term;
    }
    return x;
  }
};
TORCH_MODULE(CraftedUnit);

// model_shapes()'s parameters: units {0, 1}, {2, 3} and {4}; parameter 5 in the root.
struct CraftedModelImpl : torch::nn::Module {
  std::vector<CraftedUnit> units;
  CraftedUnit root_part{nullptr};
  explicit CraftedModelImpl(const std::vector<at::Tensor>& params) {
    const std::vector<std::vector<int>> split = {{0, 1}, {2, 3}, {4}};
    for (size_t u = 0; u < split.size(); ++u)
      units.push_back(register_module("unit" + std::to_string(u), CraftedUnit(split[u], params)));
    root_part = register_module("root", CraftedUnit(std::vector<int>{5}, params));
  }
  std::vector<std::shared_ptr<torch::nn::Module>> unit_modules() {
    std::vector<std::shared_ptr<torch::nn::Module>> out;
    for (auto& u : units) out.push_back(u.ptr());
    return out;
  }
  at::Tensor forward(ld::FullyShardedModule& fsdp, const GradFn& grad, int rank, int step) {
    return fsdp.forward([&] {
      at::Tensor x = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device()));
      for (size_t u = 0; u < units.size(); ++u)
        x = fsdp.unit(u, [&] { return units[u]->forward(x, grad, rank, step); });
      return root_part->forward(x, grad, rank, step);
    });
  }
};
TORCH_MODULE(CraftedModel);

struct FsdpRun {
  int steps = 3;
  int micro_batches = 1;
  ld::FullyShardedOptions options;
  GradFn grad = default_grad;
  bool all_used = true;  // grad gives every parameter a gradient on every rank
  // The one process's gradients where they differ from grad's (a unit the sharded run skips).
  GradFn reference_grad;
  int64_t skipped = 0;  // steps the module reports skipped
  bool host_built = false;  // the model built on the host, sharded onto device() (FullyShardedOptions::device)
  // Each rank fills its shards with keyed_normal_ (FullyShardedOptions::initialize) from NaN
  // parameters it must never read; the one process fills its parameters whole.
  bool keyed_init = false;
};

// keyed_init's values, each parameter's by its name in the crafted model: a
// FullyShardedOptions::initialize, and one process's fill of a whole parameter (first 0).
void fill_keyed(const std::string& name, const at::Tensor&, int64_t first, const at::Tensor& values) {
  lowbit::keyed_normal_(values, 0.0, 0.5, lowbit::keyed_random_key(name, 7), first);
}

// The mean gradient a fully sharded step over FullyShardedOptions::gradient_wire steps with, replayed
// in one process with the wire's ATen reference: per unit (the crafted model's buckets: {0, 1},
// {2, 3}, {4}, then the root's {5}), each rank's flat gradient packed and decoded, and each chunk
// the float32 sum in rank order of the decoded rows with the owner's own exact, divided once,
// rounded once to the reduce dtype. grads[r][k]: rank r's gradient of parameter k (undefined:
// zeros), in the reduce dtype.
std::vector<at::Tensor> wire_mean(const ld::WireCompression& w, const lo::LowbitOptimizer& ref,
                                  const std::vector<at::Tensor>& ref_params,
                                  const std::vector<std::vector<at::Tensor>>& grads, at::ScalarType reduce) {
  const int world = static_cast<int>(grads.size());
  const auto group_of = [&](const at::Tensor& p) {
    const auto& groups = ref.param_groups();
    for (size_t gi = 0; gi < groups.size(); ++gi)
      for (const at::Tensor& q : groups[gi].params())
        if (q.is_same(p)) return gi;
    TORCH_CHECK(false, "wire_mean: a parameter in no group");
  };
  const std::string fmt = lowbit::format_name(w.format);
  const int64_t block = w.block_size ? w.block_size : lowbit::default_block_size(w.format);
  std::vector<at::Tensor> out(ref_params.size());
  for (const std::vector<size_t>& unit : std::vector<std::vector<size_t>>{{0, 1}, {2, 3}, {4}, {5}}) {
    std::vector<ld::FlatEntry> entries;
    for (size_t k : unit)
      entries.push_back({ref_params[k].numel(), lo::FragmentAccess::layout(ref, group_of(ref_params[k]), ref_params[k]).block_size});
    const ld::FlatLayout layout = ld::plan_flat_layout(entries, world);
    const int64_t chunk = layout.chunk;
    std::vector<at::Tensor> flat(world), decoded(world);
    for (int r = 0; r < world; ++r) {
      flat[r] = at::zeros({layout.total}, at::TensorOptions().dtype(reduce));
      for (size_t i = 0; i < unit.size(); ++i) {
        const at::Tensor& g = grads[r][unit[i]];
        if (g.defined()) flat[r].narrow(0, layout.offsets[i], g.numel()).copy_(g.reshape(-1).cpu());
      }
      const at::Tensor packed = at::zeros({world, lowbit::ops::wire_row_bytes(w.format, chunk, block)}, at::kByte);
      lowbit::ops::wire_pack_reference(flat[r], packed, fmt, w.block_size);
      decoded[r] = at::empty({layout.total}, at::kFloat);
      lowbit::ops::wire_unpack_reference(packed, decoded[r], fmt, w.block_size);
    }
    const at::Tensor mean = wire_chunk_mean(flat, decoded, chunk, reduce);
    for (size_t i = 0; i < unit.size(); ++i) {
      const size_t k = unit[i];
      out[k] = mean.narrow(0, layout.offsets[i], ref_params[k].numel()).view(ref_params[k].sizes()).clone();
    }
  }
  return out;
}

// Trains the crafted model fully sharded and one process on the mean gradients; compares.
void expect_fsdp_same_as_one_process(const Factory& make, at::ScalarType dtype, const FsdpRun& run = {}) {
  const int rank = comm().rank(), world = comm().size();
  std::vector<at::Tensor> params = make_params(dtype, run.host_built ? at::Device(at::kCPU) : device()),
                          ref_params = make_params(dtype, device());
  CraftedModel model(params);
  ld::FullyShardedOptions options = run.options;
  if (run.keyed_init) {
    torch::NoGradGuard no_grad;
    for (at::Tensor& p : params) p.fill_(std::numeric_limits<double>::quiet_NaN());
    for (const auto& item : CraftedModel(ref_params)->named_parameters())
      fill_keyed(item.key(), item.value(), 0, item.value());
    options.initialize = fill_keyed;
  }
  std::shared_ptr<lo::LowbitOptimizer> inner(make(params).release());
  std::unique_ptr<lo::LowbitOptimizer> ref = make(ref_params);
  if (run.host_built) options.device = device();
  ld::FullyShardedModule fsdp(model.ptr(), model->unit_modules(), inner, comm_ptr(), options);
  for (const at::Tensor& p : params) EXPECT_EQ(p.device(), device());
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
  for (int s = 1; s <= run.steps; ++s) {
    fsdp.zero_grad();
    for (int mb = 0; mb < run.micro_batches; ++mb) {
      const int key = 10 * s + mb;
      fsdp.set_accumulating(mb + 1 < run.micro_batches);
      at::Tensor loss = model->forward(fsdp, run.grad, rank, key);
      // After forward only the root stays gathered, and with reshard_after_forward off the units.
      for (size_t u = 0; u < fsdp.units(); ++u)
        EXPECT_EQ(fsdp.gathered(u), !run.options.reshard_after_forward) << "step " << s << " unit " << u;
      EXPECT_TRUE(fsdp.gathered(fsdp.units()));
      loss.backward();
      // Where every rank had every gradient, backward() reduced every unit and released it.
      if (run.all_used && mb + 1 == run.micro_batches)
        for (size_t u = 0; u <= fsdp.units(); ++u) EXPECT_FALSE(fsdp.gathered(u)) << "step " << s << " unit " << u;
      // step_in_backward: backward() has stepped every piece already.
      if (run.options.step_in_backward && run.all_used && !run.reference_grad && mb + 1 == run.micro_batches)
        for (const ld::Fragment& f : fsdp.sharded().fragments())
          EXPECT_EQ(f.state.counters.defined() ? f.state.step() : 0, s) << "parameter " << f.index;
    }
    // Mixed precision: the ranks' gradients come in the dtype the units compute in, and their mean
    // is rounded once, to the dtype they are reduced in.
    const at::ScalarType compute = dtype == at::kFloat ? run.options.param_dtype.value_or(dtype) : dtype;
    const at::ScalarType reduce = run.options.reduce_dtype.value_or(compute);
    if (run.options.gradient_wire && world > 1) {
      TORCH_CHECK(run.micro_batches == 1 && !run.reference_grad, "the wire's replay takes one micro-batch");
      std::vector<std::vector<at::Tensor>> grads(static_cast<size_t>(world));
      for (int r = 0; r < world; ++r)
        for (size_t k = 0; k < params.size(); ++k) {
          const at::Tensor g = run.grad(r, 10 * s, static_cast<int>(k), ref_params[k].sizes(), compute);
          grads[static_cast<size_t>(r)].push_back(g.defined() ? g.to(reduce) : g);
        }
      const std::vector<at::Tensor> mean = wire_mean(*run.options.gradient_wire, *ref, ref_params, grads, reduce);
      for (size_t k = 0; k < params.size(); ++k) ref_params[k].mutable_grad() = mean[k].to(device());
    }
    for (size_t k = 0; k < params.size() && !(run.options.gradient_wire && world > 1); ++k) {
      at::Tensor sum = at::zeros(ref_params[k].sizes(), at::kFloat);
      bool any = false;
      const GradFn& ref_grad = run.reference_grad ? run.reference_grad : run.grad;
      for (int r = 0; r < world; ++r)
        for (int mb = 0; mb < run.micro_batches; ++mb) {
          const at::Tensor g = ref_grad(r, 10 * s + mb, static_cast<int>(k), ref_params[k].sizes(), compute);
          if (!g.defined()) continue;
          sum += g.to(at::kFloat);
          any = true;
        }
      ref_params[k].mutable_grad() = any ? (sum / world).to(reduce).to(device()) : at::Tensor();
    }
    fsdp.step();
    ref->step();
    EXPECT_EQ(fsdp.gathered_bytes(), 0) << "step " << s;
  }
  fsdp.gather_all();
  expect_same_as(fsdp.sharded(), params, *ref, ref_params, run.skipped);
  fsdp.release_all();
}

// The low-bit gradient wire (8 and 4 bits) against one process replaying it, every rule, with
// gradient release and mixed precision too; its buffers live only from a unit's reduction to its
// sum; error feedback is refused (its residual would be a whole unit's gradient per rank).
TEST(FullyShardedModule, TheLowBitGradientWireMatchesOneProcessReplayingIt) {
  for (QuantFormat wf : {QuantFormat::Dyn8Signed, QuantFormat::DE4Signed}) {
    FsdpRun wire;
    wire.options.gradient_wire = ld::WireCompression::gradients(wf);
    for (const RuleCase& rc : rule_cases()) {
      // Every rule over 8 bits; over 4 bits two (the wire is the same for every rule).
      if (wf == QuantFormat::DE4Signed && std::string(rc.name) != "AdamW" && std::string(rc.name) != "Lion") continue;
      SCOPED_TRACE(std::string(rc.name) + " over " + lowbit::format_name(wf));
      expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q8, false); },
                                      at::kFloat, wire);
    }
    FsdpRun release = wire;
    release.options.step_in_backward = true;
    expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4).master_weight_bits(24));
    }, at::kBFloat16, release);
    FsdpRun mixed = wire;
    mixed.options.param_dtype = at::kBFloat16;
    mixed.options.reduce_dtype = at::kFloat;
    expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[1].make(p, StateFormat::Q8, false); },
                                    at::kFloat, mixed);
  }
  // After a step nothing of the wire is held; the gradient buffers' high-water mark counts its
  // send and receive buffers beside the float32 gradient buffers a step without it holds.
  ld::FullyShardedOptions options;
  const auto one_step = [&](const ld::FullyShardedOptions& o) {
    std::vector<at::Tensor> params = make_params(at::kFloat, device());
    CraftedModel model(params);
    ld::FullyShardedModule fsdp(model.ptr(), model->unit_modules(),
                                std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3)), comm_ptr(), o);
    model->forward(fsdp, default_grad, comm().rank(), 1).backward();
    fsdp.step();
    return fsdp.memory_report();
  };
  const ld::FullyShardedMemory plain = one_step(options);
  options.gradient_wire = ld::WireCompression::gradients();
  const ld::FullyShardedMemory wired = one_step(options);
  EXPECT_EQ(wired.gradient_bytes, 0);
  if (comm().size() > 1) EXPECT_GT(wired.peak_gradient_bytes, plain.peak_gradient_bytes);
  // Error feedback: refused on every rank, naming the option.
  options.gradient_wire->error_feedback = true;
  std::vector<at::Tensor> fresh = make_params(at::kFloat, device());
  CraftedModel other(fresh);
  const std::string err = error_of([&] {
    ld::FullyShardedModule f(other.ptr(), other->unit_modules(), std::make_shared<lo::AdamW>(fresh, lo::AdamWOptions(1e-3)),
                             comm_ptr(), options);
  });
  EXPECT_NE(err.find("FullyShardedOptions::gradient_wire with error_feedback would keep on every rank"),
            std::string::npos) << err;
}

TEST(FullyShardedModule, EveryRuleAndStateFormatMatchesOneProcess) {
  for (const RuleCase& rc : rule_cases())
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::FP32}) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, false); }, at::kFloat);
    }
}

TEST(FullyShardedModule, Bf16WithStochasticRoundingOrAMasterCorrectionMatchesOneProcess) {
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(rc.name);
    expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q8, true); },
                                    at::kBFloat16);
  }
  for (int64_t bits : {24, 32}) {
    SCOPED_TRACE(std::to_string(bits) + "-bit master");
    expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4).master_weight_bits(bits));
    }, at::kBFloat16);
  }
}

// Each rank filling only its own shards (FullyShardedOptions::initialize, keyed_normal_) gives the
// model one process gets filling every parameter whole: float32, bf16 with a master correction,
// float32 shards computing in bf16, the model built on the host.
TEST(FullyShardedModule, RanksFillingTheirOwnShardsMatchOneProcessFillingWholeParameters) {
  FsdpRun keyed;
  keyed.keyed_init = true;
  expect_fsdp_same_as_one_process([](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  }, at::kFloat, keyed);
  expect_fsdp_same_as_one_process([](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4).master_weight_bits(24));
  }, at::kBFloat16, keyed);
  FsdpRun mixed = keyed;
  mixed.options.param_dtype = at::kBFloat16;
  mixed.host_built = true;
  expect_fsdp_same_as_one_process([](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::Lion>(p, lo::LionOptions(1e-3).state_format(StateFormat::Q8));
  }, at::kFloat, mixed);
}

TEST(FullyShardedModule, KeptAfterForwardMicroBatchesAndUnusedParametersMatchOneProcess) {
  const auto adamw = [](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  };
  FsdpRun kept;
  kept.options.reshard_after_forward = false;
  expect_fsdp_same_as_one_process(adamw, at::kFloat, kept);
  FsdpRun micro;
  micro.micro_batches = 3;
  expect_fsdp_same_as_one_process(adamw, at::kFloat, micro);
  // Parameter 2 (unit 1) unused on rank 0, parameter 0 (unit 0) on the last rank at step 2, the
  // root's parameter 5 on every rank at step 3 (not stepped then, as one process).
  const int last = comm().size() - 1;
  FsdpRun unused;
  unused.all_used = false;
  unused.grad = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    if ((k == 2 && r == 0) || (k == 0 && s == 20 && r == last) || (k == 5 && s == 30)) return at::Tensor();
    return rank_grad(r, s, k, shape, dtype);
  };
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(rc.name);
    expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q4, false); },
                                    at::kFloat, unused);
  }
}

TEST(FullyShardedModule, ClippingAndTheNonFiniteSkipMatchOneProcess) {
  // The same gradient on every rank (exact mean and squares); at step 2 an Inf from the last rank.
  const int last = comm().size() - 1;
  FsdpRun run;
  run.all_used = true;
  run.grad = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    at::Tensor g = rank_grad(0, s, k, shape, dtype);
    if (s == 20 && k == 3 && r == last) g.view(-1)[4100] = std::numeric_limits<float>::infinity();
    return g;
  };
  for (StateFormat f : {StateFormat::Q8, StateFormat::FP32}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(f).max_grad_norm(0.5));
    }, at::kFloat, run);
    expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::LAMB>(p, lo::LAMBOptions(1e-2).state_format(f).max_grad_norm(0.5));
    }, at::kFloat, run);
  }
}

TEST(FullyShardedModule, StepInBackwardMatchesOneProcess) {
  FsdpRun release;
  release.options.step_in_backward = true;
  for (const RuleCase& rc : rule_cases()) {
    if (std::string(rc.name) == "LAMB") continue;  // refused (below)
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::FP32}) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, false); }, at::kFloat,
                                      release);
    }
  }
  expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[1].make(p, StateFormat::Q8, true); },
                                  at::kBFloat16, release);
  expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4).master_weight_bits(24));
  }, at::kBFloat16, release);
  FsdpRun host = release;
  host.host_built = true;
  expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4).master_weight_bits(24));
  }, at::kBFloat16, host);
  FsdpRun micro = release;
  micro.micro_batches = 3;
  expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[0].make(p, StateFormat::Q8, false); },
                                  at::kFloat, micro);
  // Unused parameters (as without release), and the per-unit skip: an Inf in parameter 3 (unit 1)
  // from the last rank at step 2 skips unit 1 on every rank, as one process whose unit-1
  // parameters have no gradient at that step.
  const int last = comm().size() - 1;
  FsdpRun unused = release;
  unused.all_used = false;
  unused.grad = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    if ((k == 2 && r == 0) || (k == 0 && s == 20 && r == last) || (k == 5 && s == 30)) return at::Tensor();
    return rank_grad(r, s, k, shape, dtype);
  };
  expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[1].make(p, StateFormat::Q4, false); },
                                  at::kFloat, unused);
  FsdpRun inf = release;
  inf.grad = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    at::Tensor g = rank_grad(r, s, k, shape, dtype);
    if (s == 20 && k == 3 && r == last) g.view(-1)[4100] = std::numeric_limits<float>::infinity();
    return g;
  };
  inf.reference_grad = [](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    return s == 20 && (k == 2 || k == 3) ? at::Tensor() : rank_grad(r, s, k, shape, dtype);
  };
  inf.skipped = 1;
  expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[1].make(p, StateFormat::Q8, false); },
                                  at::kFloat, inf);
  // What needs every gradient first.
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  CraftedModel model(params);
  const auto refused = [&](std::shared_ptr<lo::LowbitOptimizer> opt, const std::string& part) {
    const std::string err = error_of(
        [&] { ld::FullyShardedModule f(model.ptr(), model->unit_modules(), std::move(opt), comm_ptr(), release.options); });
    EXPECT_NE(err.find(part), std::string::npos) << "no '" << part << "' in: " << err;
  };
  refused(std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3).max_grad_norm(1.0)),
          "global-norm clipping cannot work: group 0 has max_grad_norm 1; set it to 0");
  refused(std::make_shared<lo::LAMB>(params, lo::LAMBOptions(1e-3)), "with LAMB (group 0) is not supported yet");
}

TEST(FullyShardedModule, MixedPrecisionMatchesOneProcessKeepingFloat32) {
  // float32 shards stepped by the optimizer, units computing in bfloat16: one process's float32
  // parameters fed the mean of the ranks' bfloat16 gradients, rounded to bfloat16 or kept in float32.
  for (const std::optional<at::ScalarType> reduce : {std::optional<at::ScalarType>(), std::optional(at::kFloat)}) {
    for (const bool release : {false, true}) {
      FsdpRun run;
      run.options.param_dtype = at::kBFloat16;
      run.options.reduce_dtype = reduce;
      run.options.step_in_backward = release;
      for (const RuleCase& rc : rule_cases()) {
        if (release && std::string(rc.name) == "LAMB") continue;
        for (StateFormat f : {StateFormat::Q8, StateFormat::FP32}) {
          SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f) + (reduce ? " reduce fp32" : "") +
                       (release ? " step in backward" : ""));
          expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, false); }, at::kFloat,
                                          run);
        }
      }
    }
  }
  // bfloat16 parameters are left as they are; float32 gradients of them still reduce in float32.
  FsdpRun bf16;
  bf16.options.param_dtype = at::kBFloat16;
  bf16.options.reduce_dtype = at::kFloat;
  expect_fsdp_same_as_one_process([&](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4).master_weight_bits(24));
  }, at::kBFloat16, bf16);
  // The model's parameters are bfloat16 tensors; the checkpoint keeps the float32 shards.
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  CraftedModel model(params);
  ld::FullyShardedModule fsdp(model.ptr(), model->unit_modules(),
                              std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3)), comm_ptr(), bf16.options);
  for (const at::Tensor& p : params) EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  for (size_t i = 0; i < fsdp.sharded().fragments().size(); ++i)
    EXPECT_EQ(fsdp.sharded().fragment_values(i).scalar_type(), at::kFloat);
  // Checkpoints keep the float32 shards: a fresh module of the same policy loads them, and so does
  // one process's float32 optimizer, bit for bit.
  fsdp.zero_grad();
  model->forward(fsdp, default_grad, comm().rank(), 1).backward();
  fsdp.step();
  const std::string prefix = "fsdp_mixed_precision_np" + std::to_string(comm().size());
  fsdp.save(prefix);
  std::vector<at::Tensor> again = make_params(at::kFloat, device());
  for (at::Tensor& p : again) p.detach().zero_();
  CraftedModel model2(again);
  ld::FullyShardedModule loaded(model2.ptr(), model2->unit_modules(),
                                std::make_shared<lo::AdamW>(again, lo::AdamWOptions(1e-3)), comm_ptr(), bf16.options);
  loaded.load(prefix);
  std::vector<at::Tensor> one_params = make_params(at::kFloat, device());
  for (at::Tensor& p : one_params) p.detach().zero_();
  lo::AdamW one(one_params, lo::AdamWOptions(1e-3));
  ld::load_fragments(one, prefix);
  ASSERT_EQ(loaded.sharded().fragments().size(), fsdp.sharded().fragments().size());
  for (size_t i = 0; i < fsdp.sharded().fragments().size(); ++i) {
    const ld::Fragment& f = fsdp.sharded().fragments()[i];
    const at::Tensor& v = fsdp.sharded().fragment_values(i);
    EXPECT_TRUE(bitwise_equal(loaded.sharded().fragment_values(i), v)) << "parameter " << f.index;
    EXPECT_TRUE(bitwise_equal(one_params[f.index].reshape({-1}).narrow(0, f.offset, f.numel), v)) << "parameter " << f.index;
    std::vector<at::Tensor> a, b;
    lowbit::optim::append_state_range(f.state, 0, f.numel, a);
    lowbit::optim::append_state_range(*one.state_of(one_params[f.index]), f.offset, f.numel, b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size(); ++t) EXPECT_TRUE(bitwise_equal(a[t], b[t])) << "parameter " << f.index;
  }
  // Refused before anything changes: a dtype nothing computes in, float32 shards given a
  // master-weight correction.
  std::vector<at::Tensor> fresh = make_params(at::kFloat, device());
  CraftedModel other(fresh);
  const auto refused = [&](std::shared_ptr<lo::LowbitOptimizer> opt, ld::FullyShardedOptions o, const std::string& part) {
    const std::string err = error_of(
        [&] { ld::FullyShardedModule f(other.ptr(), other->unit_modules(), std::move(opt), comm_ptr(), o); });
    EXPECT_NE(err.find(part), std::string::npos) << "no '" << part << "' in: " << err;
    for (const at::Tensor& p : fresh) EXPECT_EQ(p.scalar_type(), at::kFloat);
  };
  ld::FullyShardedOptions wrong;
  wrong.param_dtype = at::kInt;
  refused(std::make_shared<lo::AdamW>(fresh, lo::AdamWOptions(1e-3)), wrong,
          "FullyShardedOptions::param_dtype is Int; parameters compute in float32, bfloat16 or float16");
  wrong.param_dtype = at::kBFloat16;
  wrong.reduce_dtype = at::kLong;
  refused(std::make_shared<lo::AdamW>(fresh, lo::AdamWOptions(1e-3)), wrong,
          "FullyShardedOptions::reduce_dtype is Long; gradients are reduced in float32, bfloat16 or float16");
  refused(std::make_shared<lo::AdamW>(fresh, lo::AdamWOptions(1e-3).master_weight_bits(24)), bf16.options,
          "FullyShardedOptions::param_dtype BFloat16 with group 0's master_weight_bits 24");
}

TEST(FullyShardedModule, HoldsAShareOfTheParametersAndReleasesThem) {
  const int world = comm().size();
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  CraftedModel model(params);
  ld::FullyShardedModule fsdp(model.ptr(), model->unit_modules(),
                              std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3)), comm_ptr());
  EXPECT_EQ(fsdp.units(), 3u);
  int64_t elements = 0;
  for (const at::Tensor& p : params) elements += p.numel();
  EXPECT_GE(fsdp.model_bytes(), elements * 4);
  EXPECT_EQ(fsdp.shard_bytes() * world, fsdp.model_bytes());
  // A released parameter is an error to read, not stale memory.
  try {
    (void)params[0].sum();
    ADD_FAILURE() << "a released parameter was read";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("this parameter of unit 0 is released"), std::string::npos) << e.what();
  }
  fsdp.gather_all();
  EXPECT_EQ(fsdp.gathered_bytes(), fsdp.model_bytes());
  EXPECT_TRUE(bitwise_equal(params[3], make_params(at::kFloat, device())[3]));
  fsdp.release_all();
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
  // Evaluation: nothing stays gathered after forward() without grad mode.
  {
    torch::NoGradGuard no_grad;
    const at::Tensor y = model->forward(fsdp, default_grad, comm().rank(), 1);
    EXPECT_TRUE(y.defined());
  }
  EXPECT_EQ(fsdp.gathered_bytes(), 0);

  // memory_report(): the persistent parts, and the high-water marks of the transient ones over a
  // training step (reshard after forward: the root and at most two units gathered at a time).
  std::vector<int64_t> unit_bytes;  // each unit's gathered bytes, the root's last
  for (size_t u = 0; u <= fsdp.units(); ++u) {
    fsdp.gather(u);
    unit_bytes.push_back(fsdp.gathered_bytes());
    fsdp.release(u);
  }
  const int64_t root = unit_bytes.back();
  std::vector<int64_t> largest(unit_bytes.begin(), unit_bytes.end() - 1);
  std::sort(largest.rbegin(), largest.rend());
  fsdp.reset_memory_peaks();
  const ld::FullyShardedMemory fresh = fsdp.memory_report();
  EXPECT_EQ(fresh.parameters, elements);
  EXPECT_EQ(fresh.shard_bytes, fsdp.shard_bytes());
  EXPECT_EQ(fresh.peak_gathered_bytes, 0);
  EXPECT_EQ(fresh.peak_gradient_bytes, 0);
  EXPECT_GT(fresh.state_bytes, 0) << "the state is made when the module is, not in the first step";
  fsdp.zero_grad();
  model->forward(fsdp, default_grad, comm().rank(), 1).backward();
  fsdp.step();
  const ld::FullyShardedMemory r = fsdp.memory_report();
  EXPECT_EQ(r.gathered_bytes, 0);
  EXPECT_EQ(r.gradient_bytes, 0);
  EXPECT_EQ(r.state_bytes, fresh.state_bytes);
  EXPECT_EQ(r.state_bytes + r.correction_bytes, fsdp.sharded().state_bytes());
  EXPECT_GE(r.peak_gathered_bytes, root + largest[0]);
  EXPECT_LE(r.peak_gathered_bytes, root + largest[0] + largest[1]);
  EXPECT_LT(r.peak_gathered_bytes, fsdp.model_bytes());
  EXPECT_GE(r.peak_gradient_bytes, root);
  EXPECT_LE(r.peak_gradient_bytes, root + largest[0] + largest[1]);
  // Gradient shards: this rank's share of every bucket (float32 buckets' in one buffer, counted once).
  EXPECT_EQ(r.gradient_shard_bytes, fsdp.shard_bytes());
  EXPECT_EQ(r.peak_bound_bytes(), r.persistent_bytes() + r.peak_gathered_bytes + r.peak_gradient_bytes +
                                      r.peak_gradient_shard_bytes);
  EXPECT_NE(r.to_string().find("gathered weights now / peak"), std::string::npos) << r.to_string();
}

TEST(FullyShardedModule, InvalidUsesAreClearErrors) {
  const auto expect_error = [](const std::function<void()>& fn, const std::string& part) {
    const std::string err = error_of(fn);
    EXPECT_NE(err.find(part), std::string::npos) << "no '" << part << "' in: " << err;
  };
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  CraftedModel model(params);
  auto units = model->unit_modules();
  // A parameter in two units (unit 0 given twice).
  expect_error([&] {
    ld::FullyShardedModule f(model.ptr(), {units[0], units[0]}, std::make_shared<lo::AdamW>(params), comm_ptr());
  }, "parameter 'unit0.p0' is in unit 0 and in unit 1");
  // A null unit, a null optimizer.
  expect_error([&] {
    ld::FullyShardedModule f(model.ptr(), {units[0], nullptr}, std::make_shared<lo::AdamW>(params), comm_ptr());
  }, "FullyShardedModule: unit 1 is null");
  expect_error([&] { ld::FullyShardedModule f(model.ptr(), units, nullptr, comm_ptr()); },
               "FullyShardedModule: optimizer is null");
  // A module outside the root.
  CraftedUnit stranger(std::vector<int>{0}, make_params(at::kFloat, device()));
  expect_error([&] {
    ld::FullyShardedModule f(model.ptr(), {stranger.ptr()}, std::make_shared<lo::AdamW>(params), comm_ptr());
  }, "is not a parameter of the root module");
  // Ranks that cut the model differently: rank 1 makes unit 1 part of the root.
  if (comm().size() > 1) {
    std::vector<std::shared_ptr<torch::nn::Module>> mine = units;
    if (comm().rank() == 1) mine.erase(mine.begin() + 1);
    expect_error([&] {
      ld::FullyShardedModule f(model.ptr(), mine, std::make_shared<lo::AdamW>(params), comm_ptr());
    }, "FullyShardedModule: the ranks disagree on the number of units (the root's included): rank 0 has 4, rank 1 "
       "has 3");
    // ... or the gradient wire's format: named before any collective of a step.
    ld::FullyShardedOptions wire;
    wire.gradient_wire = ld::WireCompression::gradients(comm().rank() == 1 ? QuantFormat::DE4Signed
                                                                            : QuantFormat::Dyn8Signed);
    expect_error([&] {
      ld::FullyShardedModule f(model.ptr(), units, std::make_shared<lo::AdamW>(params), comm_ptr(), wire);
    }, "FullyShardedModule: the ranks disagree on FullyShardedOptions::gradient_wire.format: rank 0 has ");
    // ... or on whether each fills its own shards (rank 0 would broadcast to ranks that do not listen).
    ld::FullyShardedOptions filled;
    if (comm().rank() != 0) filled.initialize = fill_keyed;
    expect_error([&] {
      ld::FullyShardedModule f(model.ptr(), units, std::make_shared<lo::AdamW>(params), comm_ptr(), filled);
    }, "FullyShardedModule: the ranks disagree on FullyShardedOptions::initialize (set or not): rank 0 has 0");
  }
  // An initialize that throws on the last rank: every rank refuses, naming it, and no parameter changed.
  {
    std::vector<at::Tensor> before;
    for (const at::Tensor& p : params) before.push_back(p.detach().clone());
    std::vector<const void*> data;
    for (const at::Tensor& p : params) data.push_back(p.data_ptr());
    const int last = comm().size() - 1;
    ld::FullyShardedOptions throwing;
    throwing.initialize = [last](const std::string& name, const at::Tensor& p, int64_t first, const at::Tensor& values) {
      TORCH_CHECK(comm().rank() != last, "no values for ", name);
      fill_keyed(name, p, first, values);
    };
    const std::string mine = c10::str("initialize failed on rank ", last, ": no values for unit");
    expect_error([&] {
      ld::FullyShardedModule f(model.ptr(), units, std::make_shared<lo::AdamW>(params), comm_ptr(), throwing);
    }, comm().rank() == last ? mine : "initialize failed on 1 other rank(s) (nothing was changed)");
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_EQ(params[k].data_ptr(), data[k]) << "parameter " << k;
      EXPECT_TRUE(bitwise_equal(params[k], before[k])) << "parameter " << k;
    }
  }
  ld::FullyShardedModule fsdp(model.ptr(), units, std::make_shared<lo::AdamW>(params), comm_ptr());
  expect_error([&] { fsdp.unit(0, [] { return at::Tensor(); }); }, "unit(0) outside forward()");
  expect_error([&] {
    fsdp.forward([&] { return fsdp.unit(7, [] { return at::Tensor(); }); });
  }, "unit 7 does not exist; there are 3");
  expect_error([&] { fsdp.gather(4); }, "unit 4 does not exist; there are 3 (and the root, 3)");
  expect_error([&] { fsdp.release(9); }, "unit 9 does not exist");
  // A load of files that are not there: refused on every rank, the shards as they were.
  fsdp.gather_all();
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : params) before.push_back(p.detach().clone());
  fsdp.release_all();
  expect_error([&] { fsdp.load("fsdp_does_not_exist"); }, "no fragment files");
  fsdp.gather_all();
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(bitwise_equal(params[k], before[k])) << "parameter " << k;
  fsdp.release_all();
  // The refused calls left the module usable.
  const at::Tensor loss = model->forward(fsdp, default_grad, comm().rank(), 1);
  loss.backward();
  fsdp.step();
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
}

// Resharding through checkpoints: ctest runs stage 0 on 3 ranks, 1 on 2, 2 as one unsharded
// process (load_fragments / save_fragments), 3 on 3 again (LOWBIT_FSDP_STAGE). Each stage starts
// from zeroed parameters (the weights must come from the files), steps twice and saves; each is
// compared with one process replaying every step from the start.
constexpr int kFsdpSchedule[] = {3, 2, 1, 3};

TEST(FsdpReshard, Stage) {
  const char* stage_env = std::getenv("LOWBIT_FSDP_STAGE");
  if (!stage_env) GTEST_SKIP() << "run by the distributed_fsdp_reshard_* ctest entries";
  const int stage = std::atoi(stage_env), world = comm().size(), rank = comm().rank();
  ASSERT_EQ(world, kFsdpSchedule[stage]) << "stage " << stage << " runs on " << kFsdpSchedule[stage] << " ranks";
  const auto make = [](std::vector<at::Tensor>& p) {
    return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).weight_decay(0.01).state_format(StateFormat::Q4));
  };
  std::vector<at::Tensor> ref_params = make_params(at::kFloat, device());
  auto ref = make(ref_params);
  for (int st = 0; st <= stage; ++st)
    for (int s = 2 * st + 1; s <= 2 * st + 2; ++s) {
      for (size_t k = 0; k < ref_params.size(); ++k)
        ref_params[k].mutable_grad() =
            mean_grad(kFsdpSchedule[st], s, static_cast<int>(k), ref_params[k].sizes(), at::kFloat).to(device());
      ref->step();
    }
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  if (stage > 0)
    for (at::Tensor& p : params) p.detach().zero_();
  const std::string previous = "fsdp_reshard_" + std::to_string(stage - 1), mine = "fsdp_reshard_" + std::to_string(stage);
  if (stage == 2) {  // one process, no module: the optimizer alone
    auto one = make(params);
    ld::load_fragments(*one, previous);
    for (int s = 5; s <= 6; ++s) {
      for (size_t k = 0; k < params.size(); ++k)
        params[k].mutable_grad() = rank_grad(0, s, static_cast<int>(k), params[k].sizes(), at::kFloat).to(device());
      one->step();
    }
    for (size_t k = 0; k < params.size(); ++k) {
      EXPECT_TRUE(bitwise_equal(params[k], ref_params[k])) << "parameter " << k;
      std::vector<at::Tensor> a, b;
      lowbit::optim::append_state_range(*one->state_of(params[k]), 0, params[k].numel(), a);
      lowbit::optim::append_state_range(*ref->state_of(ref_params[k]), 0, params[k].numel(), b);
      ASSERT_EQ(a.size(), b.size());
      for (size_t t = 0; t < a.size(); ++t) EXPECT_TRUE(bitwise_equal(a[t], b[t])) << "parameter " << k << " state " << t;
    }
    ld::save_fragments(*one, mine);
    return;
  }
  CraftedModel model(params);
  ld::FullyShardedModule fsdp(model.ptr(), model->unit_modules(), make(params), comm_ptr());
  if (stage > 0) fsdp.load(previous);
  for (int s = 2 * stage + 1; s <= 2 * stage + 2; ++s) {
    fsdp.zero_grad();
    model->forward(fsdp, default_grad, rank, s).backward();
    fsdp.step();
  }
  fsdp.gather_all();
  expect_same_as(fsdp.sharded(), params, *ref, ref_params);
  fsdp.release_all();
  fsdp.save(mine);
}

}  // namespace
}  // namespace lowbit_test
