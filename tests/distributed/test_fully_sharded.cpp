// FullyShardedModule against one unsharded process fed the averaged gradients: parameters and every
// rank's state bit for bit (every rule and state format, bf16 with stochastic rounding or a master
// correction, clipping and the non-finite skip, micro-batches, parameters a rank does not use),
// memory released where the module says, and its misuses as clear errors.
#include "dist_util.h"

#include <torch/torch.h>

namespace lowbit_test {
namespace {

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
};

// Trains the crafted model fully sharded and one process on the mean gradients; compares.
void expect_fsdp_same_as_one_process(const Factory& make, at::ScalarType dtype, const FsdpRun& run = {}) {
  const int rank = comm().rank(), world = comm().size();
  std::vector<at::Tensor> params = make_params(dtype, device()), ref_params = make_params(dtype, device());
  CraftedModel model(params);
  std::shared_ptr<lo::LowbitOptimizer> inner(make(params).release());
  std::unique_ptr<lo::LowbitOptimizer> ref = make(ref_params);
  ld::FullyShardedModule fsdp(model.ptr(), model->unit_modules(), inner, comm_ptr(), run.options);
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
    }
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor sum = at::zeros(params[k].sizes(), at::kFloat);
      bool any = false;
      for (int r = 0; r < world; ++r)
        for (int mb = 0; mb < run.micro_batches; ++mb) {
          const at::Tensor g = run.grad(r, 10 * s + mb, static_cast<int>(k), params[k].sizes(), dtype);
          if (!g.defined()) continue;
          sum += g.to(at::kFloat);
          any = true;
        }
      ref_params[k].mutable_grad() = any ? (sum / world).to(dtype).to(device()) : at::Tensor();
    }
    fsdp.step();
    ref->step();
    EXPECT_EQ(fsdp.gathered_bytes(), 0) << "step " << s;
  }
  fsdp.gather_all();
  expect_same_as(fsdp.sharded(), params, *ref, ref_params);
  fsdp.release_all();
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
}

TEST(FullyShardedModule, InvalidUsesAreClearErrors) {
  const auto expect_error = [](const std::function<void()>& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one containing: " << part;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  CraftedModel model(params);
  auto units = model->unit_modules();
  // A parameter in two units (unit 0 given twice).
  expect_error([&] {
    ld::FullyShardedModule f(model.ptr(), {units[0], units[0]}, std::make_shared<lo::AdamW>(params), comm_ptr());
  }, "parameter 'unit0.p0' is in unit 0 and in unit 1");
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
  }
  ld::FullyShardedModule fsdp(model.ptr(), units, std::make_shared<lo::AdamW>(params), comm_ptr());
  expect_error([&] { fsdp.unit(0, [] { return at::Tensor(); }); }, "unit(0) outside forward()");
  expect_error([&] {
    fsdp.forward([&] { return fsdp.unit(7, [] { return at::Tensor(); }); });
  }, "unit 7 does not exist; there are 3");
  // The refused calls left the module usable.
  const at::Tensor loss = model->forward(fsdp, default_grad, comm().rank(), 1);
  loss.backward();
  fsdp.step();
  EXPECT_EQ(fsdp.gathered_bytes(), 0);
}

}  // namespace
}  // namespace lowbit_test
