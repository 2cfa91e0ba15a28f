// Optimizers: FP32 state against libtorch's optimizers and fp64 loops, quantized state fused ==
// reference bit for bit, skipping, accounting, thread-count independence, groups and schedulers.
#include <omp.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include <lowbit/optim/step_testing.h>
#include <lowbit/tensors/optim_ops.h>

#include "test_util.h"

using lowbit::StateFormat;
namespace lo = lowbit::optim;

namespace {

const auto& kAllFormats = lowbit::kAllStateFormats;

// Parameters of odd sizes: one below min_quant_numel (FP32 state), two above (one not a multiple
// of any block), one 2-D.
std::vector<at::Tensor> make_params(at::ScalarType dt = at::kFloat) {
  return {at::randn({5000}).to(dt), at::randn({1000}).to(dt), at::randn({70001}).to(dt),
          at::randn({129, 65}).to(dt)};
}

// The message of the c10::Error that f throws ("" if none).
std::string error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return std::string(e.what_without_backtrace());
  }
  return std::string();
}

std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.detach().clone());
  return out;
}

void set_grads(std::vector<at::Tensor>& ps, const std::vector<at::Tensor>& gs) {
  for (size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = gs[i].clone();
}

std::vector<at::Tensor> random_grads(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> gs;
  for (const auto& p : ps) gs.push_back((at::randn(p.sizes()) * 0.1).to(p.scalar_type()));
  return gs;
}

// Largest ||a - b|| / ||b|| over the parameters.
double max_rel_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const at::Tensor x = a[i].to(at::kDouble), y = b[i].to(at::kDouble);
    worst = std::max(worst, ((x - y).norm() / y.norm()).item<double>());
  }
  return worst;
}

bool all_bitwise_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!lowbit_test::bitwise_equal(a[i], b[i])) return false;
  return true;
}

// Runs `steps` steps of two optimizers on cloned parameters with the same gradients.
template <typename MakeA, typename MakeB>
void run_pair(MakeA make_a, MakeB make_b, int steps, std::vector<at::Tensor>& pa, std::vector<at::Tensor>& pb) {
  auto a = make_a(pa);
  auto b = make_b(pb);
  for (int s = 0; s < steps; ++s) {
    const auto gs = random_grads(pa);
    set_grads(pa, gs);
    set_grads(pb, gs);
    a->step();
    b->step();
  }
}

}  // namespace

// ---- FP32 state against libtorch ----------------------------------------------------------------

TEST(OptimFP32, MatchesLibtorchOver100Steps) {
  struct Case {
    const char* name;
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>&)> ours, theirs;
  };
  const auto fp32 = StateFormat::FP32;
  std::vector<Case> cases = {
      {"Adam", [&](auto& p) { return std::make_unique<lo::Adam>(p, lo::AdamOptions(1e-2).weight_decay(0.01).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2).weight_decay(0.01)); }},
      {"Adam amsgrad", [&](auto& p) { return std::make_unique<lo::Adam>(p, lo::AdamOptions(1e-2).amsgrad(true).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2).amsgrad(true)); }},
      {"AdamW", [&](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).weight_decay(0.1).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1)); }},
      {"SGD nesterov", [&](auto& p) { return std::make_unique<lo::SGD>(p, lo::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3)); }},
      {"SGD dampening", [&](auto& p) { return std::make_unique<lo::SGD>(p, lo::SGDOptions(0.05).momentum(0.8).dampening(0.3).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.8).dampening(0.3)); }},
      {"SGD plain", [&](auto& p) { return std::make_unique<lo::SGD>(p, lo::SGDOptions(0.1).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1)); }},
      {"RMSprop centered momentum", [&](auto& p) { return std::make_unique<lo::RMSprop>(p, lo::RMSpropOptions(1e-3).centered(true).momentum(0.9).weight_decay(1e-2).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(1e-3).centered(true).momentum(0.9).weight_decay(1e-2)); }},
      {"RMSprop", [&](auto& p) { return std::make_unique<lo::RMSprop>(p, lo::RMSpropOptions(1e-3).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::RMSprop>(p, torch::optim::RMSpropOptions(1e-3)); }},
      {"Adagrad", [&](auto& p) { return std::make_unique<lo::Adagrad>(p, lo::AdagradOptions(0.05).lr_decay(0.01).initial_accumulator_value(0.1).weight_decay(1e-3).state_format(fp32)); },
       [](auto& p) { return std::make_unique<torch::optim::Adagrad>(p, torch::optim::AdagradOptions(0.05).lr_decay(0.01).initial_accumulator_value(0.1).weight_decay(1e-3)); }},
  };
  at::manual_seed(20261124);  // the same inputs every run: CI cannot meet a rare draw
  for (auto& c : cases) {
    auto pa = make_params(), pb = clone_all(pa);
    run_pair(c.ours, c.theirs, 100, pa, pb);
    // Centered RMSprop divides by sqrt(square_avg - grad_avg^2), a difference of two close
    // averages: torch's addcmul and our separate multiply and subtract round differently there,
    // and the cancellation amplifies it (seen: 1.95e-6 after 100 steps, about 1 run in 20). The
    // others differ by rounding order alone (seen up to 1.22e-6 for Adam, once in many runs).
    const double tol = std::string(c.name).find("centered") != std::string::npos ? 1e-5 : 2e-6;
    EXPECT_LE(max_rel_diff(pa, pb), tol) << c.name;
  }
}

// Lion and AdEMAMix have no libtorch counterpart: an fp64 loop written from the papers.
TEST(OptimFP32, LionAndAdEMAMixMatchFp64Loops) {
  const int steps = 100;
  auto p = make_params();
  std::vector<at::Tensor> p64, m, m2, v;
  for (auto& t : p) {
    p64.push_back(t.to(at::kDouble));
    m.push_back(at::zeros_like(p64.back()));
    m2.push_back(at::zeros_like(p64.back()));
    v.push_back(at::zeros_like(p64.back()));
  }
  lo::Lion lion(p, lo::LionOptions(1e-3).weight_decay(0.1).state_format(StateFormat::FP32));
  for (int s = 0; s < steps; ++s) {
    const auto gs = random_grads(p);
    set_grads(p, gs);
    lion.step();
    for (size_t i = 0; i < p.size(); ++i) {
      const at::Tensor g = gs[i].to(at::kDouble);
      const at::Tensor c = m[i] * 0.9 + g * 0.1;
      p64[i] = p64[i] * (1 - 1e-3 * 0.1) - 1e-3 * at::sign(c);
      m[i] = m[i] * 0.99 + g * 0.01;
    }
  }
  // sign() flips where c is within rounding of 0; allow a handful of lr-sized deviations.
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_LE((p[i].to(at::kDouble) - p64[i]).abs().max().item<double>(), 4 * 1e-3) << "Lion " << i;
  EXPECT_LE(max_rel_diff(p, p64), 1e-3);

  auto q = make_params();
  std::vector<at::Tensor> q64;
  for (size_t i = 0; i < q.size(); ++i) {
    q64.push_back(q[i].to(at::kDouble));
    m[i].zero_();
    m2[i].zero_();
    v[i].zero_();
  }
  const double b1 = 0.9, b2 = 0.999, b3 = 0.9999, alpha = 5, lr = 1e-3, wd = 0.01, eps = 1e-8;
  lo::AdEMAMix ad(q, lo::AdEMAMixOptions(lr).alpha(alpha).weight_decay(wd).state_format(StateFormat::FP32));
  for (int s = 1; s <= steps; ++s) {
    const auto gs = random_grads(q);
    set_grads(q, gs);
    ad.step();
    for (size_t i = 0; i < q.size(); ++i) {
      const at::Tensor g = gs[i].to(at::kDouble);
      m[i] = b1 * m[i] + (1 - b1) * g;
      m2[i] = b3 * m2[i] + (1 - b3) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const at::Tensor upd = (m[i] / (1 - std::pow(b1, s)) + alpha * m2[i]) / ((v[i] / (1 - std::pow(b2, s))).sqrt() + eps);
      q64[i] = q64[i] - lr * (upd + wd * q64[i]);
    }
  }
  EXPECT_LE(max_rel_diff(q, q64), 1e-5);

  // LAMB: the fp64 loop of the paper's update with the per-parameter trust ratio.
  auto r = make_params();
  std::vector<at::Tensor> r64;
  for (size_t i = 0; i < r.size(); ++i) {
    r64.push_back(r[i].to(at::kDouble));
    m[i].zero_();
    v[i].zero_();
  }
  lo::LAMB lamb(r, lo::LAMBOptions(1e-2).weight_decay(0.01).state_format(StateFormat::FP32));
  for (int s = 1; s <= steps; ++s) {
    const auto gs = random_grads(r);
    set_grads(r, gs);
    lamb.step();
    for (size_t i = 0; i < r.size(); ++i) {
      const at::Tensor g = gs[i].to(at::kDouble);
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const at::Tensor dir = (m[i] / (1 - std::pow(0.9, s))) / ((v[i] / (1 - std::pow(0.999, s))).sqrt() + 1e-6) + 0.01 * r64[i];
      const double trust = (r64[i].norm() / dir.norm()).item<double>();
      r64[i] = r64[i] - 1e-2 * trust * dir;
    }
  }
  EXPECT_LE(max_rel_diff(r, r64), 1e-5);
}

// ---- quantized state: fused kernel == ATen reference, bit for bit ------------------------------

TEST(OptimQuantized, FusedEqualsReferenceForEveryRuleAndFormat) {
  using Factory = std::function<std::unique_ptr<lo::LowbitOptimizer>(std::vector<at::Tensor>&, StateFormat)>;
  std::vector<std::pair<const char*, Factory>> rules = {
      {"Adam", [](auto& p, StateFormat f) { return std::make_unique<lo::Adam>(p, lo::AdamOptions(1e-2).weight_decay(1e-2).amsgrad(true).state_format(f)); }},
      {"AdamW", [](auto& p, StateFormat f) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(f)); }},
      // maximize and clipping change the gradient before the rule (the fused loop folds both into
      // one multiply); Adam without amsgrad takes the two-slot loop with L2 weight decay.
      {"AdamW maximize clip", [](auto& p, StateFormat f) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).maximize(true).max_grad_norm(0.5).state_format(f)); }},
      {"Adam maximize", [](auto& p, StateFormat f) { return std::make_unique<lo::Adam>(p, lo::AdamOptions(1e-2).weight_decay(1e-2).maximize(true).state_format(f)); }},
      {"SGD", [](auto& p, StateFormat f) { return std::make_unique<lo::SGD>(p, lo::SGDOptions(0.1).momentum(0.9).nesterov(true).state_format(f)); }},
      {"Lion", [](auto& p, StateFormat f) { return std::make_unique<lo::Lion>(p, lo::LionOptions(1e-3).weight_decay(0.1).state_format(f)); }},
      {"RMSprop", [](auto& p, StateFormat f) { return std::make_unique<lo::RMSprop>(p, lo::RMSpropOptions(1e-3).centered(true).momentum(0.5).state_format(f)); }},
      {"Adagrad", [](auto& p, StateFormat f) { return std::make_unique<lo::Adagrad>(p, lo::AdagradOptions(0.05).state_format(f)); }},
      {"AdEMAMix", [](auto& p, StateFormat f) { return std::make_unique<lo::AdEMAMix>(p, lo::AdEMAMixOptions(1e-3).t_alpha_beta3(10).state_format(f)); }},
      {"LAMB", [](auto& p, StateFormat f) { return std::make_unique<lo::LAMB>(p, lo::LAMBOptions(1e-2).weight_decay(0.01).state_format(f)); }},
  };
  for (auto& [name, make] : rules) {
    for (StateFormat f : kAllFormats) {
      for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
        SCOPED_TRACE(std::string(name) + " " + lowbit::state_format_name(f) + " " + c10::toString(dt));
        // The fused kernel (AVX-512 loop where the CPU has it), its scalar loop, the ATen reference.
        auto pa = make_params(dt), pb = clone_all(pa), pc = clone_all(pa);
        auto fused = make(pa, f);
        auto ref = make(pb, f);
        auto scalar = make(pc, f);
        lo::StepTesting::use_reference_step(*ref, true);
        lo::StepTesting::use_scalar_kernel(*scalar, true);
        for (int s = 0; s < 4; ++s) {
          const auto gs = random_grads(pa);
          set_grads(pa, gs);
          set_grads(pb, gs);
          set_grads(pc, gs);
          try {
            fused->step();
            ref->step();
            scalar->step();
          } catch (const c10::Error& e) {
            FAIL() << name << " " << lowbit::state_format_name(f) << " " << dt << " step " << s << ": "
                   << e.what_without_backtrace();
          }
        }
        ASSERT_TRUE(all_bitwise_equal(pa, pb)) << name << " " << lowbit::state_format_name(f) << " " << dt;
        ASSERT_TRUE(all_bitwise_equal(pc, pb)) << name << " scalar " << lowbit::state_format_name(f) << " " << dt;
        for (size_t i = 0; i < pa.size(); ++i) {
          const auto sa = fused->export_state_fp32(pa[i]), sb = ref->export_state_fp32(pb[i]),
                     sc = scalar->export_state_fp32(pc[i]);
          for (size_t k = 0; k < sa.size(); ++k) {
            if (!sa[k].defined()) continue;
            ASSERT_TRUE(lowbit_test::bitwise_equal(sa[k], sb[k])) << name << " state " << k;
            ASSERT_TRUE(lowbit_test::bitwise_equal(sc[k], sb[k])) << name << " scalar state " << k;
          }
        }
        EXPECT_EQ(fused->state_bytes(), ref->state_bytes());
      }
    }
  }
}

TEST(OptimQuantized, ResultDoesNotDependOnThreadCountOrGrouping) {
  // Q8 and FP8 take the pipelined 8-bit loop (one block carried into the next within a chunk of
  // blocks), Q4 the per-block loop; 1, 2 and 3 threads take the chunks in different orders.
  const int saved = omp_get_max_threads();
  for (StateFormat f : {StateFormat::Q4, StateFormat::Q8, StateFormat::FP8, StateFormat::C8}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    auto p1 = make_params(), p2 = clone_all(p1), p3 = clone_all(p1);
    std::vector<std::vector<at::Tensor>> grads;
    for (int s = 0; s < 3; ++s) grads.push_back(random_grads(p1));
    auto opts = lo::AdamWOptions(1e-2).state_format(f);
    omp_set_num_threads(1);
    lo::AdamW one(p1, opts);
    for (auto& g : grads) {
      set_grads(p1, g);
      one.step();
    }
    // Same parameters split over two groups with the same options.
    omp_set_num_threads(2);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{p2[0], p2[2]}, std::make_unique<lo::AdamWOptions>(opts));
    groups.emplace_back(std::vector<at::Tensor>{p2[1], p2[3]}, std::make_unique<lo::AdamWOptions>(opts));
    lo::AdamW two(groups, opts);
    for (auto& g : grads) {
      set_grads(p2, g);
      two.step();
    }
    omp_set_num_threads(3);
    lo::AdamW three(p3, opts);
    for (auto& g : grads) {
      set_grads(p3, g);
      three.step();
    }
    omp_set_num_threads(saved);
    EXPECT_TRUE(all_bitwise_equal(p1, p2));
    EXPECT_TRUE(all_bitwise_equal(p1, p3));
    for (size_t i = 0; i < p1.size(); ++i) {
      const auto s1 = one.export_state_fp32(p1[i]), s3 = three.export_state_fp32(p3[i]);
      for (size_t k = 0; k < s1.size(); ++k) EXPECT_TRUE(lowbit_test::bitwise_equal(s1[k], s3[k])) << i << " " << k;
    }
  }
}

// ---- behaviour -----------------------------------------------------------------------------------

TEST(OptimBehaviour, NonFiniteGradientSkipsTheWholeStep) {
  for (float bad : {NAN, INFINITY}) {
    auto p = make_params();
    lo::AdamW opt(p, lo::AdamWOptions(1e-2));
    set_grads(p, random_grads(p));
    opt.step();
    const auto before = clone_all(p);
    const int64_t bytes = opt.state_bytes();
    const auto state_before = opt.export_state_fp32(p[2]);
    auto gs = random_grads(p);
    gs[3].view(-1)[17] = bad;
    set_grads(p, gs);
    opt.step();
    EXPECT_EQ(opt.skipped_steps(), 1);
    EXPECT_TRUE(all_bitwise_equal(p, before));
    EXPECT_TRUE(all_bitwise_equal(opt.export_state_fp32(p[2]), state_before));
    EXPECT_EQ(opt.state_of(p[0])->step(), 1);
    EXPECT_EQ(opt.state_bytes(), bytes);
    set_grads(p, random_grads(p));
    opt.step();  // training goes on
    EXPECT_EQ(opt.state_of(p[0])->step(), 2);
  }
}

// LAMB on the CPU checks the gradients in its first pass (no pre-pass once the state is made): the
// same bits as a twin given the pre-pass's flag (step_parameters with grad_check's found_inf, which
// keeps the pre-pass), a non-finite gradient in any group skips every group, and rows whose sums are
// not finite from finite gradients (a NaN parameter) step as
// before rather than skip (their gradients are read again).
TEST(OptimBehaviour, LambsCheckInItsFirstPassSkipsAsThePrePassDoes) {
  auto pa = make_params(), pb = clone_all(pa);
  const auto make = [](std::vector<at::Tensor>& p) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(std::vector<at::Tensor>{p[0], p[1]});
    groups.emplace_back(std::vector<at::Tensor>{p[2], p[3]},
                        std::make_unique<lo::LAMBOptions>(lo::LAMBOptions(5e-3).weight_decay(0.02)));
    return std::make_unique<lo::LAMB>(groups, lo::LAMBOptions(1e-2).weight_decay(0.01));
  };
  auto fused = make(pa), twin = make(pb);
  const auto twin_step = [&] {
    std::vector<at::Tensor> grads;
    for (const auto& p : pb) grads.push_back(p.grad());
    const at::Tensor found = std::get<0>(lowbit::ops::grad_check(grads, std::vector<int64_t>(grads.size(), 0), 1, false));
    twin->step_parameters(pb, found);
  };
  const auto both = [&](const std::vector<at::Tensor>& gs) {
    set_grads(pa, gs);
    set_grads(pb, gs);
    fused->step();
    twin_step();
  };
  for (int s = 0; s < 3; ++s) {
    both(random_grads(pa));
    ASSERT_TRUE(all_bitwise_equal(pa, pb)) << "step " << s;
  }
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    for (const size_t k : {size_t{1}, size_t{2}}) {  // FP32 state in group 0, quantized in group 1
      const auto before = clone_all(pa);
      const auto state_before = fused->export_state_fp32(pa[0]);
      const int64_t skipped = fused->skipped_steps();
      auto gs = random_grads(pa);
      gs[k].view(-1)[k == 1 ? 999 : 12345] = bad;
      both(gs);
      EXPECT_EQ(fused->skipped_steps(), skipped + 1) << bad << " in parameter " << k;
      EXPECT_TRUE(all_bitwise_equal(pa, before)) << bad << " in parameter " << k;
      EXPECT_TRUE(all_bitwise_equal(fused->export_state_fp32(pa[0]), state_before));
      EXPECT_EQ(twin->skipped_steps(), fused->skipped_steps());
    }
  }
  // A NaN parameter makes its sums NaN from finite gradients: stepped, as before.
  pa[3].view(-1)[5] = NAN;
  pb[3].view(-1)[5] = NAN;
  both(random_grads(pa));
  EXPECT_EQ(fused->skipped_steps(), 6);
  EXPECT_EQ(twin->skipped_steps(), 6);
  EXPECT_TRUE(all_bitwise_equal(pa, pb));
  EXPECT_FALSE(at::isfinite(pa[3]).all().item<bool>());  // stepped (into NaN), not skipped
  both(random_grads(pa));
  EXPECT_TRUE(all_bitwise_equal(pa, pb));
}

// Without the pre-pass (no skip, no clipping) a step is the same step: finite gradients give the
// same bits, and a NaN gradient is stepped, not skipped (what skip_nonfinite(false) asks): its
// state overflows and the step says so.
TEST(OptimBehaviour, StepsWithoutThePrePassEqualStepsWithIt) {
  auto pa = make_params(), pb = clone_all(pa);
  lo::AdamW with(pa, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  lo::AdamW without(pb, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8).skip_nonfinite(false));
  for (int step = 0; step < 3; ++step) {
    const auto gs = random_grads(pa);
    set_grads(pa, gs);
    set_grads(pb, clone_all(gs));
    with.step();
    without.step();
    EXPECT_TRUE(all_bitwise_equal(pa, pb)) << "step " << step;
  }
  auto gs = random_grads(pb);
  gs[3].view(-1)[17] = NAN;
  set_grads(pb, gs);
  try {
    without.step();
    ADD_FAILURE() << "a NaN gradient stepped without an overflow report";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("parameter 3"), std::string::npos) << e.what_without_backtrace();
  }
  EXPECT_EQ(without.skipped_steps(), 0);
  EXPECT_EQ(without.state_of(pb[3])->step(), 4);
}

TEST(OptimBehaviour, StateBytesPerFormat) {
  std::vector<at::Tensor> p = {at::randn({1 << 20})};
  const std::pair<StateFormat, double> limits[] = {
      {StateFormat::FP32, 8.0}, {StateFormat::BF16, 4.0}, {StateFormat::Q8, 2.04}, {StateFormat::Q4, 1.07}, {StateFormat::FP8, 2.04},
      {StateFormat::C8, 2.13}};  // block 64: 2 x (1 + 4/64)
  for (auto [f, limit] : limits) {
    lo::AdamW opt(p, lo::AdamWOptions().state_format(f));
    p[0].mutable_grad() = at::randn({1 << 20});
    opt.step();
    const double per_param = double(opt.state_bytes()) / p[0].numel();
    EXPECT_LE(per_param, limit) << lowbit::state_format_name(f);
    EXPECT_GE(per_param, limit * 0.95) << lowbit::state_format_name(f);
  }
  // Small tensors keep FP32 state (decided on the parameter's numel).
  std::vector<at::Tensor> small = {at::randn({4095})};
  lo::AdamW opt(small, lo::AdamWOptions().state_format(StateFormat::Q4));
  small[0].mutable_grad() = at::randn({4095});
  opt.step();
  EXPECT_EQ(opt.state_of(small[0])->format, StateFormat::FP32);
  EXPECT_EQ(opt.state_bytes(), 4095 * 8);
}

TEST(OptimBehaviour, Fp8SecondMomentFormatIsSelectable) {
  for (auto qf : {lowbit::QuantFormat::FP8E4M3, lowbit::QuantFormat::FP8E5M2}) {
    std::vector<at::Tensor> p = {at::randn({5000})};
    lo::AdamW opt(p, lo::AdamWOptions().state_format(StateFormat::FP8).fp8_second_moment(qf));
    p[0].mutable_grad() = at::randn({5000});
    opt.step();
    EXPECT_EQ(opt.state_of(p[0])->slots[0].quantized.format(), lowbit::QuantFormat::FP8E4M3);
    EXPECT_EQ(opt.state_of(p[0])->slots[1].quantized.format(), qf);
  }
  std::vector<at::Tensor> p = {at::randn({10})};
  EXPECT_THROW(lo::AdamW(p, lo::AdamWOptions().fp8_second_moment(lowbit::QuantFormat::Dyn8Unsigned)), c10::Error);
}

TEST(OptimBehaviour, PerParameterFormatOverride) {
  auto p = make_params();
  lo::AdamW opt(p, lo::AdamWOptions().state_format(StateFormat::Q4));
  opt.override_state_format(p[2], StateFormat::FP32);
  set_grads(p, random_grads(p));
  opt.step();
  EXPECT_EQ(opt.state_of(p[2])->format, StateFormat::FP32);
  EXPECT_EQ(opt.state_of(p[0])->format, StateFormat::Q4);
  EXPECT_THROW(opt.override_state_format(p[0], StateFormat::FP32), c10::Error);
}

TEST(OptimBehaviour, ParamGroupsSchedulersAndMissingGrads) {
  auto p = make_params();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p[0], p[1]}, std::make_unique<lo::AdamWOptions>(lo::AdamWOptions(0.0)));
  groups.emplace_back(std::vector<at::Tensor>{p[2], p[3]});
  lo::AdamW opt(groups, lo::AdamWOptions(1e-2).weight_decay(0));
  torch::optim::StepLR sched(opt, /*step_size=*/2, /*gamma=*/0.5);
  // The same scheduler on libtorch's AdamW sets the learning rates we must see.
  std::vector<at::Tensor> twin = {at::zeros({1})};
  torch::optim::AdamW torch_opt(twin, torch::optim::AdamWOptions(1e-2));
  torch::optim::StepLR torch_sched(torch_opt, 2, 0.5);
  const auto before = clone_all(p);
  auto gs = random_grads(p);
  set_grads(p, gs);
  p[3].mutable_grad() = at::Tensor();  // no gradient: skipped
  opt.step();
  sched.step();
  torch_sched.step();
  EXPECT_TRUE(lowbit_test::bitwise_equal(p[0], before[0]));  // lr 0
  EXPECT_FALSE(lowbit_test::bitwise_equal(p[2], before[2]));
  EXPECT_TRUE(lowbit_test::bitwise_equal(p[3], before[3]));
  EXPECT_EQ(opt.state_of(p[3]), nullptr);
  for (int s = 0; s < 3; ++s) {
    opt.step();
    sched.step();
    torch_sched.step();
  }
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), torch_opt.param_groups()[0].options().get_lr());
  EXPECT_LT(opt.param_groups()[1].options().get_lr(), 1e-2);
  opt.zero_grad();
  EXPECT_FALSE(p[2].grad().defined() && p[2].grad().abs().sum().item<double>() != 0);
}

TEST(OptimBehaviour, ClearErrors) {
  std::vector<at::Tensor> p = {at::randn({10})};
  lo::AdamW opt(p);
  p[0].mutable_grad() = at::randn({10}).to_sparse();
  EXPECT_NE(error_text([&] { opt.step(); }).find("parameter 0 of group 0 (shape [10]) has a sparse gradient"), std::string::npos);
  std::vector<at::Tensor> ip = {at::ones({10}, at::kLong)};
  lo::AdamW iopt(ip);
  ip[0].mutable_grad() = at::ones({10}, at::kLong);
  EXPECT_NE(error_text([&] { iopt.step(); }).find("has dtype Long"), std::string::npos);
  EXPECT_NE(error_text([&] { lo::AdamW(p, lo::AdamWOptions(-1)); }).find("lowbit::optim::AdamW: param group 0: lr must be finite and >= 0, got -1"), std::string::npos);
  EXPECT_NE(error_text([&] { lo::AdamW(p, lo::AdamWOptions().betas({1.0, 0.9})); }).find("lowbit::optim::AdamW: param group 0: beta1 must be in [0, 1), got 1"), std::string::npos);
  EXPECT_NE(error_text([&] { lo::AdamW(p, lo::AdamWOptions().block_size(100)); }).find("block_size must be"), std::string::npos);
}

// Options a group brought or a caller edited after construction are held to the table's ranges at
// the next step, which then changes nothing: parameters, state and step count stay as they were.
TEST(OptimBehaviour, EditedGroupOptionsAreCheckedAtTheStepWhichThenChangesNothing) {
  std::vector<at::Tensor> p = {at::randn({5000}), at::randn({300})};
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p[0]});
  groups.emplace_back(std::vector<at::Tensor>{p[1]}, std::make_unique<lo::AdamWOptions>(lo::AdamWOptions(1e-2)));
  lo::AdamW opt(std::move(groups), lo::AdamWOptions());
  for (at::Tensor& t : p) t.mutable_grad() = at::randn_like(t);
  opt.step();
  const std::vector<at::Tensor> before = {p[0].clone(), p[1].clone()};
  const auto state_before = opt.export_state_fp32(p[0]);
  auto& o1 = static_cast<lo::AdamWOptions&>(opt.param_groups()[1].options());
  o1.betas({0.9, 1.0});
  EXPECT_NE(error_text([&] { opt.step(); }).find("lowbit::optim::AdamW: param group 1: beta2 must be in [0, 1), got 1"),
            std::string::npos);
  EXPECT_TRUE(p[0].equal(before[0]));
  EXPECT_TRUE(p[1].equal(before[1]));
  EXPECT_TRUE(opt.export_state_fp32(p[0])[0].equal(state_before[0]));
  EXPECT_EQ(opt.state_of(p[0])->step(), 1);
  o1.betas({0.9, 0.999});
  opt.step();
  EXPECT_EQ(opt.state_of(p[0])->step(), 2);
  EXPECT_FALSE(p[1].equal(before[1]));
}

TEST(OptimBehaviour, MaxGradNormClipsLikeTorch) {
  auto pa = make_params(), pb = clone_all(pa);
  lo::SGD a(pa, lo::SGDOptions(0.1).max_grad_norm(0.5).state_format(StateFormat::FP32));
  torch::optim::SGD b(pb, torch::optim::SGDOptions(0.1));
  const auto gs = random_grads(pa);
  set_grads(pa, gs);
  set_grads(pb, gs);
  torch::nn::utils::clip_grad_norm_(pb, 0.5);
  a.step();
  b.step();
  EXPECT_LE(max_rel_diff(pa, pb), 1e-6);
}

TEST(OptimBehaviour, Bf16StochasticRoundingIsSeededAndUnbiased) {
  auto run = [](bool sr) {
    std::vector<at::Tensor> p = {at::full({8192}, 1.0, at::kBFloat16)};
    lo::SGD opt(p, lo::SGDOptions(1e-4).bf16_stochastic_round(sr));
    for (int s = 0; s < 50; ++s) {
      p[0].mutable_grad() = at::ones({8192}, at::kBFloat16);
      opt.step();
    }
    return p[0].to(at::kFloat);
  };
  const at::Tensor a = run(true), b = run(true), n = run(false);
  EXPECT_TRUE(a.equal(b));                                   // reproducible
  EXPECT_EQ(n.eq(1.0).all().item<bool>(), true);             // 1 - 1e-4 rounds back to 1 every time
  EXPECT_NEAR(a.mean().item<double>(), 1.0 - 50 * 1e-4, 1e-3);  // stochastic rounding tracks the sum
}

// Small least-squares problem: every format tracks FP32's loss over 500 steps.
TEST(OptimQuality, FormatsTrackFp32On500StepRegression) {
  const at::Tensor X = at::randn({512, 64}), w_true = at::randn({64, 80}), Y = at::matmul(X, w_true);
  auto train = [&](StateFormat f) {
    at::Tensor w = at::zeros({64, 80}).requires_grad_(true);  // 5120 weights: above min_quant_numel
    lo::AdamW opt({w}, lo::AdamWOptions(1e-2).weight_decay(0).state_format(f));
    double loss = 0;
    for (int s = 0; s < 500; ++s) {
      opt.zero_grad();
      at::Tensor l = (at::matmul(X, w) - Y).pow(2).mean();
      l.backward();
      opt.step();
      loss = l.item<double>();
    }
    return loss;
  };
  const double base = train(StateFormat::FP32);
  const double start = Y.pow(2).mean().item<double>();
  EXPECT_LT(base, start * 0.05);
  for (auto [f, tol] : {std::pair{StateFormat::BF16, 0.001}, std::pair{StateFormat::Q8, 0.002},
                        std::pair{StateFormat::FP8, 0.005}, std::pair{StateFormat::C8, 0.005},
                        std::pair{StateFormat::Q4, 0.03}}) {
    const double l = train(f);
    std::printf("500-step regression: %s final loss %.5f (FP32 %.5f, start %.2f)\n", lowbit::state_format_name(f), l,
                base, start);
    // Bound: the final loss differs from FP32's by at most tol of the starting loss.
    EXPECT_LE(std::abs(l - base), tol * start) << lowbit::state_format_name(f) << " loss " << l << " vs fp32 " << base;
  }
}

// ---- the step as a dispatcher op -------------------------------------------------------------------

TEST(OptimOp, NonContiguousParametersTakeTheReferencePathAndAgree) {
  // A transposed weight: the CPU kernel hands it to the reference, which must give what a
  // contiguous copy of it gets from the fused loop.
  at::Tensor base = at::randn({300, 70});
  std::vector<at::Tensor> pa = {base.t()}, pb = {base.t().contiguous()};
  lo::AdamW a(pa, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  lo::AdamW b(pb, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  for (int s = 0; s < 3; ++s) {
    const at::Tensor g = at::randn({70, 300});
    pa[0].mutable_grad() = g.clone();
    pb[0].mutable_grad() = g.clone();
    a.step();
    b.step();
  }
  EXPECT_FALSE(pa[0].is_contiguous());
  EXPECT_TRUE(lowbit_test::bitwise_equal(pa[0].contiguous(), pb[0]));
}

TEST(OptimOp, BadArgumentsNameTheParameter) {
  const at::Tensor p = at::randn({1000}), g = at::randn({1000});
  const auto codes = at::zeros({1000}, at::kByte), absmax = at::zeros({4});
  const auto codes2 = at::zeros({1000}, at::kByte), absmax2 = at::zeros({4});  // slots never share memory
  const auto args = [&] {
    lowbit::ops::StepArgs a;
    a.params = {p};
    a.grads = {g};
    a.counters = {at::zeros({2}, at::kLong)};
    a.lr = at::full({1}, 1e-3, at::kDouble);
    a.config.rule = lowbit::kernels::Rule::AdamW;
    a.slots = {{lowbit::kernels::SlotStorage::Quant, lowbit::QuantFormat::Dyn8Signed},
               {lowbit::kernels::SlotStorage::Quant, lowbit::QuantFormat::Dyn8Unsigned}};
    a.state = {codes, absmax, codes2, absmax2};
    return a;
  };
  const auto error_of = [&](const std::function<void(lowbit::ops::StepArgs&)>& change) {
    auto a = args();
    change(a);
    return error_text([&] { lowbit::ops::optim_step(a); });
  };
  EXPECT_EQ(error_of([](auto&) {}), "");
  // Wrong absmax count for block 128 (needs 8).
  EXPECT_NE(error_of([](auto& a) { a.block_size = 128; }).find("slot 0 of parameter 0 needs 8 float32 absmax values (block 128), got 4"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.state.pop_back(); }).find("state has 3 tensors; 1 parameter(s) with 4 state tensors each (slots Dyn8Signed, Dyn8Unsigned) need 4"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.slots.pop_back(); }).find("AdamW needs slot 1 (exp_avg_sq)"), std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.grads = {at::randn({999})}; }).find("parameter 0 has shape [1000] but its gradient [999]"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.offsets = {100}; }).find("offsets[0] is 100, not a multiple of block_size 256"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.counters = {at::zeros({2}, at::kInt)}; }).find("counters[0] must be a contiguous int64 tensor"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.lr = at::ones({2}, at::kDouble); }).find("lr must hold one value, got 2"),
            std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.config.beta1 = NAN; }).find("beta1 must be in [0, 1), got nan"), std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.max_grad_norm = 1.0; }).find("max_grad_norm 1 needs grad_sumsq"), std::string::npos);
  EXPECT_NE(error_of([](auto& a) { a.rng_keys = {1, 2}; }).find("rng_keys has 2 entries for 1 parameters"),
            std::string::npos);
}

// Every row of the hyper-parameter table (step_config.h) is checked by the op: a value outside its
// range is refused with the op's name, the hyper-parameter's and the value, and the call changes
// nothing; the edges of each range are accepted.
TEST(OptimOp, EveryHyperParameterOutsideItsRangeIsRefusedAndChangesNothing) {
  namespace k = lowbit::kernels;
  struct Case {
    std::string name;
    std::function<void(k::StepConfig&)> set;
    bool refused;
  };
  std::vector<Case> cases;
  const auto add = [&](const char* name, k::HyperRange range, bool integral, std::function<void(k::StepConfig&, double)> set) {
    std::vector<std::pair<double, bool>> values;  // value, refused
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    switch (range) {
      case k::HyperRange::Any: return;
      case k::HyperRange::Finite: values = {{-3.0, false}, {inf, true}, {-inf, true}, {nan, true}}; break;
      case k::HyperRange::NonNegative: values = {{0.0, false}, {-1.0, true}, {-1e-300, true}, {inf, true}, {nan, true}}; break;
      case k::HyperRange::ZeroToInf: values = {{0.0, false}, {inf, false}, {-1e-300, true}, {nan, true}}; break;
      case k::HyperRange::Positive: values = {{1e-300, false}, {0.0, true}, {-1.0, true}, {inf, true}, {nan, true}}; break;
      case k::HyperRange::UnitInterval:
        values = {{0.0, false}, {0.999999, false}, {1.0, true}, {-0.1, true}, {nan, true}, {inf, true}};
        break;
    }
    for (const auto& [v, refused] : values) {
      if (integral && !std::isfinite(v)) continue;
      if (integral && v != std::floor(v)) continue;
      cases.push_back({name, [set, v = v](k::StepConfig& c) { set(c, v); }, refused});
    }
  };
#define LOWBIT_TEST_ROW(type, name, default_value, range) \
  add(#name, k::HyperRange::range, std::is_integral<type>::value, [](k::StepConfig& c, double v) { c.name = static_cast<type>(v); });
  LOWBIT_STEP_HYPER_PARAMETERS(LOWBIT_TEST_ROW)
#undef LOWBIT_TEST_ROW
  ASSERT_GE(cases.size(), 30u);
  // Nesterov needs an undampened momentum (torch.optim.SGD's rule).
  cases.push_back({"nesterov", [](k::StepConfig& c) { c.rule = k::Rule::SGD, c.nesterov = true; }, true});
  cases.push_back({"nesterov", [](k::StepConfig& c) { c.rule = k::Rule::SGD, c.nesterov = true, c.momentum = 0.9, c.dampening = 0.1; }, true});
  cases.push_back({"nesterov", [](k::StepConfig& c) { c.rule = k::Rule::SGD, c.nesterov = true, c.momentum = 0.9; }, false});

  for (const Case& cs : cases) {
    const at::Tensor p0 = at::randn({300}), g = at::randn({300});
    at::Tensor p = p0.clone(), m = at::full({300}, 0.5f), v = at::full({300}, 0.25f), counters = at::zeros({2}, at::kLong);
    lowbit::ops::StepArgs a;
    a.params = {p};
    a.grads = {g};
    a.counters = {counters};
    a.lr = at::full({1}, 1e-3, at::kDouble);
    a.config.rule = lowbit::kernels::Rule::AdamW;
    cs.set(a.config);
    const bool sgd = a.config.rule == k::Rule::SGD;
    a.slots = {{k::SlotStorage::F32, lowbit::QuantFormat::Dyn8Signed}};
    a.state = {m};
    if (!sgd) {
      a.slots.push_back({k::SlotStorage::F32, lowbit::QuantFormat::Dyn8Unsigned});
      a.state.push_back(v);
    }
    if (sgd && a.config.momentum == 0) a.slots.clear(), a.state.clear();
    const std::string error = error_text([&] { lowbit::ops::optim_step(a); });
    SCOPED_TRACE(cs.name + ": " + error);
    if (!cs.refused) {
      EXPECT_EQ(error, "");
      continue;
    }
    EXPECT_NE(error.find("lowbit::optim_step_: " + cs.name), std::string::npos);
    EXPECT_TRUE(p.equal(p0));
    EXPECT_TRUE(m.equal(at::full({300}, 0.5f)));
    EXPECT_TRUE(v.equal(at::full({300}, 0.25f)));
    EXPECT_EQ(counters[0].item<int64_t>(), 0);
  }
}

// On a GPU the step goes through the dispatcher to the ATen reference (no CUDA kernel registered
// yet): the same parameters and state as the CPU's fused kernel, bit for bit.
TEST(OptimOp, CudaParametersStepThroughTheReferenceAndMatchTheCpuKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  // Three steps of the same AdamW on CPU and CUDA copies of two parameters; bitwise equal after.
  auto check = [](at::ScalarType dt, const lo::AdamWOptions& opts, const std::string& what) {
    std::vector<at::Tensor> pc = {at::randn({5000}).to(dt), at::randn({70001}).to(dt)};
    std::vector<at::Tensor> pg = {pc[0].cuda(), pc[1].cuda()};
    lo::AdamW a(pc, opts);
    lo::AdamW b(pg, opts);
    for (int s = 0; s < 3; ++s) {
      const auto gs = random_grads(pc);
      set_grads(pc, gs);
      for (size_t i = 0; i < pg.size(); ++i) pg[i].mutable_grad() = gs[i].cuda();
      a.step();
      b.step();
    }
    for (size_t i = 0; i < pc.size(); ++i)
      EXPECT_TRUE(lowbit_test::bitwise_equal(pc[i], pg[i].cpu())) << what << " param " << i;
    EXPECT_EQ(a.state_bytes(), b.state_bytes()) << what;
  };
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4, StateFormat::FP8, StateFormat::C8})
    check(at::kFloat, lo::AdamWOptions(1e-2).state_format(f), lowbit::state_format_name(f));
  // bf16 parameters rounded stochastically: the reference's int64 hash on the GPU draws the same
  // noise as the CPU kernel.
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8})
    check(at::kBFloat16, lo::AdamWOptions(1e-2).state_format(f).bf16_stochastic_round(true),
          std::string("bf16 SR ") + lowbit::state_format_name(f));
}

// Adagrad's sum of g^2 with g = 1e20 overflows float: quantized state cannot hold Inf, so the step
// says which parameter lost its state instead of leaving NaN blocks behind silently. Both paths.
TEST(OptimOp, StateOverflowIsReportedWithTheParameter) {
  for (bool reference : {false, true}) {
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::FP8, StateFormat::C8}) {
      std::vector<at::Tensor> p = {at::randn({5000}), at::randn({8192})};
      lo::Adagrad opt(p, lo::AdagradOptions(0.1).state_format(f));
      lo::StepTesting::use_reference_step(opt, reference);
      p[0].mutable_grad() = at::randn({5000});
      p[1].mutable_grad() = at::randn({8192});
      p[1].mutable_grad()[300] = 1e20;  // finite, but its square is not
      std::string msg;
      try {
        opt.step();
      } catch (const c10::Error& e) {
        msg = e.what_without_backtrace();
      }
      EXPECT_NE(msg.find("the state of parameter 1 of group 0 (shape [8192]) overflowed to Inf/NaN in 1 block(s) "
                         "at step 1"),
                std::string::npos)
          << lowbit::state_format_name(f) << (reference ? " reference: " : " fused: ") << msg;
      // A well-behaved step reports nothing.
      std::vector<at::Tensor> q = {at::randn({8192})};
      lo::Adagrad ok(q, lo::AdagradOptions(0.1).state_format(f));
      lo::StepTesting::use_reference_step(ok, reference);
      q[0].mutable_grad() = at::randn({8192});
      EXPECT_NO_THROW(ok.step());
    }
  }
}

// bf16 stochastic rounding on the reference path (ATen int64 ops) is the fused kernel's, bit for bit.
TEST(OptimOp, StochasticRoundingOfTheReferenceMatchesTheKernel) {
  // FP32 state takes the per-block loop, Q8 and Q4 the pipelined one (its own 16-lane hash). The
  // parameters hold values near bf16's largest (rounding up must clamp, keeping the sign), an Inf
  // and a NaN (rounded to nearest).
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4}) {
    auto pa = make_params(at::kBFloat16);
    pa[2].narrow(0, 100, 50).fill_(3.3895e38);
    pa[2].narrow(0, 200, 50).fill_(-3.3895e38);
    pa[2][300] = INFINITY;
    pa[2][301] = -INFINITY;
    pa[2][302] = NAN;
    auto pb = clone_all(pa), pc = clone_all(pa);
    lo::AdamW a(pa, lo::AdamWOptions(1e-2).bf16_stochastic_round(true).state_format(f));
    lo::AdamW b(pb, lo::AdamWOptions(1e-2).bf16_stochastic_round(true).state_format(f));
    lo::AdamW c(pc, lo::AdamWOptions(1e-2).state_format(f));  // round to nearest
    lo::StepTesting::use_reference_step(b, true);
    lo::StepTesting::use_reference_step(c, true);
    for (int s = 0; s < 3; ++s) {
      const auto gs = random_grads(pa);
      set_grads(pa, gs);
      set_grads(pb, gs);
      set_grads(pc, gs);
      a.step();
      b.step();
      c.step();
    }
    EXPECT_TRUE(all_bitwise_equal(pa, pb)) << lowbit::state_format_name(f);
    EXPECT_FALSE(all_bitwise_equal(pa, pc)) << "stochastic rounding had no effect";
  }
}

// Rounding up past bf16's largest value clamps to it (never Inf): parameters at the largest bf16,
// pushed up by less than float's headroom above it; the noise carries some of them over.
TEST(OptimOp, StochasticRoundingClampsAtTheLargestBf16) {
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8}) {
    std::vector<at::Tensor> pa = {at::full({4099}, 3.3895313892515355e38, at::kBFloat16)};
    pa[0].narrow(0, 0, 2000).neg_();
    auto pb = clone_all(pa);
    const auto opts = lo::SGDOptions(1.0).momentum(0.9).bf16_stochastic_round(true).state_format(f);
    lo::SGD a(pa, opts), b(pb, opts);
    lo::StepTesting::use_reference_step(b, true);
    // g = -+1e36 moves each value 1e36 further from zero, less than float's 1.3e36 of headroom.
    const at::Tensor g = (-pa[0].to(at::kFloat).sign() * 1e36).to(at::kBFloat16);
    pa[0].mutable_grad() = g.clone();
    pb[0].mutable_grad() = g.clone();
    a.step();
    b.step();
    EXPECT_TRUE(all_bitwise_equal(pa, pb)) << lowbit::state_format_name(f);
    const at::Tensor mag = pa[0].to(at::kFloat).abs();
    EXPECT_TRUE(at::isfinite(pa[0]).all().item<bool>()) << lowbit::state_format_name(f);
    EXPECT_TRUE(at::eq(mag, 3.3895313892515355e38).all().item<bool>()) << lowbit::state_format_name(f);
  }
}

// The same special values rounded to nearest, in bf16 and fp16 parameters: the reference writes a
// NaN as the kernels do (ATen's own conversions disagree with each other on a NaN's bits).
TEST(OptimOp, NanAndInfParametersRoundAsTheKernelDoes) {
  for (auto dt : {at::kBFloat16, at::kHalf}) {
    for (StateFormat f : {StateFormat::FP32, StateFormat::BF16, StateFormat::Q8}) {
      auto pa = make_params(dt);
      pa[2][300] = INFINITY;
      pa[2][301] = -INFINITY;
      pa[2][302] = NAN;
      pa[2][303] = -NAN;
      auto pb = clone_all(pa);
      lo::AdamW a(pa, lo::AdamWOptions(1e-2).state_format(f));
      lo::AdamW b(pb, lo::AdamWOptions(1e-2).state_format(f));
      lo::StepTesting::use_reference_step(b, true);
      for (int s = 0; s < 2; ++s) {
        const auto gs = random_grads(pa);
        set_grads(pa, gs);
        set_grads(pb, gs);
        a.step();
        b.step();
      }
      EXPECT_TRUE(all_bitwise_equal(pa, pb)) << c10::toString(dt) << " " << lowbit::state_format_name(f);
    }
  }
}
