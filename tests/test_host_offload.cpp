// Host offload (optim/host_offload.h): each parameter's gradient goes to a host copy and is stepped
// there by a host thread during backward(); the weights come back. Most tests here use the CPU as
// the "device" (the hooks, the host thread, the staging buffers, the version check and the host
// copies are the same code); the last runs on a GPU where one is visible (the copy streams, pinned
// memory, events). Every result is compared bit for bit with the optimizer stepping the model's own
// parameters (on a GPU: the CUDA step against the CPU's, the same bits by design).
#include <sstream>
#include <thread>

#include "rule_cases.h"
#include "tied_net.h"
#include "test_util.h"

namespace {

using namespace lowbit_test;
namespace lo = lowbit::optim;

using Net = TiedNet;

struct Model {
  std::shared_ptr<Net> net;
  std::vector<at::Tensor> params;
  std::unique_ptr<lo::LowbitOptimizer> opt;
};

Model make(const RuleCase& rc, StateFormat f, at::ScalarType dtype = at::kFloat, int64_t master_bits = 0,
           at::Device device = at::kCPU) {
  torch::manual_seed(21);
  Model m;
  m.net = std::make_shared<Net>();
  m.net->to(device, dtype);
  m.params = m.net->parameters();
  m.opt = rc.make(m.params, f, dtype == at::kBFloat16 && master_bits == 0);  // SR or a correction
  if (master_bits) set_master_bits(*m.opt, master_bits);
  return m;
}


// `b` is offloaded through `off`; `a` steps its own parameters. With stage_weights the host
// parameters lie in the staging buffers, which later parameters overwrote: each is given its
// weights again to read its master weights.
void expect_same(const Model& a, const Model& b, const lo::HostOffload& off, bool staged = false) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_TRUE(bitwise_equal(a.params[i].detach(), b.params[i].detach())) << "parameter " << i;
    const at::Tensor& host = off.host_param(b.params[i]);
    if (staged) {
      torch::NoGradGuard no_grad;
      host.detach().copy_(b.params[i].detach());
    }
    ASSERT_TRUE(bitwise_equal(host.detach(), b.params[i].detach())) << "host copy of parameter " << i;
    const auto sa = a.opt->export_state_fp32(a.params[i]), sb = b.opt->export_state_fp32(host);
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t k = 0; k < sa.size(); ++k)
      if (sa[k].defined()) ASSERT_TRUE(bitwise_equal(sa[k], sb[k])) << "parameter " << i << " slot " << k;
    ASSERT_TRUE(bitwise_equal(a.opt->export_master_fp32(a.params[i]), b.opt->export_master_fp32(host)))
        << "master weights of parameter " << i;
  }
}

void train(Model& a, Model& b, lo::HostOffload& off, int64_t steps, int64_t first_batch = 0) {
  for (int64_t s = first_batch; s < first_batch + steps; ++s) {
    a.opt->zero_grad();
    loss_of(*a.net, s).backward();
    a.opt->step();
    loss_of(*b.net, s).backward();
    for (size_t i = 0; i < b.params.size(); ++i) ASSERT_FALSE(b.params[i].grad().defined()) << "gradient " << i << " kept";
    off.step();
  }
}

TEST(HostOffload, EqualsTheOptimizerOnTheModelForEveryRuleAndFormat) {
  for (const RuleCase& rc : rule_cases()) {
    for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4}) {
      for (bool staged : {false, true}) {
        SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f) + (staged ? " stage_weights" : ""));
        Model a = make(rc, f), b = make(rc, f);
        lo::HostOffload off(*b.opt, lo::HostOffloadOptions().stage_weights(staged));
        train(a, b, off, 4);
        EXPECT_EQ(off.released(), static_cast<int64_t>(4 * b.params.size()));
        expect_same(a, b, off, staged);
        int64_t bytes = 0, largest = 0;
        for (const auto& p : b.params) {
          bytes += p.numel() * 4;
          largest = std::max<int64_t>(largest, p.numel() * 4);
        }
        const lo::HostOffloadStats st = off.stats();
        EXPECT_EQ(st.steps, 4);
        EXPECT_EQ(st.host_steps, off.released());
        EXPECT_EQ(st.bytes_to_host, (staged ? 8 : 4) * bytes);  // staged: the weights with every gradient
        EXPECT_EQ(st.bytes_to_device, 4 * bytes);
        EXPECT_GT(st.host_step_s, 0.0);
        // Staged: no host copy of the weights, only the 4 staging buffers (a gradient and weights
        // each; the arena rounds its one slab up to a power of two).
        const int64_t buffers = 4 * 2 * (largest + 256);
        if (staged) EXPECT_LE(off.host_bytes(), 2 * buffers);
        else EXPECT_GE(off.host_bytes(), bytes + buffers / 2);
      }
    }
  }
}

TEST(HostOffload, Bf16WeightsWithMasterCorrectionAndStochasticRounding) {
  for (const RuleCase& rc : {rule_cases()[1], rule_cases()[3], rule_cases()[7]}) {  // AdamW, Lion, LAMB
    SCOPED_TRACE(rc.name);
    Model a = make(rc, StateFormat::Q8, at::kBFloat16, 24), b = make(rc, StateFormat::Q8, at::kBFloat16, 24);
    lo::HostOffload off(*b.opt, lo::HostOffloadOptions().staging_buffers(1));  // every hook waits for the last step
    train(a, b, off, 3);
    expect_same(a, b, off);
    // Staged weights through one buffer: each parameter's weights overwrite the last one's.
    Model e = make(rc, StateFormat::Q8, at::kBFloat16, 24);
    lo::HostOffload off_staged(*e.opt, lo::HostOffloadOptions().staging_buffers(1).stage_weights(true));
    Model a2 = make(rc, StateFormat::Q8, at::kBFloat16, 24);
    train(a2, e, off_staged, 3);
    expect_same(a2, e, off_staged, true);
    Model c = make(rc, StateFormat::Q4, at::kBFloat16), d = make(rc, StateFormat::Q4, at::kBFloat16);
    lo::HostOffload off_sr(*d.opt);
    train(c, d, off_sr, 3);
    expect_same(c, d, off_sr);
  }
}

TEST(HostOffload, AccumulatesMicroBatchesAndReleasesOnTheLast) {
  const RuleCase rc = rule_cases()[1];
  Model a = make(rc, StateFormat::Q8), b = make(rc, StateFormat::Q8);
  lo::HostOffload off(*b.opt);
  for (int64_t s = 0; s < 3; ++s) {
    a.opt->zero_grad();
    for (int64_t m = 0; m < 3; ++m) loss_of(*a.net, 10 * s + m).backward();
    a.opt->step();
    for (int64_t m = 0; m < 3; ++m) {
      off.set_accumulating(m < 2);
      loss_of(*b.net, 10 * s + m).backward();
      ASSERT_EQ(b.params[0].grad().defined(), m < 2);
    }
    off.step();
  }
  expect_same(a, b, off);
}

// Per parameter, as gradient release: a non-finite gradient leaves that parameter and its state as
// they were and counts one skip; the others step.
TEST(HostOffload, NonFiniteGradientSkipsOnlyThatParameterAsGradientReleaseDoes) {
  const RuleCase rc = rule_cases()[0];
  Model a = make(rc, StateFormat::Q8), b = make(rc, StateFormat::Q8);
  lo::GradientRelease release(*a.opt);
  lo::HostOffload off(*b.opt);
  for (Model* m : {&a, &b})  // every second gradient of fc1's weight made infinite
    m->net->fc1->weight.register_hook([calls = std::make_shared<int>(0)](at::Tensor g) {
      return ++*calls % 2 == 0 ? g * std::numeric_limits<float>::infinity() : g;
    });
  for (int64_t s = 0; s < 4; ++s) {
    loss_of(*a.net, s).backward();
    loss_of(*b.net, s).backward();
    off.step();
  }
  expect_same(a, b, off);
  EXPECT_EQ(b.opt->skipped_steps(), 2);
}

// With staged weights too: the host parameters then lie in the staging buffers, which a checkpoint
// never reads (it holds state, not weights).
void checkpoints_move(bool staged) {
  const RuleCase rc = rule_cases()[1];
  const lo::HostOffloadOptions options = lo::HostOffloadOptions().stage_weights(staged);
  Model a = make(rc, StateFormat::Q4), b = make(rc, StateFormat::Q4);
  auto off = std::make_unique<lo::HostOffload>(*b.opt, options);
  train(a, b, *off, 2);
  // The offloaded optimizer's checkpoint into a fresh plain one (and the weights with it), then both go on.
  std::stringstream saved;
  {
    torch::serialize::OutputArchive out;
    b.opt->save(out);
    out.save_to(saved);
  }
  Model c = make(rc, StateFormat::Q4);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < c.params.size(); ++i) c.params[i].copy_(b.params[i]);
    torch::serialize::InputArchive in;
    in.load_from(saved);
    c.opt->load(in);
  }
  // A plain checkpoint into a fresh offloaded optimizer, whose model gets its weights after the
  // offload was made (noticed by their version counter).
  std::stringstream plain;
  {
    torch::serialize::OutputArchive out;
    a.opt->save(out);
    out.save_to(plain);
  }
  Model d = make(rc, StateFormat::Q4);
  lo::HostOffload off_d(*d.opt, options);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < d.params.size(); ++i) d.params[i].copy_(a.params[i]);
    torch::serialize::InputArchive in;
    in.load_from(plain);
    d.opt->load(in);
  }
  train(a, b, *off, 2, 2);
  train(c, d, off_d, 2, 2);
  expect_same(a, b, *off, staged);
  expect_same(c, d, off_d, staged);
  for (size_t i = 0; i < a.params.size(); ++i) ASSERT_TRUE(bitwise_equal(a.params[i].detach(), c.params[i].detach()));
}

TEST(HostOffload, CheckpointsMoveBetweenOffloadedAndPlainOptimizers) {
  for (bool staged : {false, true}) {
    SCOPED_TRACE(staged ? "stage_weights" : "weights on the host");
    checkpoints_move(staged);
  }
}

TEST(HostOffload, WeightsChangedOnTheDeviceArePulledBeforeTheNextStep) {
  const RuleCase rc = rule_cases()[1];
  {  // staged weights: every step takes the device's
    Model a = make(rc, StateFormat::Q8), b = make(rc, StateFormat::Q8);
    lo::HostOffload off(*b.opt, lo::HostOffloadOptions().stage_weights(true));
    train(a, b, off, 2);
    {
      torch::NoGradGuard no_grad;
      a.params[2].mul_(0.5);
      b.params[2].mul_(0.5);
    }
    train(a, b, off, 2, 2);
    expect_same(a, b, off, true);
  }
  Model a = make(rc, StateFormat::Q8), b = make(rc, StateFormat::Q8);
  lo::HostOffload off(*b.opt);
  train(a, b, off, 2);
  {
    torch::NoGradGuard no_grad;
    a.params[2].mul_(0.5);
    b.params[2].mul_(0.5);  // the model's weight edited in place; its host copy is now stale
  }
  train(a, b, off, 2, 2);
  expect_same(a, b, off);
  {
    torch::NoGradGuard no_grad;
    a.params[0].add_(1.0);
    b.params[0].add_(1.0);
  }
  off.pull_weights();
  EXPECT_TRUE(bitwise_equal(off.host_param(b.params[0]).detach(), b.params[0].detach()));
}

TEST(HostOffload, RefusesClippingStateAlreadyHeldAndASecondGradientBeforeStep) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto params = net->parameters();
  const auto expect_error = [](const std::function<void()>& f, const std::string& says) {
    try {
      f();
      ADD_FAILURE() << "accepted; expected an error saying " << says;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  lo::AdamW clipped(params, lo::AdamWOptions().max_grad_norm(1.0));
  expect_error([&] { lo::HostOffload off(clipped); }, "max_grad_norm");
  lo::AdamW opt(params, lo::AdamWOptions());
  expect_error([&] { lo::HostOffload off(opt, lo::HostOffloadOptions().staging_buffers(0)); }, "staging_buffers");
  expect_error([&] { lo::HostOffload off(opt, lo::HostOffloadOptions().host_threads(-1)); }, "host_threads");
  loss_of(*net, 0).backward();
  opt.step();
  expect_error([&] { lo::HostOffload off(opt); }, "holds optimizer state already");
  // The refused offloads changed nothing: the optimizer still steps the model's own parameters.
  for (size_t i = 0; i < params.size(); ++i) EXPECT_NE(opt.state_of(params[i]), nullptr) << i;

  lo::AdamW fresh(params, lo::AdamWOptions()), other(params, lo::AdamWOptions());
  lo::HostOffload off(fresh);
  // A second offload of the same model: its hooks are taken.
  expect_error([&] { lo::HostOffload second(other); }, "already has a post-accumulate-grad hook");
  loss_of(*net, 1).backward();
  expect_error([&] { loss_of(*net, 2).backward(); }, "got a second gradient before step()");
}

TEST(HostOffload, AnErrorOfAHostStepComesOutOfStep) {
  torch::manual_seed(0);
  auto net = std::make_shared<Net>();
  auto params = net->parameters();
  lo::AdamW opt(params, lo::AdamWOptions().state_format(StateFormat::Q8));
  lo::HostOffload off(opt);
  loss_of(*net, 0).backward();
  off.step();
  // A group option that only the step checks: the next host step refuses it; step() says so.
  static_cast<lo::AdamWOptions&>(opt.param_groups()[0].options()).betas({1.5, 0.999});
  loss_of(*net, 1).backward();
  try {
    off.step();
    FAIL() << "the host step's error was lost";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("beta"), std::string::npos) << e.what();
  }
  static_cast<lo::AdamWOptions&>(opt.param_groups()[0].options()).betas({0.9, 0.999});
  loss_of(*net, 2).backward();
  off.step();  // recovered
}

// The host thread sets its own OpenMP thread count and nothing the process shares: a thread started
// after it ran takes the count it took before. (With at::set_num_threads there, the host thread also
// set ATen's process-wide count and MKL's dynamic threading, at a moment of its own: the caller's
// first matrix products came out in either setting's bits, and the tests above failed now and then.)
// And it keeps its count where the process has one set: ATen's per-thread start-up, at that thread's
// first parallel op, applies the process's count.
TEST(HostOffload, TheHostThreadCountIsItsOwn) {
  const auto new_thread_count = [] {
    int n = 0;
    std::thread([&n] { n = at::get_num_threads(); }).join();
    return n;
  };
  const int before = new_thread_count();
  at::set_num_threads(before);  // a count set for the process, as a user may: the host thread keeps its own
  torch::manual_seed(0);
  // Large enough that copying it back is a parallel op of ATen's (past its grain of 32768).
  std::vector<at::Tensor> params{torch::randn({1 << 16}).requires_grad_()};
  lo::AdamW opt(params, lo::AdamWOptions().state_format(StateFormat::Q8));
  lo::HostOffload off(opt, lo::HostOffloadOptions().host_threads(before + 1));
  for (int64_t s = 0; s < 2; ++s) {  // the second step after ATen's first parallel ops on that thread
    (params[0] * params[0]).sum().backward();
    off.step();
  }
  EXPECT_EQ(off.stats().host_steps, 2);
  EXPECT_EQ(off.stats().host_threads, before + 1);
  EXPECT_EQ(new_thread_count(), before);
}

TEST(HostOffload, OnAGpuEqualsTheGpuStepAndHoldsOnlyTheGradientsInFlight) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const at::Device cuda(at::kCUDA, 0);
  for (const RuleCase& rc : {rule_cases()[1], rule_cases()[7]}) {  // AdamW, LAMB
    for (int64_t bits : {0, 24}) {
      SCOPED_TRACE(std::string(rc.name) + (bits ? " bf16 + 24-bit master, Q8" : " fp32, Q4"));
      const at::ScalarType dtype = bits ? at::kBFloat16 : at::kFloat;
      const StateFormat f = bits ? StateFormat::Q8 : StateFormat::Q4;
      Model a = make(rc, f, dtype, bits, cuda), b = make(rc, f, dtype, bits, cuda);
      lo::HostOffload off(*b.opt, lo::HostOffloadOptions().staging_buffers(2));
      for (const auto& p : b.params) ASSERT_TRUE(off.host_param(p).is_pinned());
      train(a, b, off, 3);
      EXPECT_LE(off.peak_gradients_in_flight(), 2);
      EXPECT_GE(off.peak_gradients_in_flight(), 1);
      expect_same(a, b, off);
      for (const auto& p : b.params) EXPECT_EQ(b.opt->state_of(p), nullptr) << "state on the device";
      // Staged weights, two buffers taking turns: a buffer's next weights wait for its last ones' copy back.
      Model c = make(rc, f, dtype, bits, cuda), d = make(rc, f, dtype, bits, cuda);
      lo::HostOffload staged(*d.opt, lo::HostOffloadOptions().staging_buffers(2).stage_weights(true));
      for (const auto& p : d.params) ASSERT_TRUE(staged.host_param(p).is_pinned());
      train(c, d, staged, 3);
      expect_same(c, d, staged, true);
      // No host copy of the weights: only the two buffers (a gradient and weights each; the arena
      // rounds its slab up to a power of two, as the pinned allocator would).
      int64_t largest = 0;
      for (const auto& p : d.params) largest = std::max<int64_t>(largest, p.numel() * p.element_size());
      EXPECT_LE(staged.host_bytes(), 2 * (2 * 2 * (largest + 256)));
    }
  }
}

}  // namespace
