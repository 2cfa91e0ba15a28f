// Master-weight correction (option master_weight_bits; kernels/common/master_weight.h): the
// split / rebuild on raw bit patterns, the ATen reference against the kernel functions, the
// 32-bit mode against an fp32-master optimizer bit for bit (every rule x state format), the 24-bit
// mode within its written bound, CPU == CUDA, checkpoints, and the errors.
#include <cmath>
#include <random>
#include <sstream>

#include <lowbit/kernels/common/master_weight.h>
#include <lowbit/kernels/cpu/optim_step_parts.h>
#include <lowbit/optim/step_testing.h>
#include <lowbit/tensors/optim_ops.h>

#include "rule_cases.h"
#include "test_util.h"

namespace {

using namespace lowbit_test;
namespace lk = lowbit::kernels;
namespace lo = lowbit::optim;

uint32_t bits_of(float x) { return lk::f32_bits(x); }

// Random fp32 bit patterns of every kind: normals of all exponents, subnormals, zeros, the top of
// the range, infinities (no NaN: their payloads are not kept, by design).
std::vector<uint32_t> pattern_sample(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> v = {0u, 0x80000000u, 1u, 0x80000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
                             0x7F7F8000u, 0x7F7F7FFFu, 0x7F800000u, 0xFF800000u, 0x3F808000u, 0x3F818000u,
                             0x3F800080u, 0x3F800180u, 0x3F807F80u, 0x7F7FFF80u, 0x7F7FFF7Fu};
  while (static_cast<int>(v.size()) < n) {
    uint32_t u = rng();
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) continue;  // NaN
    v.push_back(u);
  }
  return v;
}

TEST(MasterWeight, ThirtyTwoBitSplitIsExactAndRoundsToNearest) {
  for (uint32_t u : pattern_sample(200000, 1)) {
    const float x = lk::f32_from_bits(u);
    uint16_t b;
    int16_t c;
    lk::master_to16(x, &b, &c);
    ASSERT_EQ(bits_of(lk::master_from16(b, c)), u) << std::hex << u;
    // b is the nearest bf16 (ties away from zero): no other bf16 is closer in bit distance.
    const int64_t d = static_cast<int64_t>(u) - (static_cast<int64_t>(b) << 16);
    ASSERT_TRUE(d >= -32768 && d <= 32767) << std::hex << u;
    if ((u & 0xFFFFu) != 0x8000u) ASSERT_EQ(b, lk::from_f32<lk::bf16_t>(x).bits) << std::hex << u;
  }
}

TEST(MasterWeight, TwentyFourBitSplitIsWithinItsBound) {
  int inexact = 0;
  for (uint32_t u : pattern_sample(200000, 2)) {
    const float x = lk::f32_from_bits(u);
    uint16_t b;
    int8_t c;
    lk::master_to8(x, &b, &c);
    const float m = lk::master_from8(b, c);
    const uint32_t mu = bits_of(m);
    // The master is x rounded to 24 bits: its low 8 bits are 0 and it is within 128 units of x.
    ASSERT_EQ(mu & 0xFFu, 0u) << std::hex << u;
    if (std::isinf(m) && !std::isinf(x)) {
      ASSERT_GE(u & 0x7FFFFFFFu, 0x7F7FFF80u) << std::hex << u;  // past the largest 24-bit value
      continue;
    }
    const int64_t d = std::llabs(static_cast<int64_t>(mu) - static_cast<int64_t>(u));
    ASSERT_LE(d, 128) << std::hex << u;
    if (std::isnormal(x)) ASSERT_LE(std::fabs(static_cast<double>(m) - x), std::ldexp(std::fabs(x), -16)) << std::hex << u;
    inexact += d != 0;
    // b is the nearest bf16 of the master: splitting the master again gives the same (b, c).
    uint16_t b2;
    int8_t c2;
    lk::master_to8(m, &b2, &c2);
    ASSERT_EQ(b2, b);
    ASSERT_EQ(c2, c);
  }
  EXPECT_GT(inexact, 100000);  // the mode does drop bits
}

TEST(MasterWeight, NanMastersStoreTheCanonicalNan) {
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0xFFFFFFFFu, 0x7FFFFFFFu}) {
    uint16_t b;
    int16_t c16;
    int8_t c8;
    lk::master_to16(lk::f32_from_bits(u), &b, &c16);
    EXPECT_EQ(b, static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7FC0u));
    EXPECT_EQ(c16, 0);
    lk::master_to8(lk::f32_from_bits(u), &b, &c8);
    EXPECT_EQ(b, static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7FC0u));
    EXPECT_EQ(c8, 0);
  }
}

// The ATen helpers (the reference step's and export / load's) give the kernel functions' bits.
TEST(MasterWeight, AtenHelpersEqualTheKernelFunctions) {
  std::vector<uint32_t> v = pattern_sample(50000, 3);
  v.push_back(0x7FC00000u);
  v.push_back(0xFFC12345u);
  at::Tensor x = at::empty({static_cast<int64_t>(v.size())}, at::kFloat);
  std::memcpy(x.data_ptr(), v.data(), v.size() * 4);
  for (int bits : {16, 8}) {
    at::Tensor b = at::empty(x.sizes(), at::kBFloat16);
    at::Tensor c = at::empty(x.sizes(), bits == 16 ? at::kShort : at::kChar);
    lowbit::ops::store_master(x, b, c);
    const at::Tensor m = lowbit::ops::master_values(b, c);
    const uint16_t* bp = reinterpret_cast<const uint16_t*>(b.data_ptr());
    for (size_t i = 0; i < v.size(); ++i) {
      uint16_t kb;
      float km;
      int32_t kc;
      if (bits == 16) {
        int16_t k;
        lk::master_to16(lk::f32_from_bits(v[i]), &kb, &k);
        kc = k;
        km = lk::master_from16(kb, k);
        ASSERT_EQ(c.data_ptr<int16_t>()[i], kc) << i;
      } else {
        int8_t k;
        lk::master_to8(lk::f32_from_bits(v[i]), &kb, &k);
        kc = k;
        km = lk::master_from8(kb, k);
        ASSERT_EQ(c.data_ptr<int8_t>()[i], kc) << i;
      }
      ASSERT_EQ(bp[i], kb) << bits << " " << std::hex << v[i];
      ASSERT_EQ(bits_of(m.data_ptr<float>()[i]), bits_of(km)) << bits << " " << std::hex << v[i];
    }
  }
}

// ---- the optimizers ---------------------------------------------------------------------------

const std::vector<StateFormat> kFormats(std::begin(lowbit::kAllStateFormats), std::end(lowbit::kAllStateFormats));

// Initial fp32 weights of a few shapes (odd sizes, one below min_quant_numel), extreme ones included.
std::vector<at::Tensor> initial_weights() {
  std::vector<at::Tensor> w = {random_input(5000), random_input(777) * 1e-3, random_input(4096 + 130) * 3};
  w[0][0] = 3.0e4f;  // large, but no rule's state overflows (Adam squares wd * p)
  w[0][1] = -1e-40f;  // subnormal
  w[0][2] = 0.0f;
  w[2][5] = -2.5e-38f;
  return w;
}

// Gradients representable in bf16 (what a bf16 model's backward gives), as bf16 and as fp32.
std::vector<at::Tensor> bf16_grads(const std::vector<at::Tensor>& like) {
  std::vector<at::Tensor> g;
  for (const auto& t : like) g.push_back(random_input(t.numel()).to(at::kBFloat16));
  return g;
}

struct MasterPair {
  std::vector<at::Tensor> fp32, bf16;
  std::unique_ptr<lo::LowbitOptimizer> ref, corrected;
};

// An fp32-master optimizer and a bf16 one with a correction, from the same weights.
MasterPair make_master_pair(const RuleCase& rc, StateFormat f, int64_t bits, at::Device device) {
  MasterPair p;
  for (const at::Tensor& w : initial_weights()) {
    p.fp32.push_back(w.to(device).clone().requires_grad_(true));
    p.bf16.push_back(w.to(device, at::kBFloat16).requires_grad_(true));
  }
  p.ref = rc.make(p.fp32, f, false);
  p.corrected = rc.make(p.bf16, f, false);
  set_master_bits(*p.corrected, bits);
  for (size_t i = 0; i < p.bf16.size(); ++i) p.corrected->load_master_fp32(p.bf16[i], p.fp32[i].detach());
  return p;
}

void step_both(MasterPair& p, int steps) {
  for (int s = 0; s < steps; ++s) {
    const auto g = bf16_grads(p.fp32);
    for (size_t i = 0; i < g.size(); ++i) {
      p.fp32[i].mutable_grad() = g[i].to(p.fp32[i].device(), at::kFloat);
      p.bf16[i].mutable_grad() = g[i].to(p.bf16[i].device());
    }
    p.ref->step();
    p.corrected->step();
  }
}

TEST(MasterWeight, ThirtyTwoBitModeStepsLikeFp32MastersForEveryRuleAndFormat) {
  for (const RuleCase& rc : rule_cases()) {
    for (StateFormat f : kFormats) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      torch::manual_seed(7);
      MasterPair p = make_master_pair(rc, f, 32, at::kCPU);
      step_both(p, 4);
      for (size_t i = 0; i < p.fp32.size(); ++i) {
        const at::Tensor master = p.corrected->export_master_fp32(p.bf16[i]);
        ASSERT_TRUE(bitwise_equal(master, p.fp32[i].detach())) << "parameter " << i;
        // The bf16 parameter is its master's nearest bf16, ties away from zero (adding half a bf16
        // ulp to the magnitude bits; no element here is near the overflow to Inf).
        const at::Tensor bits = master.contiguous().view(at::kInt);
        const at::Tensor away = at::bitwise_and(at::bitwise_right_shift(bits + 0x8000, 16), 0xFFFF);
        const at::Tensor got = at::bitwise_and(p.bf16[i].detach().contiguous().view(at::kShort).to(at::kInt), 0xFFFF);
        EXPECT_TRUE(at::equal(away, got)) << "parameter " << i;
        const auto a = p.ref->export_state_fp32(p.fp32[i]);
        const auto b = p.corrected->export_state_fp32(p.bf16[i]);
        // b lists the unused moment slots before the correction too (undefined).
        ASSERT_GE(b.size(), a.size());
        for (size_t k = 0; k < b.size(); ++k) {
          if (k >= a.size() || !a[k].defined()) {
            ASSERT_FALSE(b[k].defined()) << "slot " << k;
            continue;
          }
          ASSERT_TRUE(bitwise_equal(a[k], b[k])) << "slot " << k;
        }
      }
      // The correction is state: 2 bytes per element on top of the moments.
      int64_t n = 0;
      for (const auto& t : p.fp32) n += t.numel();
      EXPECT_EQ(p.corrected->state_bytes(), p.ref->state_bytes() + 2 * n);
    }
  }
}

// The 24-bit mode: Adam's update does not depend on the master (no weight decay), so after t
// steps the master is within t roundings of 2^-16 |x| (master_weight.h) of the fp32 master.
TEST(MasterWeight, TwentyFourBitModeStaysWithinItsBound) {
  for (StateFormat f : kFormats) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    torch::manual_seed(11);
    RuleCase rc{"Adam", [](auto& p, StateFormat fmt, bool) { return std::make_unique<lo::Adam>(p, lo::AdamOptions(1e-2).state_format(fmt)); }, {}};
    MasterPair p = make_master_pair(rc, f, 24, at::kCPU);
    std::vector<at::Tensor> max_abs;
    for (const auto& t : p.fp32) max_abs.push_back(t.detach().abs());
    const int steps = 6;
    for (int s = 0; s < steps; ++s) {
      step_both(p, 1);
      for (size_t i = 0; i < p.fp32.size(); ++i) max_abs[i] = at::maximum(max_abs[i], p.fp32[i].detach().abs());
    }
    int64_t differ = 0;
    for (size_t i = 0; i < p.fp32.size(); ++i) {
      const at::Tensor x = p.fp32[i].detach().to(at::kDouble);
      const at::Tensor m = p.corrected->export_master_fp32(p.bf16[i]).to(at::kDouble);
      // Each of the steps + 1 roundings (the initial load too) moves the master by at most 2^-16 of
      // its magnitude (or 2^-142 for subnormals).
      const at::Tensor bound = (max_abs[i].to(at::kDouble) * std::ldexp(1.0, -16) + std::ldexp(1.0, -142)) * (steps + 1);
      const at::Tensor err = (m - x).abs();
      ASSERT_TRUE(at::all(err <= bound).item<bool>())
          << "parameter " << i << ": worst excess " << (err - bound).max().item<double>();
      differ += (err > 0).sum().item<int64_t>();
      // Far closer than the bf16 parameter alone.
      const at::Tensor bf = p.bf16[i].detach().to(at::kDouble);
      EXPECT_LT(err.sum().item<double>() * 16, (bf - x).abs().sum().item<double>() + 1e-30);
    }
    EXPECT_GT(differ, 0);
  }
}

TEST(MasterWeight, ReferencePathGivesTheFusedBits) {
  for (int64_t bits : {32, 24}) {
    for (StateFormat f : {StateFormat::Q8, StateFormat::FP32}) {
      const RuleCase rc = rule_cases()[1];  // AdamW with maximize
      torch::manual_seed(3);
      MasterPair a = make_master_pair(rc, f, bits, at::kCPU);
      torch::manual_seed(3);
      MasterPair b = make_master_pair(rc, f, bits, at::kCPU);
      lo::StepTesting::use_reference_step(*b.corrected, true);
      torch::manual_seed(5);
      step_both(a, 3);
      torch::manual_seed(5);
      step_both(b, 3);
      for (size_t i = 0; i < a.bf16.size(); ++i) {
        ASSERT_TRUE(bitwise_equal(a.bf16[i].detach(), b.bf16[i].detach())) << bits << " " << i;
        ASSERT_TRUE(bitwise_equal(a.corrected->export_master_fp32(a.bf16[i]), b.corrected->export_master_fp32(b.bf16[i])));
      }
    }
  }
}

TEST(MasterWeight, CheckpointsCarryTheCorrectionAndResumeBitExactly) {
  for (int64_t bits : {32, 24}) {
    const RuleCase rc = rule_cases()[0];
    torch::manual_seed(13);
    MasterPair p = make_master_pair(rc, StateFormat::Q8, bits, at::kCPU);
    step_both(p, 2);
    std::stringstream buf;
    {
      torch::serialize::OutputArchive out;
      p.corrected->save(out);
      out.save_to(buf);
    }
    // A fresh optimizer over copies of the parameters, loaded from the checkpoint.
    std::vector<at::Tensor> copy;
    for (const auto& t : p.bf16) copy.push_back(t.detach().clone().requires_grad_(true));
    auto resumed = rc.make(copy, StateFormat::Q8, false);
    set_master_bits(*resumed, bits);
    {
      torch::serialize::InputArchive in;
      in.load_from(buf);
      resumed->load(in);
    }
    for (size_t i = 0; i < copy.size(); ++i)
      ASSERT_TRUE(bitwise_equal(resumed->export_master_fp32(copy[i]), p.corrected->export_master_fp32(p.bf16[i])));
    for (int s = 0; s < 2; ++s) {
      const auto g = bf16_grads(p.bf16);
      for (size_t i = 0; i < g.size(); ++i) {
        p.bf16[i].mutable_grad() = g[i];
        copy[i].mutable_grad() = g[i].clone();
      }
      p.corrected->step();
      resumed->step();
    }
    for (size_t i = 0; i < copy.size(); ++i) {
      ASSERT_TRUE(bitwise_equal(copy[i].detach(), p.bf16[i].detach()));
      ASSERT_TRUE(bitwise_equal(resumed->export_master_fp32(copy[i]), p.corrected->export_master_fp32(p.bf16[i])));
    }
    // Into an optimizer without the option (or with the other mode): refused, nothing changes.
    auto other = rc.make(copy, StateFormat::Q8, false);
    set_master_bits(*other, bits == 32 ? 0 : 32);
    torch::serialize::InputArchive in;
    buf.seekg(0);
    in.load_from(buf);
    try {
      other->load(in);
      FAIL() << "loaded a checkpoint whose correction the options do not ask for";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("master_weight_bits"), std::string::npos) << e.what();
    }
    EXPECT_EQ(other->state_bytes(), 0);
  }
}

// memory_report: each kind in bytes and per parameter, corrections apart from the state.
// The CPU plan counts a corrected parameter's moment slots in use, not the launch's slots up to the
// correction: AdamW's two quantized moments with an int8 correction make a two-slot task, which the
// vector loops step in their pipelined loop (with the empty third slot counted they fell to the
// per-block loop: the same bits, at about half the speed).
TEST(MasterWeight, CorrectedTasksCountOnlyTheirMoments) {
  const int64_t n = 1000;
  std::vector<uint16_t> param(n, 0x3F80), grad(n, 0x3A83);
  std::vector<int8_t> correction(n, 0);
  std::vector<uint8_t> codes[2] = {std::vector<uint8_t>(n), std::vector<uint8_t>(n)};
  std::vector<float> absmax[2] = {std::vector<float>(4), std::vector<float>(4)};
  int64_t counters[2] = {0, 0};
  double lr = 1e-3;
  lk::StepParamRef ref;
  ref.param = param.data();
  ref.grad = grad.data();
  ref.grad_type = lk::ElemType::BF16;
  ref.numel = n;
  ref.counters = counters;
  ref.correction = correction.data();
  for (int k = 0; k < 2; ++k) {
    ref.slot[k] = codes[k].data();
    ref.absmax[k] = absmax[k].data();
  }
  lk::StepLaunch launch;
  launch.config.rule = lk::Rule::AdamW;
  launch.param_type = lk::ElemType::BF16;
  launch.block_size = 256;
  launch.lr = &lr;
  launch.slots[0] = {lk::SlotStorage::Quant, lowbit::QuantFormat::Dyn8Signed};
  launch.slots[1] = {lk::SlotStorage::Quant, lowbit::QuantFormat::Dyn8Unsigned};
  launch.slots[lk::kCorrectionSlot] = {lk::SlotStorage::Int8, lowbit::QuantFormat::Dyn8Signed};
  launch.num_slots = lk::kMaxSlots;  // as the ops make it: the correction is the last slot
  launch.params = &ref;
  launch.n = 1;
  const lk::StepPlan plan(launch);
  EXPECT_EQ(plan.tasks[0].num_slots, 2);
  EXPECT_EQ(plan.tasks[0].slots[lk::kCorrectionSlot].storage, lk::SlotStorage::Int8);
}

TEST(MasterWeight, MemoryReportCountsEachKind) {
  const int64_t big = 5000, small = 100;  // small: below min_quant_numel, fp32 state
  at::Tensor a = at::randn({big}).to(at::kBFloat16), b = at::randn({small}).to(at::kBFloat16);
  lo::AdamW opt({a, b}, lo::AdamWOptions(1e-3).master_weight_bits(24).state_format(StateFormat::Q8));
  lo::MemoryReport r = opt.memory_report();
  EXPECT_EQ(r.parameters, big + small);
  EXPECT_EQ(r.weight_bytes, 2 * (big + small));
  EXPECT_EQ(r.gradient_bytes, 0);
  EXPECT_EQ(r.state_bytes + r.correction_bytes, 0);  // state is made by the first step
  a.mutable_grad() = at::randn({big}).to(at::kBFloat16);
  b.mutable_grad() = at::randn({small}).to(at::kBFloat16);
  opt.step();
  r = opt.memory_report();
  EXPECT_EQ(r.gradient_bytes, 2 * (big + small));
  EXPECT_EQ(r.correction_bytes, big + small);  // one int8 per element
  EXPECT_EQ(r.state_bytes + r.correction_bytes, opt.state_bytes());
  // Q8 for a (codes + one fp32 absmax per 256), fp32 for b: exp_avg and exp_avg_sq each.
  EXPECT_EQ(r.state_bytes, 2 * (big + 4 * ((big + 255) / 256)) + 2 * 4 * small);
  EXPECT_NEAR(r.per_parameter(r.total_bytes()), double(r.total_bytes()) / (big + small), 1e-12);
  EXPECT_NE(r.to_string().find("correction"), std::string::npos);
}

TEST(MasterWeight, BadOptionsAreClearErrors) {
  const auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      FAIL() << "no error; expected one mentioning " << needle;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  std::vector<at::Tensor> fp32 = {at::randn({64}).requires_grad_(true)};
  std::vector<at::Tensor> bf16 = {at::randn({64}).to(at::kBFloat16).requires_grad_(true)};
  fp32[0].mutable_grad() = at::randn({64});
  bf16[0].mutable_grad() = at::randn({64}).to(at::kBFloat16);
  expect_error([&] { lo::AdamW(fp32, lo::AdamWOptions().master_weight_bits(32)).step(); }, "needs bfloat16");
  expect_error([&] { lo::AdamW(bf16, lo::AdamWOptions().master_weight_bits(16)).step(); }, "master_weight_bits must be");
  expect_error([&] { lo::AdamW(bf16, lo::AdamWOptions().master_weight_bits(24).bf16_stochastic_round(true)).step(); },
               "bf16_stochastic_round");
  expect_error([&] { lo::AdamW(bf16, lo::AdamWOptions()).load_master_fp32(bf16[0], at::randn({64})); },
               "no master-weight correction");
  expect_error([&] { lo::AdamW(bf16, lo::AdamWOptions().master_weight_bits(32)).load_master_fp32(bf16[0], at::randn({65})); },
               "shape");
  // The op itself: a correction outside the last slot, or for an fp32 parameter.
  lowbit::ops::StepArgs a;
  a.config.rule = lk::Rule::SGD;
  a.params = {at::zeros({8}, at::kBFloat16)};
  a.grads = {at::zeros({8}, at::kBFloat16)};
  a.counters = {at::zeros({2}, at::kLong)};
  a.lr = at::full({1}, 0.1, at::kDouble);
  a.slots = {lk::SlotType{lk::SlotStorage::Int16}};
  a.state = {at::zeros({8}, at::kShort)};
  expect_error([&] { lowbit::ops::optim_step(a); }, "last slot only");
  a.slots = {lk::SlotType{}, lk::SlotType{}, lk::SlotType{}, lk::SlotType{lk::SlotStorage::F32}};
  a.state = {at::zeros({8})};
  expect_error([&] { lowbit::ops::optim_step(a); }, "only a master-weight correction");
  a.slots = {lk::SlotType{}, lk::SlotType{}, lk::SlotType{}, lk::SlotType{lk::SlotStorage::Int8}};
  a.state = {at::zeros({8}, at::kShort)};
  expect_error([&] { lowbit::ops::optim_step(a); }, "must be Char");
  a.params = {at::zeros({8})};
  a.grads = {at::zeros({8})};
  a.state = {at::zeros({8}, at::kChar)};
  expect_error([&] { lowbit::ops::optim_step(a); }, "needs bfloat16 parameters");
}

// ---- CUDA: the same bits as the CPU kernel --------------------------------------------------------

TEST(MasterWeightCuda, EveryRuleAndFormatEqualsTheCpuKernel) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t bits : {32, 24}) {
    for (const RuleCase& rc : rule_cases()) {
      for (StateFormat f : kFormats) {
        SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f) + " " + std::to_string(bits));
        torch::manual_seed(17);
        MasterPair cpu = make_master_pair(rc, f, bits, at::kCPU);
        torch::manual_seed(17);
        MasterPair gpu = make_master_pair(rc, f, bits, at::kCUDA);
        for (int s = 0; s < 3; ++s) {
          const auto g = bf16_grads(cpu.bf16);
          for (size_t i = 0; i < g.size(); ++i) {
            cpu.bf16[i].mutable_grad() = g[i];
            gpu.bf16[i].mutable_grad() = g[i].to(at::kCUDA);
          }
          cpu.corrected->step();
          gpu.corrected->step();
        }
        for (size_t i = 0; i < cpu.bf16.size(); ++i) {
          ASSERT_TRUE(bitwise_equal(cpu.bf16[i].detach(), gpu.bf16[i].detach())) << "parameter " << i;
          ASSERT_TRUE(bitwise_equal(cpu.corrected->export_master_fp32(cpu.bf16[i]),
                                    gpu.corrected->export_master_fp32(gpu.bf16[i])));
          const auto a = cpu.corrected->export_state_fp32(cpu.bf16[i]);
          const auto b = gpu.corrected->export_state_fp32(gpu.bf16[i]);
          for (size_t k = 0; k < a.size(); ++k)
            if (a[k].defined()) ASSERT_TRUE(bitwise_equal(a[k], b[k])) << "slot " << k;
        }
      }
    }
  }
}

}  // namespace
