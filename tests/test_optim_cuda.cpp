// The fused step on CUDA (kernels/cuda/step_kernel.cuh) against the CPU kernel, bit for bit:
// every rule x state format x parameter dtype, odd sizes, tensors smaller than a block, empty
// ones, thousands of tiny ones, large blocks, clipping; no host synchronization inside a step;
// CUDA graph capture; parameters on two devices; checkpoints across devices. Skipped without a GPU.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <sstream>

#include <lowbit/optim/step_testing.h>
#include <lowbit/tensors/optim_ops.h>

#if LOWBIT_TEST_CUDA_KERNELS
#include <lowbit/kernels/cuda/optim_step_cuda.h>
#endif

#include "gpu_step_params.h"
#include "rule_cases.h"
#include "sync_debug.h"
#include "test_util.h"

using lowbit::StateFormat;
namespace lo = lowbit::optim;

namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

const auto& kAllFormats = lowbit::kAllStateFormats;

using lowbit_test::make_params;
using lowbit_test::to_cuda;

// Steps a CPU and a CUDA optimizer made by `make` with the same gradients; returns a description of
// the first difference in parameters or state ("" if none).
// grad_dtypes: the gradients' dtypes, parameter by parameter (the parameters' own where left out).
template <typename Make>
std::string compare_cpu_cuda(Make make, std::vector<at::Tensor> pc, int steps, bool reference_too = false,
                             const std::vector<at::ScalarType>& grad_dtypes = {}) {
  std::vector<at::Tensor> pg = to_cuda(pc), pr = to_cuda(pc);
  auto a = make(pc);
  auto b = make(pg);
  auto r = make(pr);
  if (reference_too) lo::StepTesting::use_reference_step(*r, true);
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < pc.size(); ++i) {
      const at::Tensor g =
          (at::randn(pc[i].sizes()) * 0.1).to(i < grad_dtypes.size() ? grad_dtypes[i] : pc[i].scalar_type());
      pc[i].mutable_grad() = g;
      pg[i].mutable_grad() = g.cuda();
      pr[i].mutable_grad() = g.cuda();
    }
    a->step();
    b->step();
    if (reference_too) r->step();
  }
  std::ostringstream why;
  for (size_t i = 0; i < pc.size(); ++i) {
    if (!lowbit_test::bitwise_equal(pc[i], pg[i].cpu())) why << "param " << i << " differs; ";
    if (reference_too && !lowbit_test::bitwise_equal(pr[i].cpu(), pg[i].cpu())) why << "reference param " << i << " differs; ";
    const lo::ParamState* sa = a->state_of(pc[i]);
    const lo::ParamState* sb = b->state_of(pg[i]);
    if (!sa || !sb) continue;
    if (sa->step() != sb->step()) why << "param " << i << " step " << sa->step() << " vs " << sb->step() << "; ";
    for (size_t k = 0; k < sa->slots.size(); ++k) {
      const lo::StateSlot &x = sa->slots[k], &y = sb->slots[k];
      if (x.type != y.type) why << "param " << i << " slot " << k << " type; ";
      if (x.type.storage == lowbit::kernels::SlotStorage::Quant) {
        if (!lowbit_test::bitwise_equal(x.quantized.codes(), y.quantized.codes().cpu()))
          why << "param " << i << " slot " << k << " codes; ";
        if (!lowbit_test::bitwise_equal(x.quantized.absmax(), y.quantized.absmax().cpu()))
          why << "param " << i << " slot " << k << " absmax; ";
      } else if (x.defined() && !lowbit_test::bitwise_equal(x.dense, y.dense.cpu())) {
        why << "param " << i << " slot " << k << " values; ";
      }
    }
  }
  return why.str();
}

}  // namespace

TEST(OptimCuda, EveryRuleFormatAndDtypeEqualsTheCpuKernel) {
  SKIP_WITHOUT_CUDA();
  for (const auto& rc : lowbit_test::rule_cases()) {
    for (StateFormat f : kAllFormats) {
      for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
        for (bool sr : {false, true}) {
          if (sr && dt != at::kBFloat16) continue;
          SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f) + " " + c10::toString(dt) +
                       (sr ? " SR" : ""));
          const bool with_reference = dt == at::kFloat && !sr;  // the ATen reference on CUDA, once per case
          EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return rc.make(p, f, sr); }, make_params(dt), 3, with_reference), "");
        }
      }
    }
  }
}

// bf16 parameters take a kernel compiled for their gradients' dtype, master-weight correction and
// rounding (kernels/cuda/step_args.cuh: Companions) where every gradient of a launch is bf16, else the
// kernel that reads those at run time. Both equal the CPU kernel bit for bit: every rule and
// quantized family, each way to store the parameter, gradients of each dtype and of mixed dtypes
// in one group.
TEST(OptimCuda, BfloatParametersWithGradientsOfEveryDtypeEqualTheCpuKernel) {
  SKIP_WITHOUT_CUDA();
  const std::vector<at::Tensor> params = make_params(at::kBFloat16);
  const size_t n = params.size();
  const std::vector<std::pair<const char*, std::vector<at::ScalarType>>> grads = {
      {"bf16", std::vector<at::ScalarType>(n, at::kBFloat16)},
      {"fp32", std::vector<at::ScalarType>(n, at::kFloat)},
      {"fp16", std::vector<at::ScalarType>(n, at::kHalf)},
      {"mixed", {at::kBFloat16, at::kFloat, at::kBFloat16, at::kHalf, at::kBFloat16}}};
  for (const auto& rc : lowbit_test::rule_cases()) {
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::C8}) {
      for (int mode = 0; mode < 4; ++mode) {  // nearest, stochastic, 24-bit master, 32-bit master
        for (const auto& g : grads) {
          SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f) + " mode " + std::to_string(mode) +
                       " grads " + g.first);
          const auto make = [&](std::vector<at::Tensor>& p) {
            auto opt = rc.make(p, f, mode == 1);
            if (mode >= 2) lowbit_test::set_master_bits(*opt, mode == 2 ? 24 : 32);
            return opt;
          };
          std::vector<at::Tensor> pc;
          for (const auto& t : params) pc.push_back(t.clone());
          EXPECT_EQ(compare_cpu_cuda(make, pc, 3, false, g.second), "");
        }
      }
    }
  }
}

TEST(OptimCuda, ClippingMaximizeAndAmsgradEqualTheCpuKernel) {
  SKIP_WITHOUT_CUDA();
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4, StateFormat::FP8, StateFormat::C8}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).max_grad_norm(0.5).maximize(true).amsgrad(true).state_format(f)); },
                               make_params(at::kFloat), 3), "");
    EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::LAMB>(p, lo::LAMBOptions(1e-2).max_grad_norm(0.5).state_format(f)); },
                               make_params(at::kBFloat16), 3), "");
  }
}

TEST(OptimCuda, BlockSizesFromSmallToLargerThanAWarpHolds) {
  SKIP_WITHOUT_CUDA();
  for (int64_t block : {32, 64, 512, 4096}) {
    for (StateFormat f : {StateFormat::Q8, StateFormat::Q4}) {
      SCOPED_TRACE(std::to_string(block) + " " + lowbit::state_format_name(f));
      EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).block_size(block).state_format(f)); },
                                 make_params(at::kFloat), 3), "");
      EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::LAMB>(p, lo::LAMBOptions(1e-2).block_size(block).state_format(f)); },
                                 make_params(at::kFloat), 2), "");
    }
  }
}

// bf16 values rounded to nearest on the GPU (vector_io.cuh: pack_bf16x8, one instruction per pair
// where no value is NaN) equal the CPU's from_f32: ties, subnormals, values that overflow to Inf,
// NaN among the 8 values of a lane and alone (the CPU's 0x7FC0), parameters and bf16 state.
TEST(OptimCuda, BfloatRoundingOfExtremeValuesEqualsTheCpuKernel) {
  SKIP_WITHOUT_CUDA();
  // Normal values, subnormal ones, ones near bf16's largest, ties (1 + k 2^-8 in steps of 2^-8),
  // and the specials; 1031 of them, so lanes hold a NaN with other values and a last odd lane.
  const int64_t n = 1031;
  at::Tensor v = at::randn({n});
  v.narrow(0, 100, 200).mul_(1e-39);   // subnormal
  v.narrow(0, 300, 200).mul_(1e38);    // near the largest; SGD's huge lr takes some past it
  v.narrow(0, 500, 256).copy_(at::arange(256, at::kFloat).mul(0x1p-8).add(1.0));
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-45f, 0x1.FEp127f, -0x1.FEp127f};
  for (int k = 0; k < 9; ++k) v[800 + 3 * k] = specials[k];  // 0x1.FEp127: bf16's largest
  v[1030] = NAN;
  const at::Tensor params = v.to(at::kBFloat16);
  const auto one = [&] { return std::vector<at::Tensor>{params.clone(), params.narrow(0, 1, n - 1).clone()}; };
  for (double lr : {1.0 / 3, 1e-38, 1e37}) {
    SCOPED_TRACE("SGD lr " + std::to_string(lr));
    EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::SGD>(p, lo::SGDOptions(lr)); }, one(), 2), "");
  }
  for (StateFormat f : {StateFormat::Q8, StateFormat::BF16}) {
    for (double lr : {1e-2, 1e-38}) {
      SCOPED_TRACE(std::string("AdamW ") + lowbit::state_format_name(f) + " lr " + std::to_string(lr));
      EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(lr).state_format(f)); },
                                 one(), 2), "");
    }
  }
}

TEST(OptimCuda, ThousandsOfTinyTensorsInOneGroup) {
  SKIP_WITHOUT_CUDA();
  std::vector<at::Tensor> params;
  for (int i = 0; i < 3000; ++i) params.push_back(at::randn({1 + (i * 37) % 300}));
  for (int i = 0; i < 5; ++i) params.push_back(at::randn({5000 + 123 * i}));
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).max_grad_norm(1.0).state_format(f)); },
                               params, 2), "");
  }
  // bf16 parameters rounded stochastically: each parameter's rounding seed is its own, so a step
  // value that the prologue (several launches over 3005 parameters) left in another parameter's
  // scratch entry changes the bits.
  std::vector<at::Tensor> half;
  for (const at::Tensor& p : params) half.push_back(p.to(at::kBFloat16));
  EXPECT_EQ(compare_cpu_cuda([&](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).bf16_stochastic_round(true).state_format(StateFormat::Q8)); },
                             half, 2), "");
}

// No step after the first reads anything back to the host: libtorch's sync debug mode, set to
// error, throws on any synchronizing call.
TEST(OptimCuda, StepsNeverSynchronizeWithTheHost) {
  SKIP_WITHOUT_CUDA();
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4}) {
    std::vector<at::Tensor> p = to_cuda(make_params(at::kFloat));
    lo::LAMB lamb(p, lo::LAMBOptions(1e-2).max_grad_norm(1.0).state_format(f));
    std::vector<at::Tensor> q = to_cuda(make_params(at::kBFloat16));
    lo::AdamW adamw(q, lo::AdamWOptions(1e-2).bf16_stochastic_round(true).state_format(f));
    const auto grads = [](std::vector<at::Tensor>& ps) {
      for (auto& t : ps) t.mutable_grad() = at::randn_like(t) * 0.1;
    };
    grads(p);
    grads(q);
    lamb.step();  // the first step creates state and tables
    adamw.step();
    const std::string err = lowbit_test::first_host_sync([&] {
      for (int s = 0; s < 3; ++s) {
        lamb.step();
        adamw.step();
      }
    });
    EXPECT_EQ(err, "") << lowbit::state_format_name(f);
    EXPECT_EQ(lamb.state_of(p[2])->step(), 4);
  }
}

// One captured step, replayed with lr changed by a scheduler between replays, equals eager steps.
TEST(OptimCuda, CapturedStepsReplayLikeEagerSteps) {
  SKIP_WITHOUT_CUDA();
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    const std::vector<at::Tensor> init = make_params(at::kFloat);
    std::vector<at::Tensor> pe = to_cuda(init), pg = to_cuda(init);
    lo::AdamW eager(pe, lo::AdamWOptions(1e-2).max_grad_norm(1.0).state_format(f));
    lo::AdamW graphed(pg, lo::AdamWOptions(1e-2).max_grad_norm(1.0).state_format(f));
    torch::optim::StepLR se(eager, 1, 0.7), sg(graphed, 1, 0.7);
    std::vector<at::Tensor> grads;
    for (auto& t : pg) grads.push_back(at::zeros_like(t));
    for (size_t i = 0; i < pg.size(); ++i) pg[i].mutable_grad() = grads[i];  // static gradient buffers
    const auto fill = [&](int s) {
      for (size_t i = 0; i < pg.size(); ++i) {
        const at::Tensor g = at::randn(init[i].sizes(), at::TensorOptions().dtype(at::kFloat)) * (0.1 + 0.01 * s);
        grads[i].copy_(g.cuda());
        pe[i].mutable_grad() = g.cuda();
      }
    };
    // Warm-up step, eager on both (tables and state created), then capture one step.
    fill(0);
    eager.step();
    graphed.step();
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
      c10::cuda::CUDAStreamGuard guard(stream);
      graph.capture_begin();
      graphed.step();
      graph.capture_end();
    }
    for (int s = 1; s <= 4; ++s) {
      se.step();
      sg.step();
      fill(s);
      graphed.refresh_lr();
      graph.replay();
      eager.step();
    }
    torch::cuda::synchronize();
    for (size_t i = 0; i < pe.size(); ++i) EXPECT_TRUE(lowbit_test::bitwise_equal(pe[i].cpu(), pg[i].cpu())) << i;
    EXPECT_EQ(graphed.state_of(pg[2])->step(), 5);  // warm-up + the capture's own step is not run: 1 + 4
  }
}

// A group holding CPU and CUDA parameters steps each on its device, as if apart.
TEST(OptimCuda, ParametersOnSeveralDevicesInOneGroup) {
  SKIP_WITHOUT_CUDA();
  std::vector<at::Tensor> cpu = make_params(at::kFloat);
  std::vector<at::Tensor> mixed = {cpu[0].clone(), cpu[1].clone().cuda(), cpu[2].clone(), cpu[3].clone().cuda(),
                                   cpu[4].clone()};
  if (torch::cuda::device_count() > 1) mixed[4] = mixed[4].to(at::Device(at::kCUDA, 1));
  // (No clipping: its norm adds the devices' partial sums, which may round differently.)
  lo::AdamW a(cpu, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  lo::AdamW b(mixed, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < cpu.size(); ++i) {
      const at::Tensor g = at::randn(cpu[i].sizes()) * 0.1;
      cpu[i].mutable_grad() = g;
      mixed[i].mutable_grad() = g.to(mixed[i].device());
    }
    a.step();
    b.step();
  }
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(lowbit_test::bitwise_equal(cpu[i], mixed[i].cpu())) << i;
}

// A checkpoint written over CUDA parameters resumes on CPU parameters (and back), bit-exact.
TEST(OptimCuda, CheckpointsMoveBetweenDevices) {
  SKIP_WITHOUT_CUDA();
  for (StateFormat f : {StateFormat::Q8, StateFormat::Q4, StateFormat::BF16}) {
    const std::vector<at::Tensor> init = make_params(at::kFloat);
    std::vector<at::Tensor> pg = to_cuda(init), pc;
    lo::AdamW g(pg, lo::AdamWOptions(1e-2).state_format(f));
    const auto grads = [](int s, const at::Tensor& like) {
      return at::ones(like.sizes()) * std::sin(1.0 + s + like.numel() % 7);
    };
    for (int s = 0; s < 2; ++s) {
      for (auto& t : pg) t.mutable_grad() = grads(s, t).cuda();
      g.step();
    }
    std::stringstream buf;
    torch::save(g, buf);
    for (const auto& t : pg) pc.push_back(t.cpu());
    lo::AdamW c(pc, lo::AdamWOptions(1e-2).state_format(f));
    torch::load(c, buf);
    for (int s = 2; s < 4; ++s) {
      for (size_t i = 0; i < pg.size(); ++i) {
        pg[i].mutable_grad() = grads(s, pg[i]).cuda();
        pc[i].mutable_grad() = grads(s, pc[i]);
      }
      g.step();
      c.step();
    }
    for (size_t i = 0; i < pg.size(); ++i)
      EXPECT_TRUE(lowbit_test::bitwise_equal(pc[i], pg[i].cpu())) << lowbit::state_format_name(f) << " " << i;
  }
}

// A non-finite gradient on the GPU skips the step there too, and is counted when asked.
TEST(OptimCuda, NonFiniteGradientsSkipOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  std::vector<at::Tensor> p = to_cuda(make_params(at::kFloat));
  const std::vector<at::Tensor> before = {p[2].clone()};
  lo::AdamW opt(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8));
  for (auto& t : p) t.mutable_grad() = at::randn_like(t);
  p[3].mutable_grad()[5][7] = std::numeric_limits<float>::infinity();
  opt.step();
  EXPECT_TRUE(lowbit_test::bitwise_equal(p[2].cpu(), before[0].cpu()));
  EXPECT_EQ(opt.skipped_steps(), 1);
  EXPECT_EQ(opt.state_of(p[2])->step(), 0);
}

// The gradient pre-pass alone (lowbit::grad_check) finds one NaN or infinity wherever it sits:
// every gradient dtype, the first, last and ragged-tail element of a gradient, one not 16-byte
// aligned, the 300th of 450 gradients (two launches of descriptors), and a gradient after
// thousands of elements of others in one thread block's run; the largest finite values are not
// flagged. Its sums of squares equal the CPU's bits.
TEST(OptimCuda, GradientCheckFindsEveryNonFiniteValue) {
  SKIP_WITHOUT_CUDA();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    // More small gradients than one launch checks (600 on CUDA): the marked places below sit on both
    // sides of every launch's edge.
    constexpr int kSmall = 1250;
    std::vector<at::Tensor> grads;
    for (int i = 0; i < kSmall; ++i) grads.push_back(at::randn({i % 7 == 0 ? 37 : 8 + i % 5}).to(dt));
    grads.push_back(at::randn({1 << 20}).to(dt));
    grads.push_back(at::randn({70001}).to(dt));
    const at::Tensor backing = at::randn({4099}).to(dt);
    const int64_t last = static_cast<int64_t>(grads.size());
    const std::vector<int64_t> groups(grads.size() + 1, 0);
    const auto check = [&](const std::vector<at::Tensor>& g, bool want_sumsq) {
      std::vector<at::Tensor> on_gpu;
      for (const auto& t : g) on_gpu.push_back(t.cuda());
      on_gpu.back() = on_gpu.back().narrow(0, 1, 4097);  // a view 2 or 4 bytes past its storage's start
      auto [found, sumsq] = lowbit::ops::grad_check(on_gpu, groups, 1, want_sumsq);
      return std::make_pair(found.cpu().item<float>(), sumsq.cpu());
    };
    std::vector<at::Tensor> all = grads;
    all.push_back(backing);
    for (const bool want_sumsq : {false, true}) {
      EXPECT_EQ(check(all, want_sumsq).first, 0.0f) << dt;
      std::vector<at::Tensor> cpu_all = all;
      cpu_all.back() = cpu_all.back().narrow(0, 1, 4097);
      if (want_sumsq) {
        auto [found_cpu, sumsq_cpu] = lowbit::ops::grad_check(cpu_all, groups, 1, true);
        EXPECT_TRUE(lowbit_test::bitwise_equal(sumsq_cpu, check(all, true).second)) << dt;
      }
    }
    const double big = dt == at::kHalf ? 65504.0 : (dt == at::kBFloat16 ? 3.3895313892515355e38 : 3.4028234663852886e38);
    struct Where {
      int64_t tensor, index;
    };
    const std::vector<Where> places = {{0, 0},          {0, 36},           {299, 3},           {599, 7},
                                       {600, 0},        {1199, 5},         {1200, 2},          {kSmall - 1, 7},
                                       {kSmall, 0},     {kSmall, (1 << 20) - 1}, {kSmall, 12345}, {kSmall + 1, 70000},
                                       {kSmall + 1, 69999}, {last, 0},     {last, 4096},       {last, 2001}};
    for (const Where w : places) {
      for (const float bad : {inf, -inf, nan}) {
        std::vector<at::Tensor> g = all;
        g[w.tensor] = g[w.tensor].clone();
        // The unaligned view starts at element 1 of the backing tensor.
        g[w.tensor][w.tensor == last ? w.index + 1 : w.index] = bad;
        EXPECT_EQ(check(g, false).first, 1.0f) << dt << " tensor " << w.tensor << " index " << w.index << " " << bad;
        EXPECT_EQ(check(g, true).first, 1.0f) << dt << " tensor " << w.tensor << " index " << w.index << " " << bad;
      }
      std::vector<at::Tensor> g = all;
      g[w.tensor] = g[w.tensor].clone();
      g[w.tensor][w.tensor == last ? w.index + 1 : w.index] = -big;
      EXPECT_EQ(check(g, false).first, 0.0f) << dt << " the largest finite value at " << w.tensor << " " << w.index;
    }
  }
}

// Quantized state that overflows on the GPU is reported when the host asks (check_overflow, save,
// or every n steps), never by waiting in the step itself.
#if LOWBIT_TEST_CUDA_KERNELS
// The step kernels' division and square root (kernels/cuda/speculative_arith.cuh) against the IEEE
// operations, bit for bit, wherever they report their operands in range: the square root over every
// float of its range, the quotient over random pairs with random exponents (2^26 of them, the
// ranges' edges and zeros included); and the range is where the step's values live.
namespace {
struct SpeculativeResults {
  at::Tensor quotient, root, reciprocal, ok;
};
SpeculativeResults speculate(const at::Tensor& a, const at::Tensor& b) {
  SpeculativeResults r{at::empty_like(a), at::empty_like(a), at::empty_like(a),
                       at::empty(a.sizes(), a.options().dtype(at::kByte))};
  const char* err = lowbit::kernels::speculative_arith_gpu(a.data_ptr<float>(), b.data_ptr<float>(), a.numel(),
                                                           r.quotient.data_ptr<float>(), r.root.data_ptr<float>(),
                                                           r.reciprocal.data_ptr<float>(), r.ok.data_ptr<uint8_t>(),
                                                           c10::cuda::getCurrentCUDAStream().stream());
  EXPECT_EQ(err, nullptr) << err;
  return r;
}
// Elements where `ok` has `bit` and the bits differ.
int64_t mismatches(const at::Tensor& got, const at::Tensor& want, const at::Tensor& ok, int bit) {
  const at::Tensor in_range = ok.bitwise_and(bit).ne(0);
  return (got.view(at::kInt).ne(want.view(at::kInt)) & in_range).sum().item<int64_t>();
}
at::Tensor floats_of_bits(const at::Tensor& bits) { return bits.to(at::kInt).view(at::kFloat); }

// Every float whose bits lie in [first, last], and 16 past each end, through the short sequences:
// bit `bit` of their `ok` must mark exactly that range, and `result` there must be `ieee`'s bits.
template <typename Result, typename Ieee>
void expect_exact_over_range(int64_t first, int64_t last, int bit, Result result, Ieee ieee) {
  const auto dev = at::TensorOptions().device(at::kCUDA);
  const int64_t chunk = int64_t(1) << 26;
  int64_t checked = 0, bad = 0;
  for (int64_t lo = first - 16; lo <= last + 16; lo += chunk) {
    const int64_t hi = std::min(lo + chunk, last + 17);
    const at::Tensor x = floats_of_bits(at::arange(lo, hi, dev.dtype(at::kLong)));
    const SpeculativeResults r = speculate(x, at::ones_like(x));
    bad += mismatches(result(r), ieee(x), r.ok, bit);
    checked += r.ok.bitwise_and(bit).ne(0).sum().item<int64_t>();
  }
  EXPECT_EQ(checked, last - first + 1);  // the range is all of it, and only it
  EXPECT_EQ(bad, 0);
}
}  // namespace

TEST(OptimCuda, SpeculativeSqrtIsTheIeeeSqrtOverItsWholeRange) {
  SKIP_WITHOUT_CUDA();
  const auto dev = at::TensorOptions().device(at::kCUDA);
  expect_exact_over_range(0x0D000000, 0x7F7FFFFF, 2, [](const SpeculativeResults& r) { return r.root; },
                          [](const at::Tensor& x) { return x.sqrt(); });
  // Outside: zeros, subnormals, negatives, Inf, NaN are reported out of range.
  const at::Tensor odd = at::tensor({0.0f, -0.0f, 1e-40f, -1.0f, INFINITY, NAN, 0x1p-102f}, dev.dtype(at::kFloat));
  EXPECT_EQ(speculate(odd, at::ones_like(odd)).ok.bitwise_and(2).sum().item<int64_t>(), 0);
}

// The reciprocal of the step's block scales (kernels/cuda/step_tables.cuh: step_normalizer) over every
// float of its range, biased exponents 1 .. 252 (they use 42 .. 191), against 1 / x.
TEST(OptimCuda, ShortReciprocalIsTheIeeeReciprocalOverItsWholeRange) {
  SKIP_WITHOUT_CUDA();
  const auto dev = at::TensorOptions().device(at::kCUDA);
  expect_exact_over_range(0x00800000, 0x7E7FFFFF, 4, [](const SpeculativeResults& r) { return r.reciprocal; },
                          [](const at::Tensor& x) { return at::ones_like(x) / x; });
  const at::Tensor odd = at::tensor({0.0f, -1.0f, 1e-40f, 0x1p126f, INFINITY, NAN}, dev.dtype(at::kFloat));
  EXPECT_EQ(speculate(odd, at::ones_like(odd)).ok.bitwise_and(4).sum().item<int64_t>(), 0);
}

TEST(OptimCuda, SpeculativeDivisionIsTheIeeeDivisionInItsRange) {
  SKIP_WITHOUT_CUDA();
  const auto dev = at::TensorOptions().device(at::kCUDA);
  at::manual_seed(11);
  const int64_t n = int64_t(1) << 26;
  // Random signs, exponents 2^-66 .. 2^66 and fraction bits, so the ranges' edges are crossed.
  const auto random_floats = [&](bool positive) {
    const at::Tensor sign = positive ? at::zeros({n}, dev.dtype(at::kLong)) : at::randint(0, 2, {n}, dev.dtype(at::kLong));
    const at::Tensor exponent = at::randint(127 - 66, 127 + 67, {n}, dev.dtype(at::kLong));
    const at::Tensor fraction = at::randint(0, int64_t(1) << 23, {n}, dev.dtype(at::kLong));
    return floats_of_bits(sign * (int64_t(1) << 31) + exponent * (int64_t(1) << 23) + fraction);
  };
  at::Tensor a = random_floats(false), b = random_floats(true);
  a.slice(0, 0, 1000).zero_();
  a.slice(0, 1000, 2000).fill_(-0.0f);
  a.slice(0, 2000, 3000).fill_(0x1p-62f);
  b.slice(0, 3000, 4000).fill_(0x1p62f);
  SpeculativeResults r = speculate(a, b);
  EXPECT_EQ(mismatches(r.quotient, a / b, r.ok, 1), 0);
  const int64_t in_range = r.ok.bitwise_and(1).ne(0).sum().item<int64_t>();
  EXPECT_GT(in_range, n / 2);
  // The same pairs on the CPU (IEEE by definition there), a slice of them.
  const at::Tensor as = a.slice(0, 0, 1 << 20).cpu(), bs = b.slice(0, 0, 1 << 20).cpu();
  EXPECT_EQ(mismatches(r.quotient.slice(0, 0, 1 << 20).cpu(), as / bs, r.ok.slice(0, 0, 1 << 20).cpu(), 1), 0);
  // -0 / b is -0 (the form nvcc's short sequence gets wrong), and out-of-range operands report so.
  EXPECT_TRUE(std::signbit(r.quotient[1000].item<float>()));
  const at::Tensor odd_a = at::tensor({1.0f, 1.0f, 1.0f, 1e-40f, 0x1p63f, NAN, 1.0f}, dev.dtype(at::kFloat));
  const at::Tensor odd_b = at::tensor({0.0f, -1.0f, 0x1p63f, 1.0f, 1.0f, 1.0f, INFINITY}, dev.dtype(at::kFloat));
  EXPECT_EQ(speculate(odd_a, odd_b).ok.bitwise_and(1).sum().item<int64_t>(), 0);
}
#endif

// The kernels skip the search for negative values in a second-moment block when nothing negative
// can come out of it (state_slots.h: nonneg_update_slots): only from a block whose old absmax is
// valid. A block flagged negative (as a checkpoint may hold it) decodes to values <= 0, and the
// step then makes negative ones: the CUDA step must flag the block as the CPU does. Blocks in the
// middle and the ragged last one; blocks smaller than a warp's unit (Q4), of one unit (Q8), and
// larger than one (4096).
TEST(OptimCuda, SecondMomentBlocksFlaggedNegativeStayFlagged) {
  SKIP_WITHOUT_CUDA();
  struct Case {
    const char* name;
    std::vector<int> slots;  // the second moments (amsgrad: both, or its maximum stays >= 0)
    std::function<std::unique_ptr<lo::LowbitOptimizer>(std::vector<at::Tensor>&)> make;
  };
  const std::vector<Case> cases = {
      {"AdamW Q8", {1}, [](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q8)); }},
      {"AdamW Q4", {1}, [](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).state_format(StateFormat::Q4)); }},
      {"AdamW Q8 amsgrad", {1, 2}, [](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).amsgrad(true).state_format(StateFormat::Q8)); }},
      {"AdamW Q8 block 4096", {1}, [](auto& p) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions(1e-2).block_size(4096).state_format(StateFormat::Q8)); }},
      {"LAMB Q8", {1}, [](auto& p) { return std::make_unique<lo::LAMB>(p, lo::LAMBOptions(1e-2).state_format(StateFormat::Q8)); }},
      {"AdEMAMix Q8", {2}, [](auto& p) { return std::make_unique<lo::AdEMAMix>(p, lo::AdEMAMixOptions(1e-2).state_format(StateFormat::Q8)); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<at::Tensor> pc = {at::randn({70001})}, pg = to_cuda(pc);
    auto a = c.make(pc);
    auto b = c.make(pg);
    // The CPU optimizer reports bad blocks after its step (which it has taken): expected once
    // blocks are flagged. The CUDA one reports when asked (check_overflow).
    const auto step = [&](bool flagged) {
      const at::Tensor g = at::randn({70001}) * 0.1;
      pc[0].mutable_grad() = g;
      pg[0].mutable_grad() = g.cuda();
      if (flagged) {
        EXPECT_THROW(a->step(), c10::Error);
      } else {
        a->step();
      }
      b->step();
    };
    const auto absmax = [](lo::LowbitOptimizer& o, const at::Tensor& p, int k) {
      return o.state_of(p)->slots[k].quantized.absmax();  // shares the state's storage
    };
    step(false);
    const int64_t last = absmax(*a, pc[0], c.slots[0]).numel() - 1;
    for (int k : c.slots) {
      for (lo::LowbitOptimizer* o : {a.get(), b.get()}) {
        const at::Tensor m = absmax(*o, o == a.get() ? pc[0] : pg[0], k);
        for (int64_t block : {int64_t(2), last}) m[block].fill_(-m[block].item<float>());  // flagged, in place
      }
    }
    step(true);
    for (int k : c.slots) {
      SCOPED_TRACE("slot " + std::to_string(k));
      const at::Tensor want = absmax(*a, pc[0], k), got = absmax(*b, pg[0], k).cpu();
      // The scenario makes negative values (else this test could not fail): the CPU flags both.
      ASSERT_LT(want[2].item<float>(), 0.0f);
      ASSERT_LT(want[last].item<float>(), 0.0f);
      EXPECT_TRUE(lowbit_test::bitwise_equal(want, got));
      EXPECT_TRUE(lowbit_test::bitwise_equal(a->state_of(pc[0])->slots[k].quantized.codes(),
                                             b->state_of(pg[0])->slots[k].quantized.codes().cpu()));
    }
  }
}

TEST(OptimCuda, StateOverflowIsReportedWhenAsked) {
  SKIP_WITHOUT_CUDA();
  const auto overflowing = [] {
    at::Tensor g = at::randn({8192});
    g[300] = 1e20;  // finite, but its square is not
    return g.cuda();
  };
  const std::string want = "the state of parameter 0 of group 0 (shape [8192]) overflowed to Inf/NaN in 1 block(s) at step 1";
  const auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string();
  };
  std::vector<at::Tensor> p = {at::randn({8192}).cuda()};
  lo::Adagrad a(p, lo::AdagradOptions(0.1).state_format(StateFormat::Q8));
  p[0].mutable_grad() = overflowing();
  EXPECT_EQ(message([&] { a.step(); }), "");
  EXPECT_NE(message([&] { a.check_overflow(); }).find(want), std::string::npos);
  EXPECT_EQ(message([&] { a.check_overflow(); }), "");  // once

  std::vector<at::Tensor> q = {at::randn({8192}).cuda()};
  lo::Adagrad b(q, lo::AdagradOptions(0.1).state_format(StateFormat::Q8));
  b.set_overflow_check_interval(1);
  q[0].mutable_grad() = overflowing();
  EXPECT_NE(message([&] { b.step(); }).find(want), std::string::npos);

  std::vector<at::Tensor> r = {at::randn({8192}).cuda()};
  lo::Adagrad c(r, lo::AdagradOptions(0.1).state_format(StateFormat::Q8));
  r[0].mutable_grad() = overflowing();
  c.step();
  std::stringstream buf;
  EXPECT_NE(message([&] { torch::save(c, buf); }).find(want), std::string::npos);
}
