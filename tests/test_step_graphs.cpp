// Step graphs (optim/step_graph.h): once a GPU step's inputs repeat, the optimizer records the step
// as a CUDA graph and replays it. Replays must give the bits of steps run as they come, whatever
// changes between steps: lr (a scheduler), the gradients' values and addresses, skipped steps,
// options, a loaded checkpoint. The CPU never records. GPU tests are skipped without a GPU.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <sstream>

#include <lowbit/lowbit.h>

#include "gpu_step_params.h"
#include "test_util.h"

using lowbit::StateFormat;
namespace lo = lowbit::optim;

namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

using lowbit_test::make_params;
using lowbit_test::to_cuda;

// The first difference between two optimizers' parameters and state ("" if none).
std::string differences(const lo::LowbitOptimizer& a, const std::vector<at::Tensor>& pa, const lo::LowbitOptimizer& b,
                        const std::vector<at::Tensor>& pb) {
  std::ostringstream why;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (!lowbit_test::bitwise_equal(pa[i].cpu(), pb[i].cpu())) why << "param " << i << "; ";
    const lo::ParamState *sa = a.state_of(pa[i]), *sb = b.state_of(pb[i]);
    if (!sa || !sb) continue;
    if (!lowbit_test::bitwise_equal(sa->counters.cpu(), sb->counters.cpu())) why << "param " << i << " counters; ";
    for (size_t k = 0; k < sa->slots.size(); ++k) {
      const lo::StateSlot &x = sa->slots[k], &y = sb->slots[k];
      if (x.type.storage == lowbit::kernels::SlotStorage::Quant) {
        if (!lowbit_test::bitwise_equal(x.quantized.codes().cpu(), y.quantized.codes().cpu()) ||
            !lowbit_test::bitwise_equal(x.quantized.absmax().cpu(), y.quantized.absmax().cpu()))
          why << "param " << i << " slot " << k << "; ";
      } else if (x.defined() && !lowbit_test::bitwise_equal(x.dense.cpu(), y.dense.cpu())) {
        why << "param " << i << " slot " << k << "; ";
      }
    }
  }
  if (a.skipped_steps() != b.skipped_steps()) why << "skipped " << a.skipped_steps() << " vs " << b.skipped_steps();
  return why.str();
}

// Two optimizers over copies of the same parameters, one with step graphs (the default), one
// without, stepped together with the same gradients.
template <typename Opt>
struct Pair {
  std::vector<at::Tensor> pg, pe;  // graphed, eager
  std::vector<at::Tensor> gg, ge;  // their gradients (buffers written in place unless replaced)
  std::unique_ptr<Opt> graphed, eager;

  template <typename Options>
  Pair(const std::vector<at::Tensor>& init, const Options& o) : pg(to_cuda(init)), pe(to_cuda(init)) {
    for (size_t i = 0; i < init.size(); ++i) {
      gg.push_back(at::zeros_like(pg[i]));
      ge.push_back(at::zeros_like(pe[i]));
      pg[i].mutable_grad() = gg[i];
      pe[i].mutable_grad() = ge[i];
    }
    graphed = std::make_unique<Opt>(pg, o);
    eager = std::make_unique<Opt>(pe, o);
    eager->set_step_graphs(false);
  }
  // Fresh gradient values, written into the buffers (the addresses stay), scaled by `scale`.
  void fill(double scale, bool poison = false) {
    for (size_t i = 0; i < pg.size(); ++i) {
      at::Tensor g = (at::randn(pg[i].sizes()) * scale).to(pg[i].scalar_type());
      if (poison && g.numel() > 0) g.view(-1)[g.numel() / 2] = NAN;
      gg[i].copy_(g.cuda());
      ge[i].copy_(g.cuda());
    }
  }
  // New gradient tensors (new addresses).
  void replace_grads() {
    for (size_t i = 0; i < pg.size(); ++i) {
      gg[i] = at::zeros_like(pg[i]);
      ge[i] = at::zeros_like(pe[i]);
      pg[i].mutable_grad() = gg[i];
      pe[i].mutable_grad() = ge[i];
    }
  }
  void step() {
    graphed->step();
    eager->step();
  }
  std::string diff() const { return differences(*graphed, pg, *eager, pe); }
};

void set_lr(lo::LowbitOptimizer& o, double lr) {
  for (auto& g : o.param_groups()) g.options().set_lr(lr);
}

}  // namespace

// Replays equal steps run as they come for every rule and the state formats, with lr changed before
// every step, a step skipped for a NaN, and clipping.
TEST(StepGraphs, ReplaysEqualStepsRunAsTheyCome) {
  SKIP_WITHOUT_CUDA();
  const auto run = [](auto& pair, const char* what) {
    SCOPED_TRACE(what);
    for (int s = 0; s < 7; ++s) {
      set_lr(*pair.graphed, 1e-2 * (1.0 - 0.1 * s));
      set_lr(*pair.eager, 1e-2 * (1.0 - 0.1 * s));
      pair.fill(0.1 + 0.02 * s, /*poison=*/s == 4);
      pair.step();
      ASSERT_EQ(pair.diff(), "") << "step " << s;
    }
    // The first step makes the state and the second repeats nothing yet: both run as they come.
    // The third is recorded (and run by one replay); the other four replay it.
    EXPECT_EQ(pair.graphed->step_graph_replays(), 5);
    EXPECT_EQ(pair.eager->step_graph_replays(), 0);
    EXPECT_EQ(pair.graphed->skipped_steps(), 1);
  };
  for (StateFormat f : {StateFormat::FP32, StateFormat::BF16, StateFormat::Q8, StateFormat::Q4, StateFormat::FP8,
                        StateFormat::C8}) {
    Pair<lo::AdamW> p(make_params(at::kFloat), lo::AdamWOptions(1e-2).max_grad_norm(1.0).state_format(f));
    run(p, lowbit::state_format_name(f));
  }
  {
    Pair<lo::AdamW> p(make_params(at::kBFloat16), lo::AdamWOptions(1e-2).master_weight_bits(24));
    run(p, "bf16 + 24-bit master");
  }
  {
    Pair<lo::AdamW> p(make_params(at::kBFloat16), lo::AdamWOptions(1e-2).bf16_stochastic_round(true));
    run(p, "bf16, stochastic rounding");
  }
  {
    Pair<lo::LAMB> p(make_params(at::kFloat), lo::LAMBOptions(1e-2));
    run(p, "LAMB");
  }
  {
    Pair<lo::AdEMAMix> p(make_params(at::kFloat), lo::AdEMAMixOptions(1e-2).t_alpha_beta3(5));
    run(p, "AdEMAMix");
  }
  {
    Pair<lo::SGD> p(make_params(at::kHalf), lo::SGDOptions(1e-2).momentum(0.9).nesterov(true));
    run(p, "SGD fp16");
  }
}

// New gradient addresses, other options or a parameter without a gradient drop the recording; the
// steps stay those run as they come.
TEST(StepGraphs, ChangedInputsRunAsTheyCome) {
  SKIP_WITHOUT_CUDA();
  Pair<lo::AdamW> p(make_params(at::kFloat), lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  for (int s = 0; s < 16; ++s) {
    if (s == 5 || s == 9) p.replace_grads();
    if (s == 7) {
      for (auto* o : {p.graphed.get(), p.eager.get()})
        static_cast<lo::AdamWOptions&>(o->param_groups()[0].options()).weight_decay(0.5);
    }
    if (s == 12) {
      p.pg[3].mutable_grad() = at::Tensor();
      p.pe[3].mutable_grad() = at::Tensor();
    }
    p.fill(0.1);
    p.step();
    ASSERT_EQ(p.diff(), "") << "step " << s;
  }
  EXPECT_GT(p.graphed->step_graph_replays(), 0);
  EXPECT_EQ(p.graphed->state_of(p.pg[3])->step(), 12);
}

// A loaded checkpoint replaces the state a recording points to: the recording must go.
TEST(StepGraphs, LoadingACheckpointDropsTheRecording) {
  SKIP_WITHOUT_CUDA();
  Pair<lo::AdamW> p(make_params(at::kFloat), lo::AdamWOptions(1e-2).state_format(StateFormat::Q4));
  std::stringstream saved;
  for (int s = 0; s < 6; ++s) {
    p.fill(0.1);
    p.step();
    if (s == 1) torch::save(*p.eager, saved);
  }
  ASSERT_GT(p.graphed->step_graph_replays(), 0);
  const std::string bytes = saved.str();
  for (auto* o : {p.graphed.get(), p.eager.get()}) {
    std::stringstream in(bytes);
    torch::load(*o, in);
  }
  for (int s = 0; s < 5; ++s) {
    p.fill(0.1);
    p.step();
    ASSERT_EQ(p.diff(), "") << "step " << s << " after the load";
  }
  EXPECT_EQ(p.graphed->state_of(p.pg[2])->step(), 2 + 5);
}

// Steps inside a user's own capture are captured there, as they come (no graph inside a graph).
TEST(StepGraphs, StepsInsideAUsersCaptureRunAsTheyCome) {
  SKIP_WITHOUT_CUDA();
  Pair<lo::AdamW> p(make_params(at::kFloat), lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  for (int s = 0; s < 4; ++s) {  // the optimizer holds a recording of its own by now
    p.fill(0.1);
    p.step();
  }
  const int64_t replays = p.graphed->step_graph_replays();
  ASSERT_GT(replays, 0);
  at::cuda::CUDAGraph graph;
  {
    const c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
    graph.capture_begin();
    p.graphed->step();
    graph.capture_end();
  }
  EXPECT_EQ(p.graphed->step_graph_replays(), replays);
  for (int s = 0; s < 3; ++s) {
    p.fill(0.1);
    graph.replay();
    p.eager->step();
  }
  torch::cuda::synchronize();
  EXPECT_EQ(p.diff(), "");
}

// The CPU records nothing.
TEST(StepGraphs, CpuStepsAreNeverRecorded) {
  std::vector<at::Tensor> params = make_params(at::kFloat);
  lo::AdamW opt(params, lo::AdamWOptions(1e-2));
  for (auto& t : params) t.mutable_grad() = at::randn_like(t);
  for (int s = 0; s < 4; ++s) opt.step();
  EXPECT_EQ(opt.step_graph_replays(), 0);
  EXPECT_EQ(opt.state_of(params[0])->step(), 4);
}
