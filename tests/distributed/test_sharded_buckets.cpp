// ShardedOptions::overlap: gradients reduce-scattered in buckets by post-accumulate-grad hooks while
// backward() runs. The same bits as one process (and so as the ShardedOptimizer without buckets) for
// every rule and state format, bf16, ZeRO-1, clipping and the non-finite skip; unused parameters,
// micro-batches, released gradients; checkpoints across bucketed and unbucketed runs of other sizes
// (the BucketReshard stages, chained by ctest); clear errors for what cannot work.
#include "dist_util.h"

#include <cstdlib>

#include <lowbit/optim/gradient_release.h>

#include <lowbit/optim/step_calls.h>
#include "../sync_debug.h"

namespace lowbit_test {
namespace {

// Small buckets, so the model (dist_util.h) forms several: 4 of float32, 3 of bfloat16.
ld::ShardedOptions bucketed(int64_t bytes = 8192) {
  ld::ShardedOptions so;
  so.overlap = true;
  so.bucket_bytes = bytes;
  return so;
}

TEST(ShardedBuckets, EveryRuleAndStateFormatMatchesOneProcess) {
  for (const RuleCase& rc : rule_cases())
    for (StateFormat f : lowbit::kAllStateFormats) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, f, false); }, at::kFloat,
                                 bucketed(), 2);
    }
}

TEST(ShardedBuckets, Bf16Zero1AndReleasedGradientsMatchOneProcess) {
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(rc.name);
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q4, true); },
                               at::kBFloat16, bucketed(), 2);
  }
  ld::ShardedOptions zero1 = bucketed();
  zero1.zero1 = true;
  expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[0].make(p, StateFormat::Q8, false); },
                             at::kFloat, zero1, 3);
  // The helper checks that every .grad is gone after backward().
  ld::ShardedOptions release = bucketed(1);  // one parameter per bucket
  release.release_gradients = true;
  expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[1].make(p, StateFormat::Q8, false); },
                             at::kFloat, release, 3);
}

TEST(ShardedBuckets, ClippingAndTheNonFiniteSkipMatchOneProcess) {
  expect_clipping_and_skip_like_one_process(bucketed());
}

TEST(ShardedBuckets, UnusedParametersCountAsZerosAndAreNotSteppedWhereNoRankHasThem) {
  // Parameter 4 never has a gradient; parameter 2 lacks one on rank 0; parameter 1 on the last rank
  // at step 2 only (the bucket must not keep step 1's); parameter 5 (registered last: bucket 0)
  // lacks one everywhere at step 2, which holds back every bucket.
  const int last = comm().size() - 1;
  const GradFn grad = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    if (k == 4 || (k == 2 && r == 0) || (k == 1 && s == 2 && r == last) || (k == 5 && s == 2)) return at::Tensor();
    return rank_grad(r, s, k, shape, dtype);
  };
  for (const RuleCase& rc : rule_cases()) {
    SCOPED_TRACE(rc.name);
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q8, false); },
                               at::kFloat, bucketed(), 3, grad);
  }
  // Where backward() leaves bucket 0 incomplete nothing is reduced in it; step() reduces them all.
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  ld::ShardedOptimizer sharded(std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3)), comm_ptr(), bucketed());
  ASSERT_EQ(sharded.buckets(), 4);
  std::vector<at::Tensor> g;
  for (size_t k = 0; k < params.size(); ++k) g.push_back(k == 5 ? at::Tensor() : at::ones_like(params[k]));
  backward_with(params, g);
  EXPECT_EQ(sharded.buckets_pending(), 4);
  sharded.step();
  EXPECT_EQ(sharded.buckets_pending(), 4);  // the next step's
  EXPECT_TRUE(bitwise_equal(params[5], make_params(at::kFloat, device())[5])) << "unused everywhere: not stepped";
}

// On the GPU, where every rank has every gradient, backward()'s hooks and step() only enqueue work:
// neither waits for the device. (A rank that misses a gradient reads the ranks' counts back, which
// waits; the test above checks what it steps.)
TEST(ShardedBuckets, OverlapStepsNeverSynchronizeWithTheHost) {
  if (!device().is_cuda()) GTEST_SKIP() << "on the GPU (--cuda)";
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  ld::ShardedOptimizer sharded(
      std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3).state_format(StateFormat::Q8).max_grad_norm(1.0)),
      comm_ptr(), bucketed());
  std::vector<std::vector<at::Tensor>> grads(3);  // uploaded before the check: an upload waits
  for (int s = 0; s < 3; ++s)
    for (size_t k = 0; k < params.size(); ++k)
      grads[s].push_back(rank_grad(comm().rank(), s, static_cast<int>(k), params[k].sizes(), at::kFloat).to(device()));
  backward_with(params, grads[0]);
  sharded.step();  // the first step creates the state
  EXPECT_EQ(first_host_sync([&] {
              for (int s = 1; s < 3; ++s) {
                sharded.zero_grad();
                backward_with(params, grads[s]);
                sharded.step();
              }
            }),
            "");
}

// The same for LAMB (whose whole-parameter norms add the ranks' block sums on the device) and for
// the low-bit wire (quantize, exchange, decode and sums all enqueued), with and without overlap.
TEST(ShardedBuckets, LambAndTheLowBitWireNeverSynchronizeWithTheHost) {
  if (!device().is_cuda()) GTEST_SKIP() << "on the GPU (--cuda)";
  for (bool overlap : {true, false})
    for (bool wire : {false, true}) {
      SCOPED_TRACE(c10::str(overlap ? "overlap" : "no overlap", wire ? ", low-bit wire" : ""));
      std::vector<at::Tensor> params = make_params(at::kFloat, device());
      ld::ShardedOptions so = overlap ? bucketed() : ld::ShardedOptions();
      if (wire) {
        so.gradient_wire = ld::WireCompression::gradients();
        so.update_wire = ld::WireCompression::updates(lowbit::QuantFormat::DE4Signed);
      }
      ld::ShardedOptimizer sharded(
          std::make_shared<lo::LAMB>(params, lo::LAMBOptions(1e-3).state_format(StateFormat::Q8).max_grad_norm(1.0)),
          comm_ptr(), so);
      std::vector<std::vector<at::Tensor>> grads(3);  // uploaded before the check: an upload waits
      for (int s = 0; s < 3; ++s)
        for (size_t k = 0; k < params.size(); ++k)
          grads[s].push_back(rank_grad(comm().rank(), s, static_cast<int>(k), params[k].sizes(), at::kFloat).to(device()));
      const auto step = [&](int s) {
        sharded.zero_grad();
        if (overlap) {
          backward_with(params, grads[s]);
        } else {
          for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = grads[s][k];
        }
        sharded.step();
      };
      step(0);  // the first step creates the state
      EXPECT_EQ(first_host_sync([&] {
                  step(1);
                  step(2);
                }),
                "");
    }
}

TEST(ShardedBuckets, AccumulatesMicroBatchesAndReducesOnTheLast) {
  const int rank = comm().rank(), world = comm().size();
  std::vector<at::Tensor> params = make_params(at::kFloat, device()), ref_params = make_params(at::kFloat, device());
  lo::AdamW ref(ref_params, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  ld::ShardedOptimizer sharded(std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8)),
                               comm_ptr(), bucketed());
  constexpr int kMicro = 3;
  for (int s = 1; s <= 2; ++s) {
    sharded.zero_grad();
    for (int mb = 0; mb < kMicro; ++mb) {
      sharded.set_accumulating(mb + 1 < kMicro);
      std::vector<at::Tensor> g;
      for (size_t k = 0; k < params.size(); ++k)
        g.push_back(rank_grad(rank, 10 * s + mb, static_cast<int>(k), params[k].sizes(), at::kFloat));
      backward_with(params, g);
      EXPECT_EQ(sharded.buckets_pending(), mb + 1 < kMicro ? sharded.buckets() : 0) << "micro-batch " << mb;
    }
    // One process: the micro-batches' sum, averaged over the ranks (exact: small multiples of 1/64).
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor sum = at::zeros(params[k].sizes(), at::kFloat);
      for (int r = 0; r < world; ++r) {
        at::Tensor acc = at::zeros(params[k].sizes(), at::kFloat);
        for (int mb = 0; mb < kMicro; ++mb) acc += rank_grad(r, 10 * s + mb, static_cast<int>(k), params[k].sizes(), at::kFloat);
        sum += acc;
      }
      ref_params[k].mutable_grad() = (sum / world).to(device());
    }
    sharded.step();
    ref.step();
  }
  expect_same_as(sharded, params, ref, ref_params);
}

// Both optimizers' states, gathered into one process each through their checkpoints, and their
// parameters: the same bits with and without buckets.
TEST(ShardedBuckets, SameBitsAndCheckpointsAsWithoutBuckets) {
  const std::string tag = "buckets_np" + std::to_string(comm().size());
  std::vector<at::Tensor> pa = make_params(at::kBFloat16, device()), pb = make_params(at::kBFloat16, device());
  const auto make = [](std::vector<at::Tensor>& p) {
    return std::make_shared<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4).bf16_stochastic_round(true));
  };
  ld::ShardedOptimizer plain(make(pa), comm_ptr()), buckets(make(pb), comm_ptr(), bucketed(4096));
  EXPECT_EQ(plain.buckets(), 1);
  EXPECT_GE(buckets.buckets(), 4);
  for (int s = 1; s <= 3; ++s) {
    std::vector<at::Tensor> g;
    for (size_t k = 0; k < pa.size(); ++k) {
      g.push_back(rank_grad(comm().rank(), s, static_cast<int>(k), pa[k].sizes(), at::kBFloat16));
      pa[k].mutable_grad() = g.back().to(device());
    }
    buckets.zero_grad();
    backward_with(pb, g);
    plain.step();
    buckets.step();
  }
  for (size_t k = 0; k < pa.size(); ++k) EXPECT_TRUE(bitwise_equal(pa[k], pb[k])) << "parameter " << k;
  plain.save(tag + "_plain");
  buckets.save(tag + "_buckets");
  std::vector<at::Tensor> qa = make_params(at::kBFloat16, device()), qb = make_params(at::kBFloat16, device());
  auto oa = make(qa), ob = make(qb);
  ld::load_fragments(*oa, tag + "_plain");
  ld::load_fragments(*ob, tag + "_buckets");
  for (size_t k = 0; k < qa.size(); ++k) {
    const lo::ParamState *a = oa->state_of(qa[k]), *b = ob->state_of(qb[k]);
    ASSERT_TRUE(a && b) << "parameter " << k;
    std::vector<at::Tensor> ta, tb;
    lowbit::optim::append_state_range(*a, 0, qa[k].numel(), ta);
    lowbit::optim::append_state_range(*b, 0, qb[k].numel(), tb);
    ASSERT_EQ(ta.size(), tb.size());
    for (size_t t = 0; t < ta.size(); ++t) EXPECT_TRUE(bitwise_equal(ta[t], tb[t])) << "parameter " << k << " tensor " << t;
    EXPECT_EQ(a->step(), b->step());
  }
  // Each into the other: the bucketed optimizer resumes from the plain one's files and vice versa.
  std::vector<at::Tensor> ra = make_params(at::kBFloat16, device()), rb = make_params(at::kBFloat16, device());
  for (size_t k = 0; k < ra.size(); ++k) {
    ra[k].detach().copy_(pa[k].detach());
    rb[k].detach().copy_(pa[k].detach());
  }
  ld::ShardedOptimizer plain2(make(ra), comm_ptr()), buckets2(make(rb), comm_ptr(), bucketed(4096));
  plain2.load(tag + "_buckets");
  buckets2.load(tag + "_plain");
  std::vector<at::Tensor> g;
  for (size_t k = 0; k < ra.size(); ++k) {
    g.push_back(rank_grad(comm().rank(), 4, static_cast<int>(k), ra[k].sizes(), at::kBFloat16));
    ra[k].mutable_grad() = g.back().to(device());
    pa[k].mutable_grad() = g.back().to(device());
  }
  backward_with(rb, g);
  plain.step();
  plain2.step();
  buckets2.step();
  for (size_t k = 0; k < pa.size(); ++k) {
    EXPECT_TRUE(bitwise_equal(pa[k], ra[k])) << "parameter " << k << " (plain from bucketed files)";
    EXPECT_TRUE(bitwise_equal(pa[k], rb[k])) << "parameter " << k << " (bucketed from plain files)";
  }
}

TEST(ShardedBuckets, MixedDtypesFillBucketsOfTheirOwn) {
  // float32 and bfloat16 parameters in one optimizer: buckets of one dtype each, the same bits as
  // the unbucketed optimizer (one buffer per dtype).
  const auto mixed = [] {
    std::vector<at::Tensor> p = make_params(at::kFloat, device());
    for (size_t k = 1; k < p.size(); k += 2) p[k] = p[k].detach().to(at::kBFloat16).set_requires_grad(true);
    return p;
  };
  std::vector<at::Tensor> pa = mixed(), pb = mixed();
  const auto make = [](std::vector<at::Tensor>& p) {
    return std::make_shared<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  };
  ld::ShardedOptimizer plain(make(pa), comm_ptr()), buckets(make(pb), comm_ptr(), bucketed(4000));
  EXPECT_EQ(plain.buckets(), 2);
  EXPECT_GE(buckets.buckets(), 4);
  for (int s = 1; s <= 2; ++s) {
    std::vector<at::Tensor> g;
    for (size_t k = 0; k < pa.size(); ++k) {
      g.push_back(rank_grad(comm().rank(), s, static_cast<int>(k), pa[k].sizes(), pa[k].scalar_type()));
      pa[k].mutable_grad() = g.back().to(device());
    }
    buckets.zero_grad();
    backward_with(pb, g);
    EXPECT_EQ(buckets.buckets_pending(), 0);
    plain.step();
    buckets.step();
  }
  for (size_t k = 0; k < pa.size(); ++k) {
    EXPECT_EQ(pb[k].scalar_type(), pa[k].scalar_type()) << "parameter " << k;
    EXPECT_TRUE(bitwise_equal(pa[k], pb[k])) << "parameter " << k;
  }
}

TEST(ShardedBuckets, InvalidUsesAreClearErrors) {
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  const auto make = [&] { return std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-3)); };
  ld::ShardedOptions negative = bucketed(-1);
  std::string e = error_of([&] { ld::ShardedOptimizer s(make(), comm_ptr(), negative); });
  EXPECT_NE(e.find("ShardedOptions::bucket_bytes must be >= 0 (0: the default), got -1"), std::string::npos) << e;
  params[1].set_requires_grad(false);
  e = error_of([&] { ld::ShardedOptimizer s(make(), comm_ptr(), bucketed()); });
  EXPECT_NE(e.find("(ShardedOptions::overlap): parameter 1 of group 0 is not a leaf tensor that requires grad"),
            std::string::npos) << e;
  params[1].set_requires_grad(true);
  {
    ld::ShardedOptimizer first(make(), comm_ptr(), bucketed());
    e = error_of([&] { ld::ShardedOptimizer second(make(), comm_ptr(), bucketed()); });
    EXPECT_NE(e.find("parameter 0 of group 0 already has a post-accumulate-grad hook"), std::string::npos) << e;
    auto opt = make();
    e = error_of([&] { lo::GradientRelease release(*opt); });
    EXPECT_NE(e.find("already has a post-accumulate-grad hook"), std::string::npos) << e;
    // A second backward() into the same step without set_accumulating.
    std::vector<at::Tensor> g;
    for (const at::Tensor& p : params) g.push_back(at::ones_like(p));
    backward_with(params, g);
    e = error_of([&] { backward_with(params, g); });
    EXPECT_NE(e.find("received a second gradient before step()"), std::string::npos) << e;
    first.step();  // still usable: the first backward's gradients
  }
  // The hooks went with their optimizer.
  auto opt = make();
  EXPECT_EQ(error_of([&] { lo::GradientRelease release(*opt); }), "");
  ld::ShardedOptimizer plain(make(), comm_ptr());
  e = error_of([&] { plain.set_accumulating(true); });
  EXPECT_NE(e.find("set_accumulating is for ShardedOptions::overlap"), std::string::npos) << e;
}

// Checkpoints across bucketed and unbucketed jobs of other sizes: ctest runs stage 0 on 3 ranks with
// buckets, 1 on 2 without, 2 on 1 with, 3 on 3 without (LOWBIT_BUCKET_STAGE), each loading the
// previous stage's files and comparing with one process replaying every step.
constexpr int kRanks[] = {3, 2, 1, 3};
constexpr bool kOverlap[] = {true, false, true, false};

TEST(BucketReshard, Stage) {
  const char* stage_env = std::getenv("LOWBIT_BUCKET_STAGE");
  if (!stage_env) GTEST_SKIP() << "run by the distributed_bucket_reshard_* ctest entries";
  const int stage = std::atoi(stage_env), world = comm().size();
  ASSERT_EQ(world, kRanks[stage]) << "stage " << stage << " runs on " << kRanks[stage] << " ranks";
  const auto make = [](std::vector<at::Tensor>& p) {
    return std::make_shared<lo::Lion>(p, lo::LionOptions(1e-3).weight_decay(0.1).state_format(StateFormat::Q8));
  };
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  if (stage > 0) {
    std::vector<at::Tensor> saved;
    torch::load(saved, "bucket_params_" + std::to_string(stage - 1) + ".pt");
    for (size_t k = 0; k < params.size(); ++k) params[k].detach().copy_(saved[k]);
  }
  ld::ShardedOptimizer sharded(make(params), comm_ptr(), kOverlap[stage] ? bucketed() : ld::ShardedOptions{});
  if (stage > 0) sharded.load("bucket_" + std::to_string(stage - 1));
  std::vector<at::Tensor> ref_params = make_params(at::kFloat, device());
  auto ref = make(ref_params);
  for (int st = 0; st <= stage; ++st)
    for (int s = 2 * st + 1; s <= 2 * st + 2; ++s) {
      for (size_t k = 0; k < ref_params.size(); ++k)
        ref_params[k].mutable_grad() = mean_grad(kRanks[st], s, static_cast<int>(k), ref_params[k].sizes(), at::kFloat).to(device());
      ref->step();
      if (st != stage) continue;
      std::vector<at::Tensor> g;
      for (size_t k = 0; k < params.size(); ++k)
        g.push_back(rank_grad(comm().rank(), s, static_cast<int>(k), params[k].sizes(), at::kFloat));
      sharded.zero_grad();
      if (kOverlap[stage]) {
        backward_with(params, g);
      } else {
        for (size_t k = 0; k < params.size(); ++k) params[k].mutable_grad() = g[k].to(device());
      }
      sharded.step();
    }
  expect_same_as(sharded, params, *ref, ref_params);
  sharded.save("bucket_" + std::to_string(stage));
  if (comm().rank() == 0) {
    std::vector<at::Tensor> out;
    for (const auto& p : params) out.push_back(p.detach().cpu());
    torch::save(out, "bucket_params_" + std::to_string(stage) + ".pt");
  }
  comm().barrier();
}

// ShardedOptions::overlap_thread: the hooks' copies and collectives on the optimizer's own thread
// (the default on a GPU) or on backward()'s (the default on the CPU): the same bits either way.
TEST(ShardedBuckets, HooksOnTheirOwnThreadOrBackwardsMatchOneProcess) {
  const int last = comm().size() - 1;
  const GradFn unused = [last](int r, int s, int k, at::IntArrayRef shape, at::ScalarType dtype) {
    if (k == 4 || (k == 2 && r == 0) || (k == 1 && s == 2 && r == last)) return at::Tensor();
    return rank_grad(r, s, k, shape, dtype);
  };
  for (const bool thread : {true, false}) {
    ld::ShardedOptions so = bucketed();
    so.overlap_thread = thread;
    for (const RuleCase& rc : rule_cases()) {
      SCOPED_TRACE(c10::str(rc.name, thread ? " on the thread" : " on backward()'s thread"));
      expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rc.make(p, StateFormat::Q8, false); },
                                 at::kFloat, so, 3, unused);
    }
    ld::ShardedOptions release = bucketed(1);
    release.overlap_thread = thread;
    release.release_gradients = true;
    expect_same_as_one_process([&](std::vector<at::Tensor>& p) { return rule_cases()[0].make(p, StateFormat::Q4, true); },
                               at::kBFloat16, release, 3);
  }
}

// backward() returns once the thread has issued everything the hooks gave it: no bucket is left
// pending, and a change to .grad after backward() is not seen (as without the thread).
TEST(ShardedBuckets, TheThreadIssuesEverythingBeforeBackwardReturns) {
  ld::ShardedOptions so = bucketed();
  so.overlap_thread = true;
  std::vector<at::Tensor> params = make_params(at::kFloat, device()), ref_params = make_params(at::kFloat, device());
  const auto make = [](std::vector<at::Tensor>& p) { return std::make_shared<lo::AdamW>(p, lo::AdamWOptions(1e-2)); };
  ld::ShardedOptimizer sharded(make(params), comm_ptr(), so), ref(make(ref_params), comm_ptr());
  for (int s = 1; s <= 2; ++s) {
    std::vector<at::Tensor> g;
    for (size_t k = 0; k < params.size(); ++k) {
      g.push_back(rank_grad(comm().rank(), s, static_cast<int>(k), params[k].sizes(), at::kFloat));
      ref_params[k].mutable_grad() = g.back().to(device());
    }
    sharded.zero_grad();
    backward_with(params, g);
    EXPECT_EQ(sharded.buckets_pending(), 0) << "step " << s;
    for (const at::Tensor& p : params) p.grad().fill_(std::numeric_limits<float>::quiet_NaN());
    sharded.step();
    ref.step();
  }
  for (size_t k = 0; k < params.size(); ++k) EXPECT_TRUE(bitwise_equal(params[k], ref_params[k])) << "parameter " << k;
  EXPECT_EQ(sharded.skipped_steps(), 0);
}

// The job's communicator with a reduce_scatter that fails, as a broken link would.
class FailingReduceScatter : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  void reduce_scatter(const at::Tensor&, at::Tensor&, ld::ReduceOp) override {
    TORCH_CHECK(false, "reduce_scatter failed on this link");
  }
};

TEST(ShardedBuckets, AFailureOnTheThreadEndsBackwardWithItsError) {
  ld::ShardedOptions so = bucketed();
  so.overlap_thread = true;
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  ld::ShardedOptimizer sharded(std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-2)),
                               std::make_shared<FailingReduceScatter>(comm_ptr()), so);
  std::vector<at::Tensor> g;
  for (size_t k = 0; k < params.size(); ++k)
    g.push_back(rank_grad(comm().rank(), 1, static_cast<int>(k), params[k].sizes(), at::kFloat));
  const std::string e = error_of([&] { backward_with(params, g); });
  EXPECT_NE(e.find("reduce_scatter failed on this link"), std::string::npos) << e;
}

TEST(ShardedBuckets, AThreadWithoutOverlapIsRefused) {
  ld::ShardedOptions so;
  so.overlap_thread = true;
  std::vector<at::Tensor> params = make_params(at::kFloat, device());
  const std::string e = error_of(
      [&] { ld::ShardedOptimizer s(std::make_shared<lo::AdamW>(params, lo::AdamWOptions(1e-2)), comm_ptr(), so); });
  EXPECT_NE(e.find("ShardedOptions::overlap_thread is true without overlap"), std::string::npos) << e;
}

}  // namespace
}  // namespace lowbit_test
