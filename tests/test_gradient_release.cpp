// Gradient release (optim/gradient_release.h): stepping each parameter from its post-accumulate
// hook during backward() gives every parameter and state the bits of backward() + step(), frees the
// gradients, accumulates over micro-batches on request, and refuses global-norm clipping.
#include <sstream>

#include "rule_cases.h"
#include "tied_net.h"
#include "test_util.h"

namespace {

using namespace lowbit_test;
namespace lo = lowbit::optim;

using Net = TiedNet;

struct Trained {
  std::shared_ptr<Net> net;
  std::vector<at::Tensor> params;
  std::unique_ptr<lo::LowbitOptimizer> opt;
};

Trained make(const RuleCase& rc, StateFormat f) {
  torch::manual_seed(21);
  Trained t;
  t.net = std::make_shared<Net>();
  t.params = t.net->parameters();
  t.opt = rc.make(t.params, f, false);
  return t;
}


void expect_same(const Trained& a, const Trained& b) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_TRUE(bitwise_equal(a.params[i].detach(), b.params[i].detach())) << "parameter " << i;
    const auto sa = a.opt->export_state_fp32(a.params[i]), sb = b.opt->export_state_fp32(b.params[i]);
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t k = 0; k < sa.size(); ++k)
      if (sa[k].defined()) ASSERT_TRUE(bitwise_equal(sa[k], sb[k])) << "parameter " << i << " slot " << k;
  }
}

TEST(GradientRelease, EqualsBackwardThenStepForEveryRuleAndFormat) {
  for (const RuleCase& rc : rule_cases()) {
    for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4}) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      Trained a = make(rc, f), b = make(rc, f);
      lo::GradientRelease release(*b.opt);
      for (int64_t s = 0; s < 4; ++s) {
        a.opt->zero_grad();
        loss_of(*a.net, s).backward();
        a.opt->step();
        loss_of(*b.net, s).backward();
        int kept = 0;
        for (const auto& p : b.params) kept += p.grad().defined();
        ASSERT_EQ(kept, 0) << "gradients kept after " << release.released() << " releases of "
                           << (s + 1) * b.params.size();
      }
      EXPECT_EQ(release.released(), static_cast<int64_t>(4 * b.params.size()));
      expect_same(a, b);
    }
  }
}

TEST(GradientRelease, AccumulatesMicroBatchesAndReleasesOnTheLast) {
  const RuleCase rc = rule_cases()[1];  // AdamW
  Trained a = make(rc, StateFormat::Q8), b = make(rc, StateFormat::Q8);
  lo::GradientRelease release(*b.opt);
  for (int64_t s = 0; s < 3; ++s) {
    a.opt->zero_grad();
    for (int64_t m = 0; m < 3; ++m) loss_of(*a.net, 10 * s + m).backward();
    a.opt->step();
    for (int64_t m = 0; m < 3; ++m) {
      release.set_accumulating(m < 2);
      loss_of(*b.net, 10 * s + m).backward();
      if (m < 2) ASSERT_TRUE(b.params[0].grad().defined());
    }
    ASSERT_FALSE(b.params[0].grad().defined());
  }
  expect_same(a, b);
}

TEST(GradientRelease, SchedulersAndCheckpointsWorkAsBefore) {
  const RuleCase rc = rule_cases()[0];  // Adam
  Trained a = make(rc, StateFormat::Q8), b = make(rc, StateFormat::Q8);
  lo::GradientRelease release(*b.opt);
  torch::optim::StepLR sa(*a.opt, 1, 0.5), sb(*b.opt, 1, 0.5);
  for (int64_t s = 0; s < 3; ++s) {
    a.opt->zero_grad();
    loss_of(*a.net, s).backward();
    a.opt->step();
    sa.step();
    loss_of(*b.net, s).backward();
    sb.step();
  }
  expect_same(a, b);
  std::stringstream ca, cb;
  torch::serialize::OutputArchive oa, ob;
  a.opt->save(oa);
  b.opt->save(ob);
  oa.save_to(ca);
  ob.save_to(cb);
  EXPECT_EQ(ca.str().size(), cb.str().size());
}

TEST(GradientRelease, NonFiniteGradientSkipsOnlyThatParameter) {
  const RuleCase rc = rule_cases()[1];
  Trained b = make(rc, StateFormat::Q8);
  lo::GradientRelease release(*b.opt);
  loss_of(*b.net, 0).backward();
  std::vector<at::Tensor> before;
  for (const auto& p : b.params) before.push_back(p.detach().clone());
  // A hook that poisons fc1's weight gradient before it is accumulated.
  b.net->fc1->weight.register_hook([](at::Tensor g) { return g * std::numeric_limits<float>::infinity(); });
  loss_of(*b.net, 1).backward();
  EXPECT_TRUE(bitwise_equal(b.net->fc1->weight.detach(), before[0]));
  EXPECT_FALSE(bitwise_equal(b.net->fc1->bias.detach(), before[1]));
  EXPECT_EQ(b.opt->skipped_steps(), 1);
}

// step_parameters with the non-finite check made elsewhere (host offload makes it on the gradient's
// device): the flag decides the skip in place of a read of the gradient, and a malformed flag is
// refused, naming it, with nothing changed.
TEST(GradientRelease, StepParametersTakesTheNonFiniteFlagMadeElsewhere) {
  torch::manual_seed(5);
  std::vector<at::Tensor> p = {torch::randn({300}).requires_grad_(), torch::randn({4096}).requires_grad_()};
  lo::AdamW opt(p, lo::AdamWOptions(1e-2));
  for (auto& q : p) q.mutable_grad() = torch::randn_like(q);
  const at::Tensor before0 = p[0].detach().clone(), before1 = p[1].detach().clone();
  // Flagged: skipped (finite gradient, so only the flag can have said so).
  opt.step_parameters({p[0]}, torch::ones({1}));
  EXPECT_TRUE(bitwise_equal(p[0].detach(), before0));
  EXPECT_EQ(opt.skipped_steps(), 1);
  EXPECT_EQ(opt.state_of(p[0]), nullptr);
  // Not flagged: stepped as step_parameters alone steps it.
  opt.step_parameters({p[0]}, torch::zeros({1}));
  EXPECT_FALSE(bitwise_equal(p[0].detach(), before0));
  EXPECT_EQ(opt.skipped_steps(), 1);
  for (const at::Tensor& bad : {torch::zeros({2}), torch::zeros({1}, torch::kDouble)}) {
    try {
      opt.step_parameters({p[1]}, bad);
      ADD_FAILURE() << "a malformed flag was accepted";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("found_inf"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(bitwise_equal(p[1].detach(), before1));
    EXPECT_EQ(opt.state_of(p[1]), nullptr);
  }
  // The same step as without a flag.
  lo::AdamW ref(std::vector<at::Tensor>{before1.clone().requires_grad_()}, lo::AdamWOptions(1e-2));
  ref.param_groups()[0].params()[0].mutable_grad() = p[1].grad().clone();
  ref.step();
  opt.step_parameters({p[1]}, torch::zeros({1}));
  EXPECT_TRUE(bitwise_equal(p[1].detach(), ref.param_groups()[0].params()[0].detach()));
}

TEST(GradientRelease, RefusesClippingAndASecondRelease) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto params = net->parameters();
  lo::AdamW clipped(params, lo::AdamWOptions().max_grad_norm(1.0));
  try {
    lo::GradientRelease r(clipped);
    FAIL() << "clipping was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_grad_norm"), std::string::npos) << e.what();
  }
  lo::AdamW opt(params, lo::AdamWOptions());
  lo::GradientRelease first(opt);
  try {
    lo::GradientRelease second(opt);
    FAIL() << "two releases on one parameter";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("already has a post-accumulate-grad hook"), std::string::npos) << e.what();
  }
}

TEST(GradientRelease, RemovingTheReleaseRestoresPlainBackward) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto params = net->parameters();
  lo::AdamW opt(params, lo::AdamWOptions());
  { lo::GradientRelease r(opt); }
  loss_of(*net, 0).backward();
  for (const auto& p : params) EXPECT_TRUE(p.grad().defined());
}

// step_parameters finds its parameters through an index of positions; groups that change between
// calls (a group added, a parameter replaced) must be found again, and a step of a few parameters
// gives each the bits a whole step gives it.
TEST(GradientRelease, StepParametersFollowsGroupsThatChange) {
  torch::manual_seed(3);
  const auto fresh = [] { return std::vector<at::Tensor>{torch::randn({7, 5}).requires_grad_(), torch::randn({33}).requires_grad_(),
                                                         torch::randn({4, 4}).requires_grad_()}; };
  std::vector<at::Tensor> a = fresh(), b = {a[0].detach().clone().requires_grad_(), a[1].detach().clone().requires_grad_(),
                                            a[2].detach().clone().requires_grad_()};
  const auto give_grads = [](std::vector<at::Tensor>& ps, int64_t s) {
    for (size_t i = 0; i < ps.size(); ++i) {
      torch::manual_seed(100 * s + static_cast<int64_t>(i));
      ps[i].mutable_grad() = torch::randn(ps[i].sizes());
    }
  };
  lo::AdamW whole(std::vector<at::Tensor>{a[0], a[1]}, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  lo::AdamW parts(std::vector<at::Tensor>{b[0], b[1]}, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  for (int64_t s = 0; s < 4; ++s) {
    if (s == 2) {  // a group added between steps: its parameter must be found
      whole.add_param_group(torch::optim::OptimizerParamGroup({a[2]}));
      parts.add_param_group(torch::optim::OptimizerParamGroup({b[2]}));
    }
    give_grads(a, s);
    give_grads(b, s);
    if (s < 2) { a[2].mutable_grad().reset(); b[2].mutable_grad().reset(); }
    whole.step();
    for (size_t i = b.size(); i-- > 0;) parts.step_parameters({b[i]});  // last first: the order does not matter
    parts.step_parameters({torch::randn({3}).requires_grad_()});  // not a parameter: nothing
    for (size_t i = 0; i < a.size(); ++i) ASSERT_TRUE(bitwise_equal(a[i].detach(), b[i].detach())) << "step " << s << " parameter " << i;
  }
  // A parameter swapped for another tensor in place: the old one is no parameter any more (its
  // position now holds the new one, which must not be stepped in its name).
  at::Tensor swapped = b[1].detach().clone().requires_grad_();
  parts.param_groups()[0].params()[1] = swapped;
  swapped.mutable_grad() = torch::ones({33});
  b[1].mutable_grad() = torch::ones({33});
  const at::Tensor before = swapped.detach().clone();
  parts.step_parameters({b[1]});
  EXPECT_TRUE(bitwise_equal(swapped.detach(), before)) << "a tensor that left the groups stepped what took its place";
  parts.step_parameters({swapped});
  EXPECT_FALSE(bitwise_equal(swapped.detach(), before)) << "the new parameter was not found";
}

}  // namespace
