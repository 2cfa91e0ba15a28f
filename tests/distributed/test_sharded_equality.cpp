// ShardedOptimizer against one unsharded process fed the averaged gradients: parameters and every
// rank's state (codes, absmax, dense values, step counts) bit for bit, for every rule and state
// format, bf16 parameters with stochastic rounding, clipping, the non-finite skip and ZeRO-1.
#include "dist_util.h"

#include <lowbit/optim/step_calls.h>

namespace lowbit_test {

at::Tensor default_grad(int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
  return rank_grad(r, s, k, shape, dtype);
}

void backward_with(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads) {
  // d/dp sum(p * g) = ones * g: the gradient arrives through autograd bit for bit as g.
  at::Tensor loss;
  for (size_t k = 0; k < params.size(); ++k) {
    if (!grads[k].defined()) continue;
    at::Tensor term = (params[k] * grads[k].to(params[k].device())).sum();
    loss = loss.defined() ? loss + term : term;
  }
  if (loss.defined()) loss.backward();
}

void expect_same_as(const ld::ShardedOptimizer& sharded, const std::vector<at::Tensor>& params,
                    const lo::LowbitOptimizer& ref, const std::vector<at::Tensor>& ref_params, int64_t extra_skipped) {
  for (size_t k = 0; k < params.size(); ++k) {
    // Parameters that compute in another dtype than they are kept in (mixed precision): the kept
    // values rounded to it.
    const at::Tensor want = ref_params[k].to(params[k].scalar_type());
    EXPECT_TRUE(bitwise_equal(params[k], want)) << "parameter " << k << " max |diff| "
        << (params[k].to(at::kFloat) - want.to(at::kFloat)).abs().max().item<float>();
  }
  for (size_t i = 0; i < sharded.fragments().size(); ++i) {
    const ld::Fragment& f = sharded.fragments()[i];
    EXPECT_TRUE(bitwise_equal(sharded.fragment_values(i), ref_params[f.index].reshape({-1}).narrow(0, f.offset, f.numel)))
        << "the values of parameter " << f.index << " elements " << f.offset << ".." << f.offset + f.numel;
  }
  for (const ld::Fragment& f : sharded.fragments()) {
    const lo::ParamState* want = ref.state_of(ref_params[f.index]);
    if (!want) {
      EXPECT_FALSE(f.state.counters.defined() && f.state.step() > 0) << "parameter " << f.index;
      continue;
    }
    if (!f.state.counters.defined()) {
      ADD_FAILURE() << "parameter " << f.index << " has no state";
      continue;
    }
    EXPECT_EQ(f.state.format, want->format);
    EXPECT_EQ(f.state.step(), want->step()) << "parameter " << f.index;
    std::vector<at::Tensor> a, b;
    lowbit::optim::append_state_range(f.state, 0, f.numel, a);
    lowbit::optim::append_state_range(*want, f.offset, f.numel, b);
    EXPECT_EQ(a.size(), b.size());
    for (size_t t = 0; t < a.size() && t < b.size(); ++t)
      EXPECT_TRUE(bitwise_equal(a[t], b[t])) << "parameter " << f.index << " elements " << f.offset << ".."
                                             << f.offset + f.numel << " state tensor " << t;
  }
  EXPECT_EQ(sharded.skipped_steps(), ref.skipped_steps() + extra_skipped);
}

Outcome expect_same_as_one_process(const Factory& make, at::ScalarType dtype, ld::ShardedOptions so, int steps,
                                   const GradFn& grad, std::shared_ptr<ld::Communicator> c) {
  if (!c) c = comm_ptr();
  const int rank = c->rank(), world = c->size();
  std::vector<at::Tensor> ref_params = make_params(dtype, device()), params = make_params(dtype, device());
  std::unique_ptr<lo::LowbitOptimizer> ref = make(ref_params);
  std::shared_ptr<lo::LowbitOptimizer> inner(make(params).release());
  ld::ShardedOptimizer sharded(inner, c, so);
  for (int s = 1; s <= steps; ++s) {
    std::vector<at::Tensor> mine(params.size());
    bool all_mine = true;
    for (size_t k = 0; k < params.size(); ++k) {
      const auto shape = params[k].sizes();
      mine[k] = grad(rank, s, static_cast<int>(k), shape, dtype);  // undefined: unused here (overlap only)
      all_mine &= mine[k].defined();
      at::Tensor sum = at::zeros(shape, at::kFloat);
      bool any = false;
      for (int r = 0; r < world; ++r) {
        const at::Tensor g = grad(r, s, static_cast<int>(k), shape, dtype);
        if (!g.defined()) continue;
        sum += g.to(at::kFloat);
        any = true;
      }
      ref_params[k].mutable_grad() = any ? (sum / world).to(dtype).to(device()) : at::Tensor();
    }
    if (so.overlap) {
      // Through backward(): the hooks take the gradients and reduce the buckets as they fill.
      sharded.zero_grad();
      backward_with(params, mine);
      if (all_mine) EXPECT_EQ(sharded.buckets_pending(), 0) << "step " << s;
      if (so.release_gradients)
        for (size_t k = 0; k < params.size(); ++k) EXPECT_FALSE(params[k].grad().defined()) << "parameter " << k;
    } else {
      for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = mine[k].to(device());
    }
    sharded.step();
    ref->step();
  }
  expect_same_as(sharded, params, *ref, ref_params);
  EXPECT_FALSE(sharded.fragments().empty() && world == 1);
  return {sharded.state_bytes(), ref->state_bytes()};
}

namespace {

const auto& kFormats = lowbit::kAllStateFormats;

TEST(ShardedOptimizer, EveryRuleAndStateFormatMatchesOneProcess) {
  for (const RuleCase& rc : rule_cases())
    for (StateFormat f : kFormats) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, false); }, at::kFloat, {}, 3);
    }
}

TEST(ShardedOptimizer, Bf16ParametersWithStochasticRoundingMatchOneProcess) {
  for (const RuleCase& rc : rule_cases())
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4}) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, true); }, at::kBFloat16, {}, 3);
    }
}

TEST(ShardedOptimizer, MasterWeightCorrectionsMatchOneProcess) {
  // bf16 parameters with a 24-bit (int8) or 32-bit (int16) master-weight correction: the correction
  // is one more slot of each fragment's state, sharded like the moments.
  for (int64_t bits : {24, 32})
    for (StateFormat f : {StateFormat::Q8, StateFormat::FP32}) {
      SCOPED_TRACE(std::to_string(bits) + "-bit master, " + lowbit::state_format_name(f));
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) {
        return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(f).master_weight_bits(bits));
      }, at::kBFloat16, {}, 3);
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) {
        return std::make_unique<lo::SGD>(p, lo::SGDOptions(0.05).momentum(0.9).state_format(f).master_weight_bits(bits));
      }, at::kBFloat16, {}, 3);
    }
}

// Without overlap the buckets fill in registration order (kDefaultStepBucketBytes for a real model):
// with 8192 bytes the model's float32 parameters (20000, 25600, 1200, 49164, 28 and 8192 bytes) form
// {0}, {1}, {2, 3}, {4, 5}, each reduce-scattered and all-gathered on its own, the bits one process's.
TEST(ShardedOptimizer, BucketsWithoutOverlapMatchOneProcess) {
  ld::ShardedOptions so;
  so.bucket_bytes = 8192;
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  EXPECT_EQ(ld::ShardedOptimizer(std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3)), comm_ptr(), so).buckets(), 4);
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(rc.name);
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q8, false); }, at::kFloat, so, 3);
  }
}

TEST(ShardedOptimizer, Zero1MatchesOneProcess) {
  ld::ShardedOptions so;
  so.zero1 = true;
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(rc.name);
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q8, false); }, at::kFloat, so, 3);
  }
}

}  // namespace

void expect_sharded_over_matches_one_process(const std::shared_ptr<ld::Communicator>& c) {
  for (const RuleCase& rc : rule_cases())
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::FP32}) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, false); }, at::kFloat, {}, 2,
                                 default_grad, c);
    }
  // bf16 parameters with stochastic rounding, and ZeRO-1 (all_reduce instead of reduce_scatter).
  expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[0].make(p, StateFormat::Q8, true); },
                             at::kBFloat16, {}, 2, default_grad, c);
  ld::ShardedOptions zero1;
  zero1.zero1 = true;
  expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[0].make(p, StateFormat::Q8, false); },
                             at::kFloat, zero1, 2, default_grad, c);
  // Overlap: buckets reduce-scattered from backward()'s hooks (small buckets: several form).
  ld::ShardedOptions overlap;
  overlap.overlap = true;
  overlap.bucket_bytes = 8192;
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(std::string(rc.name) + " overlap");
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q4, false); },
                               at::kFloat, overlap, 2, default_grad, c);
  }
}

void expect_clipping_and_skip_like_one_process(const ld::ShardedOptions& so) {
  // The same gradient on every rank: the mean is exact, so are the squares clipping adds up, and
  // one process's norm is reached in any order. Step 2 carries an Inf from the last rank only: every
  // rank must skip it.
  const int last = comm().size() - 1;
  const GradFn grad = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    at::Tensor g = rank_grad(0, s, k, shape, dtype);
    if (s == 2 && k == 3 && r == last) g.view(-1)[4100] = std::numeric_limits<float>::infinity();
    return g;
  };
  for (StateFormat f : {StateFormat::Q8, StateFormat::FP32}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).max_grad_norm(0.5).state_format(f));
    }, at::kFloat, so, 4, grad);
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::LAMB>(p, lo::LAMBOptions(1e-2).max_grad_norm(0.5).state_format(f));
    }, at::kFloat, so, 4, grad);
  }
}

namespace {

TEST(ShardedOptimizer, ClippingAndTheNonFiniteSkipMatchOneProcess) { expect_clipping_and_skip_like_one_process({}); }

TEST(ShardedOptimizer, EachRankHoldsItsShareOfTheState) {
  for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::FP32}) {
    const Outcome run = expect_same_as_one_process([&](std::vector<at::Tensor>& p) {
      return std::make_unique<lo::Adam>(p, lo::AdamOptions(1e-3).state_format(f));
    }, at::kFloat, {}, 1);
    at::Tensor total = at::full({1}, run.sharded_state_bytes, at::TensorOptions().dtype(at::kLong).device(device()));
    comm().all_reduce(total);
    // The ranks' pieces tile every parameter on block boundaries: nothing is held twice.
    EXPECT_EQ(total.cpu().item<int64_t>(), run.unsharded_state_bytes) << lowbit::state_format_name(f);
    // Each rank ~ 1/N of it: its range is total/N elements (+ alignment), at most 2 slots of 4 bytes.
    const int64_t n = comm().size();
    EXPECT_LE(run.sharded_state_bytes, run.unsharded_state_bytes / n + 2 * 4 * 2048 + 64)
        << lowbit::state_format_name(f) << " rank " << comm().rank();
  }
}

TEST(ShardedOptimizer, MissingGradientIsAClearError) {
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  std::shared_ptr<lo::LowbitOptimizer> inner = std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3));
  ld::ShardedOptimizer sharded(inner, comm_ptr());
  try {
    sharded.step();
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 0 of group 0 has no gradient"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lowbit_test
