// The step interface (tensors/optim_ops.h): the step count and lr live in tensors and per-step
// values are derived where the step runs, with the same bits as a host-driven call of the CPU
// kernel; a block-aligned range of a parameter, stepped with its element offset (and the whole
// parameter's LAMB / clipping inputs), equals the same range of the whole parameter's step.
#include <lowbit/kernels/cpu/optim_step_cpu.h>
#include <lowbit/kernels/cpu/optim_step_parts.h>
#include <lowbit/optim/step_testing.h>
#include <lowbit/tensors/blockwise_ops.h>
#include <lowbit/tensors/optim_ops.h>

#include <cmath>
#include <limits>

#include "rule_cases.h"
#include "test_util.h"

using lowbit::StateFormat;
namespace lo = lowbit::optim;
namespace lk = lowbit::kernels;

using lowbit_test::RuleCase;
using lowbit_test::rule_cases;

namespace {

// The state of one parameter as plain tensors, laid out as the optimizer lays it out.
struct RawState {
  std::vector<lk::SlotType> slots;
  std::vector<at::Tensor> tensors;  // per used slot: values, or codes then absmax
  int64_t block = 1024;
};

RawState fresh_state(const lk::StepConfig& c, StateFormat f, int64_t n) {
  RawState s;
  const lk::RuleSlots rs = lk::rule_slots(c);
  if (lowbit::is_quantized(f)) s.block = lowbit::default_block_size(lowbit::quant_format_for(f, true));
  for (int k = 0; k < rs.count; ++k) {
    if (!rs.used[k]) {
      s.slots.push_back({});
      continue;
    }
    if (lowbit::is_quantized(f)) {
      const auto qf = lowbit::quant_format_for(f, rs.is_signed[k]);
      s.slots.push_back({lk::SlotStorage::Quant, qf});
      const lowbit::QTensor q = lowbit::quantize(at::zeros({n}), qf, s.block);
      s.tensors.push_back(q.codes().clone());
      s.tensors.push_back(q.absmax().clone());
    } else {
      const bool bf16 = f == StateFormat::BF16;
      s.slots.push_back({bf16 ? lk::SlotStorage::BF16 : lk::SlotStorage::F32});
      s.tensors.push_back(at::zeros({n}, bf16 ? at::kBFloat16 : at::kFloat));
    }
  }
  return s;
}

// Slot k's tensors of a RawState, flat, narrowed to elements [begin, begin + len).
std::vector<at::Tensor> narrowed(const RawState& s, int64_t begin, int64_t len) {
  std::vector<at::Tensor> out;
  size_t t = 0;
  for (const auto& type : s.slots) {
    if (type.storage == lk::SlotStorage::None) continue;
    if (type.storage == lk::SlotStorage::Quant) {
      const bool four = lowbit::format_bits(type.format) == 4;
      out.push_back(s.tensors[t++].narrow(0, four ? begin / 2 : begin, four ? (len + 1) / 2 : len));
      out.push_back(s.tensors[t++].narrow(0, begin / s.block, lowbit::num_blocks(len, s.block)));
    } else {
      out.push_back(s.tensors[t++].narrow(0, begin, len));
    }
  }
  return out;
}

std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.clone());
  return out;
}

}  // namespace

// The optimizer keeps the step count and lr in tensors (a scheduler changes lr between steps);
// the same three steps driven from the host (the CPU kernel called directly with each step's lr and
// counters of its own) give the same bits, for every rule and state family.
TEST(StepInterface, DeviceStepStateEqualsHostDrivenSteps) {
  for (const RuleCase& rc : rule_cases()) {
    for (StateFormat f : {StateFormat::FP32, StateFormat::Q8, StateFormat::Q4}) {
      SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f));
      const int64_t n = 70001;
      std::vector<at::Tensor> p = {at::randn({n})};
      at::Tensor host_p = p[0].clone();
      auto opt = rc.make(p, f, false);
      torch::optim::StepLR sched(*opt, /*step_size=*/1, /*gamma=*/0.5);
      RawState st = fresh_state(rc.config, f, n);
      std::vector<double> lrs;
      at::Tensor counters = at::zeros({2}, at::kLong);
      for (int64_t t = 1; t <= 3; ++t) {
        const double lr = opt->param_groups()[0].options().get_lr();  // what the scheduler set
        lrs.push_back(lr);
        const at::Tensor g = at::randn({n}) * 0.1;
        p[0].mutable_grad() = g.clone();
        opt->step();
        sched.step();
        // Host-driven: the kernel on raw pointers, with this step's lr and the counters it keeps.
        lk::StepParamRef ref;
        ref.param = host_p.data_ptr();
        ref.grad = g.data_ptr();
        ref.numel = n;
        ref.counters = counters.data_ptr<int64_t>();
        lk::StepLaunch step;
        step.config = rc.config;
        step.block_size = st.block;
        step.lr = &lr;
        size_t next = 0;
        step.num_slots = static_cast<int>(st.slots.size());
        for (size_t k = 0; k < st.slots.size(); ++k) {
          step.slots[k] = st.slots[k];
          if (st.slots[k].storage == lk::SlotStorage::Quant) {
            ref.slot[k] = st.tensors[next++].data_ptr();
            ref.absmax[k] = st.tensors[next++].data_ptr<float>();
          } else if (st.slots[k].storage != lk::SlotStorage::None) {
            ref.slot[k] = st.tensors[next++].data_ptr();
          }
        }
        step.params = &ref;
        step.n = 1;
        lk::optim_step_cpu(step);
      }
      EXPECT_EQ(opt->state_of(p[0])->step(), 3);
      EXPECT_EQ(counters[0].item<int64_t>(), 3);
      EXPECT_LT(lrs.back(), lrs.front());  // the scheduler did change lr between steps
      ASSERT_TRUE(lowbit_test::bitwise_equal(p[0], host_p));
      size_t next = 0;
      const lo::ParamState* ps = opt->state_of(p[0]);
      for (size_t k = 0; k < st.slots.size(); ++k) {
        const lo::StateSlot& s = ps->slots[k];
        ASSERT_EQ(s.type, st.slots[k]) << "slot " << k;
        if (s.type.storage == lk::SlotStorage::Quant) {
          EXPECT_TRUE(lowbit_test::bitwise_equal(s.quantized.codes(), st.tensors[next++])) << "codes of slot " << k;
          EXPECT_TRUE(lowbit_test::bitwise_equal(s.quantized.absmax(), st.tensors[next++])) << "absmax of slot " << k;
        } else if (s.type.storage != lk::SlotStorage::None) {
          EXPECT_TRUE(lowbit_test::bitwise_equal(s.dense, st.tensors[next++])) << "slot " << k;
        }
      }
    }
  }
}

// A parameter split at a block boundary into two ranges, each stepped with its element offset and
// the whole parameter's clipping and LAMB inputs, equals the whole parameter's step bit for bit:
// every rule, every state format, bf16 parameters with stochastic rounding, clipping on.
TEST(StepInterface, BlockAlignedShardsStepLikeTheWholeParameter) {
  const int64_t n = 70001, split = 256 * 37;  // a multiple of every format's block
  const auto& formats = lowbit::kAllStateFormats;
  for (const RuleCase& rc : rule_cases()) {
    for (StateFormat f : formats) {
      for (bool bf16_sr : {false, true}) {
        SCOPED_TRACE(std::string(rc.name) + " " + lowbit::state_format_name(f) + (bf16_sr ? " bf16 SR" : " fp32"));
        const auto dtype = bf16_sr ? at::kBFloat16 : at::kFloat;
        at::Tensor whole_p = at::randn({n}).to(dtype), shard_p = whole_p.clone();
        RawState whole = fresh_state(rc.config, f, n), shard = whole;
        shard.tensors = clone_all(whole.tensors);
        at::Tensor whole_counters = at::zeros({2}, at::kLong);
        at::Tensor shard_counters[2] = {at::zeros({2}, at::kLong), at::zeros({2}, at::kLong)};
        const at::Tensor lr = at::full({1}, rc.config.rule == lk::Rule::SGD ? 0.1 : 1e-2, at::kDouble);
        for (int s = 0; s < 3; ++s) {
          const at::Tensor g = (at::randn({n}) * 0.1).to(dtype);
          auto base = [&] {
            lowbit::ops::StepArgs a;
            a.config = rc.config;
            a.slots = whole.slots;
            a.block_size = whole.block;
            a.lr = lr;
            a.seed = 1234;
            a.stochastic_round = bf16_sr;
            a.rng_keys = {7};
            auto [found_inf, sumsq] = lowbit::ops::grad_check({g}, {0}, 1, true);
            a.found_inf = found_inf;
            a.grad_sumsq = sumsq;
            a.max_grad_norm = 5.0;  // the gradients' norm is about 26: clipping is on
            return a;
          };
          lowbit::ops::StepArgs w = base();
          w.params = {whole_p};
          w.grads = {g};
          w.counters = {whole_counters};
          w.state = whole.tensors;
          // LAMB's whole-parameter norms before the step, for the shards.
          const at::Tensor norms = lowbit::ops::optim_lamb_norms(w);
          lowbit::ops::optim_step(w);
          const int64_t begin[2] = {0, split}, len[2] = {split, n - split};
          for (int r = 0; r < 2; ++r) {
            lowbit::ops::StepArgs a = base();
            a.params = {shard_p.narrow(0, begin[r], len[r])};
            a.grads = {g.narrow(0, begin[r], len[r])};
            a.counters = {shard_counters[r]};
            a.state = narrowed(shard, begin[r], len[r]);
            a.offsets = {begin[r]};
            if (rc.config.rule == lk::Rule::LAMB) a.lamb_norms = norms;
            lowbit::ops::optim_step(a);
          }
        }
        ASSERT_TRUE(lowbit_test::bitwise_equal(whole_p, shard_p));
        for (size_t k = 0; k < whole.tensors.size(); ++k)
          ASSERT_TRUE(lowbit_test::bitwise_equal(whole.tensors[k], shard.tensors[k])) << "state tensor " << k;
        EXPECT_EQ(whole_counters[0].item<int64_t>(), 3);
        EXPECT_EQ(shard_counters[1][0].item<int64_t>(), 3);
      }
    }
  }
}

// LAMB's sums of p^2 and r^2 (optim_lamb_norms) on CUDA equal the CPU's bits, in doubles: the order
// of every addition is the documented one (lamb_add_block_sums). The trust ratio, a float, hides most changes of the
// sums' last bits, so a step's result alone would not show a GPU adding in another order. Every
// state format; fp32 parameters and bf16 ones with a 24-bit master correction; sizes from one
// element to a ragged end after many blocks; state from a first step. Without a GPU, the CPU
// kernel against the ATen reference alone.
TEST(StepInterface, LambNormsOnCudaEqualTheCpuBits) {
  const std::vector<RuleCase> cases = rule_cases();
  const RuleCase* lamb = nullptr;
  for (const RuleCase& rc : cases)
    if (rc.config.rule == lk::Rule::LAMB) lamb = &rc;
  ASSERT_NE(lamb, nullptr);
  const auto cuda = [](const std::vector<at::Tensor>& v) {
    std::vector<at::Tensor> out;
    for (const auto& t : v) out.push_back(t.cuda());
    return out;
  };
  // eps 0 too: a GPU lane past a block's end must not add its 0 / 0.
  for (const double eps : {lamb->config.eps, 0.0})
  for (StateFormat f : lowbit::kAllStateFormats) {
    for (const bool master : {false, true}) {
      // (1 << 22) + 5 with C8's blocks of 64: 257 groups of kLambSumGroup blocks, more than a GPU
      // thread block adds in one round.
      std::vector<int64_t> sizes = {1, 271, 70001, (1 << 20) + 3};
      if (torch::cuda::is_available()) sizes.push_back((1 << 22) + 5);
      for (const int64_t n : sizes) {
        SCOPED_TRACE(std::string(lowbit::state_format_name(f)) + (master ? " bf16 + 24-bit master" : " fp32") +
                     " n=" + std::to_string(n) + " eps=" + std::to_string(eps));
        const auto dtype = master ? at::kBFloat16 : at::kFloat;
        at::Tensor p = (at::randn({n}) * 3).to(dtype);
        RawState st = fresh_state(lamb->config, f, n);
        at::Tensor counters = at::zeros({2}, at::kLong);
        at::Tensor correction = at::randint(-128, 128, {n}, at::kChar);
        std::vector<lk::SlotType> slot_list = st.slots;
        if (master) {
          slot_list.resize(lk::kCorrectionSlot + 1);
          slot_list[lk::kCorrectionSlot] = {lk::SlotStorage::Int8};
        }
        const auto args = [&](const at::Tensor& param, const at::Tensor& grad, const at::Tensor& ctr,
                              std::vector<at::Tensor> state, const at::Tensor& corr) {
          lowbit::ops::StepArgs a;
          a.config = lamb->config;
          a.config.eps = eps;
          a.slots = slot_list;
          a.block_size = st.block;
          a.lr = at::full({1}, 1e-2, at::kDouble).to(param.device());
          a.params = {param};
          a.grads = {grad};
          a.counters = {ctr};
          if (master) state.push_back(corr);
          a.state = state;
          return a;
        };
        // A first step on the CPU fills the state.
        lowbit::ops::optim_step(args(p, (at::randn({n}) * 0.1).to(dtype), counters, st.tensors, correction));
        const at::Tensor g = (at::randn({n}) * 0.1).to(dtype);
        const at::Tensor on_cpu = lowbit::ops::optim_lamb_norms(args(p, g, counters, st.tensors, correction));
        const at::Tensor reference =
            lowbit::ops::optim_lamb_norms(args(p, g, counters, st.tensors, correction), /*reference=*/true);
        ASSERT_EQ(on_cpu.scalar_type(), at::kDouble);
        EXPECT_TRUE(lowbit_test::bitwise_equal(on_cpu, reference)) << on_cpu << reference;
        if (!torch::cuda::is_available()) continue;
        const at::Tensor on_gpu = lowbit::ops::optim_lamb_norms(
                                      args(p.cuda(), g.cuda(), counters.cuda(), cuda(st.tensors), correction.cuda()))
                                      .cpu();
        // With eps 0 a sum can be NaN on both (an element's 0 / 0); NaN's sign is the device's.
        const at::Tensor nan = at::isnan(on_cpu);
        EXPECT_TRUE(at::equal(nan, at::isnan(on_gpu))) << on_cpu << on_gpu;
        EXPECT_TRUE(lowbit_test::bitwise_equal(on_cpu.masked_fill(nan, 0.0), on_gpu.masked_fill(nan, 0.0)))
            << on_cpu << on_gpu;
      }
    }
  }
}

// A shard that restarted its stochastic-rounding indices at 0 (no offset) would draw other noise:
// the offset is what makes the shard test above pass.
TEST(StepInterface, OffsetsMoveTheRoundingNoise) {
  const int64_t n = 4096;
  const at::Tensor p0 = at::randn({n}).to(at::kBFloat16), g = (at::randn({n}) * 0.1).to(at::kBFloat16);
  std::vector<at::Tensor> out;
  for (int64_t offset : {int64_t(0), int64_t(1 << 20)}) {
    lowbit::ops::StepArgs a;
    a.config.rule = lk::Rule::SGD;
    a.params = {p0.clone()};
    a.grads = {g};
    a.counters = {at::zeros({2}, at::kLong)};
    a.lr = at::full({1}, 1e-3, at::kDouble);
    a.stochastic_round = true;
    a.offsets = {offset};
    lowbit::ops::optim_step(a);
    out.push_back(a.params[0]);
  }
  EXPECT_FALSE(lowbit_test::bitwise_equal(out[0], out[1]));
}

// The rounding noise is a function of (seed, element index) alone: the AVX-512 loop (16 lanes at
// a time), the scalar loop and the ATen reference draw the same bits for indices below, across
// and far above 2^32 (the noise folds the index's high half in), with Q8 state (the pipelined
// vector loop) and with none.
TEST(StepInterface, RoundingNoiseIsTheSameOnEveryPathAcross2To32) {
  const int64_t n = 1003;
  const at::Tensor p0 = at::randn({n}).to(at::kBFloat16), g = (at::randn({n}) * 0.1).to(at::kBFloat16);
  for (StateFormat f : {StateFormat::Q8, StateFormat::FP32}) {
    lk::StepConfig config;
    config.rule = lk::Rule::AdamW;
    const RawState st0 = fresh_state(config, f, n);
    std::vector<at::Tensor> first;
    // Block-aligned offsets (a quantized shard starts on a block): 2^32 falls inside the tensor.
    for (int64_t offset : {int64_t(0), (int64_t(1) << 32) - 512, (int64_t(1) << 40)}) {
      SCOPED_TRACE(std::string(lowbit::state_format_name(f)) + " offset " + std::to_string(offset));
      std::vector<at::Tensor> out;
      for (int path = 0; path < 3; ++path) {
        lowbit::ops::StepArgs a;
        a.config = config;
        a.slots = st0.slots;
        a.block_size = st0.block;
        a.state = clone_all(st0.tensors);
        a.params = {p0.clone()};
        a.grads = {g};
        a.counters = {at::zeros({2}, at::kLong)};
        a.lr = at::full({1}, 1e-3, at::kDouble);
        a.seed = 0x0123456789ABCDEFll;
        a.stochastic_round = true;
        a.offsets = {offset};
        a.scalar_loop = path == 1;
        lowbit::ops::optim_step(a, path == 2);
        out.push_back(a.params[0]);
      }
      EXPECT_TRUE(lowbit_test::bitwise_equal(out[0], out[1])) << "AVX-512 loop vs scalar loop";
      EXPECT_TRUE(lowbit_test::bitwise_equal(out[0], out[2])) << "AVX-512 loop vs ATen reference";
      first.push_back(out[0]);
    }
    EXPECT_FALSE(lowbit_test::bitwise_equal(first[0], first[1]));
    EXPECT_FALSE(lowbit_test::bitwise_equal(first[1], first[2]));
  }
}

namespace {

// One step from st0 on every path: the vector loop, the scalar loop, the ATen reference and,
// where there is a GPU, the CUDA kernel; each path's state tensors, then its parameter, on the CPU.
std::vector<std::vector<at::Tensor>> step_on_every_path(const lk::StepConfig& config, const RawState& st0,
                                                       const at::Tensor& p0, const at::Tensor& g) {
  std::vector<std::vector<at::Tensor>> out;
  const int paths = torch::cuda::is_available() ? 4 : 3;
  for (int path = 0; path < paths; ++path) {
    const at::Device device = path == 3 ? at::Device(at::kCUDA) : at::Device(at::kCPU);
    lowbit::ops::StepArgs a;
    a.config = config;
    a.slots = st0.slots;
    a.block_size = st0.block;
    for (const at::Tensor& t : st0.tensors) a.state.push_back(t.to(device, /*non_blocking=*/false, /*copy=*/true));
    a.params = {p0.to(device, false, true)};
    a.grads = {g.to(device)};
    a.counters = {at::zeros({2}, at::TensorOptions(at::kLong).device(device))};
    a.lr = at::full({1}, 1e-3, at::TensorOptions(at::kDouble).device(device));
    a.scalar_loop = path == 1;
    lowbit::ops::optim_step(a, path == 2);
    std::vector<at::Tensor> all;
    for (const at::Tensor& t : a.state) all.push_back(t.cpu());
    all.push_back(a.params[0].cpu());
    out.push_back(all);
  }
  return out;
}

}  // namespace

// A gradient with NaNs of either sign and infinities makes blocks of state non-finite: the vector
// loop (AVX-512 or AVX2, with its 4-bit encode by tree or by formula), the scalar loop and the ATen
// reference write the same bytes of every slot and parameter, the flagged blocks' codes included
// (the AVX-512 4-bit tree once gave a NaN without its sign code 0 where the key table gives 15; the
// reference's bucketize once put a NaN with its sign above every threshold). The CUDA kernel: below.
TEST(StepInterface, NonFiniteStateIsEncodedAlikeOnEveryPath) {
  // Enough blocks that the threads' ranges hold several (at 2 threads and at 16), so the early
  // blocks, which hold the specials, are encoded inside the pipelined loop, not after it; a short
  // last block, encoded after it.
  const int64_t n = 16387;
  at::Tensor g = at::randn({n}) * 0.1;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const float specials[] = {nan, -nan, inf, -inf, nan, -nan};
  const int64_t where[] = {5, 300, 517, 640, 990, 1001};
  for (int i = 0; i < 6; ++i) g[where[i]] = specials[i];
  ASSERT_FALSE(std::signbit(g[5].item<float>()));
  ASSERT_TRUE(std::signbit(g[300].item<float>()));
  const at::Tensor p0 = at::randn({n});
  for (StateFormat f : {StateFormat::Q4, StateFormat::Q8, StateFormat::FP8, StateFormat::C8}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    lk::StepConfig config;
    config.rule = lk::Rule::AdamW;
    const RawState st0 = fresh_state(config, f, n);
    const std::vector<std::vector<at::Tensor>> out = step_on_every_path(config, st0, p0, g);
    const int paths = static_cast<int>(out.size());
    const char* const names[] = {"", "scalar loop", "ATen reference"};
    for (int path = 1; path < 3; ++path)
      for (size_t t = 0; t < out[0].size(); ++t)
        EXPECT_TRUE(lowbit_test::bitwise_equal(out[0][t], out[path][t])) << "vector loop vs " << names[path] << ", tensor " << t;
    if (paths < 4) continue;
    // The GPU makes NaNs of its own sign and payload (0 * Inf, NaN arithmetic), so a flagged block's
    // values, and with them its codes, are the device's: the flags, every unflagged block's codes and
    // the parameters (NaN where the CPU has NaN) agree.
    const std::vector<at::Tensor>& cpu = out[0];
    const std::vector<at::Tensor>& gpu = out[3];
    const int64_t per_block = lowbit::format_bits(st0.slots[0].format) == 4 ? st0.block / 2 : st0.block;
    for (size_t k = 0; k + 1 < cpu.size(); k += 2) {
      EXPECT_TRUE(lowbit_test::bitwise_equal(cpu[k + 1], gpu[k + 1])) << "CUDA kernel: absmax of slot " << k / 2;
      int64_t flagged = 0;
      for (int64_t b = 0; b < cpu[k + 1].numel(); ++b) {
        if (!(cpu[k + 1][b].item<float>() >= 0.0f)) {
          ++flagged;
          continue;
        }
        const int64_t begin = b * per_block, len = std::min(per_block, cpu[k].numel() - begin);
        EXPECT_TRUE(at::equal(cpu[k].narrow(0, begin, len), gpu[k].narrow(0, begin, len)))
            << "CUDA kernel: codes of slot " << k / 2 << ", block " << b;
      }
      EXPECT_GT(flagged, 0);
    }
    const at::Tensor nan = at::isnan(cpu.back());
    EXPECT_TRUE(at::equal(nan, at::isnan(gpu.back()))) << "CUDA kernel: the parameter's NaNs";
    EXPECT_TRUE(lowbit_test::bitwise_equal(cpu.back().masked_fill(nan, 0.0f), gpu.back().masked_fill(nan, 0.0f)))
        << "CUDA kernel: the parameter";
  }
}

// Blocks whose absmax is below 2^-64 or above 2^64 normalize with a pre of 2^64 or 2^-64
// (encode.h: make_normalizer), which the vector loop may not drop as it drops a pre of 1: gradients
// of 1e-19 (m near 1e-20, v near 1e-41) and of 1e15 (v near 1e27) beside ordinary ones, every
// quantized format, enough blocks for the pipelined loop. (m above 2^64 needs a gradient above
// 2^64, whose square overflows v.) The vector loop, the scalar
// loop, the ATen reference and (where there is one) the CUDA kernel write the same bits.
TEST(StepInterface, TinyAndHugeBlocksAreEncodedAlikeOnEveryPath) {
  const int64_t n = 16387;
  const at::Tensor scale = at::tensor({1e-19f, 1.0f, 1e15f}).repeat_interleave(512).repeat(n / 1536 + 1).narrow(0, 0, n);
  const at::Tensor g = at::randn({n}) * scale;
  const at::Tensor p0 = at::randn({n});
  for (StateFormat f : {StateFormat::Q4, StateFormat::Q8, StateFormat::FP8, StateFormat::C8}) {
    SCOPED_TRACE(lowbit::state_format_name(f));
    lk::StepConfig config;
    config.rule = lk::Rule::AdamW;
    const RawState st0 = fresh_state(config, f, n);
    const std::vector<std::vector<at::Tensor>> out = step_on_every_path(config, st0, p0, g);
    const int paths = static_cast<int>(out.size());
    // The scales reach both ends: some absmax of each moment below 2^-64, some of v above 2^64.
    for (size_t k = 1; k + 1 < out[0].size(); k += 2)
      EXPECT_TRUE(out[0][k].lt(0x1p-64f).logical_and(out[0][k].gt(0.0f)).any().item<bool>()) << "slot " << k / 2;
    EXPECT_TRUE(out[0][3].gt(0x1p64f).any().item<bool>());
    const char* const names[] = {"", "scalar loop", "ATen reference", "CUDA kernel"};
    for (int path = 1; path < paths; ++path)
      for (size_t t = 0; t < out[0].size(); ++t)
        EXPECT_TRUE(lowbit_test::bitwise_equal(out[0][t], out[path][t])) << "vector loop vs " << names[path] << ", tensor " << t;
  }
}

// rule_slot_count_possible, by which the CPU's specialized loops are compiled, admits exactly the
// moment-slot counts that rule_slots gives over the options that change them: one it refused would
// send a layout the op admits to the per-block loop, one it admitted needlessly compiles dead loops.
TEST(StepInterface, SpecializedSlotCountsAreTheOnesEachRulesOptionsGive) {
  for (int r = 0; r < lk::kNumRules; ++r) {
    const auto rule = static_cast<lk::Rule>(r);
    SCOPED_TRACE(lk::rule_name(rule));
    bool seen[lk::kMomentSlots + 1] = {};
    for (int options = 0; options < 8; ++options) {
      lk::StepConfig c;
      c.rule = rule;
      c.amsgrad = (options & 1) != 0;
      c.momentum = (options & 2) != 0 ? 0.9 : 0.0;
      c.centered = (options & 4) != 0;
      const lk::RuleSlots s = lk::rule_slots(c);
      int n = std::min(s.count, lk::kMomentSlots);
      while (n > 0 && !s.used[n - 1]) --n;
      seen[n] = true;
    }
    for (int n = 0; n <= lk::kMomentSlots; ++n) EXPECT_EQ(lk::rule_slot_count_possible(rule, n), seen[n]) << n << " slots";
  }
}

// Which shapes the vector files' specialized loops take (task_shape): bf16 with either master-weight
// correction and quantized state goes to the pipelined loop, bf16 rounded stochastically with dense
// state to the dense loop; a correction beside dense state and fp16 parameters to the per-block loop.
// (The loops' bits are StepDigest's; this holds the routing, which only speed shows otherwise.)
TEST(StepInterface, TaskShapeSendsCorrectionsAndStochasticRoundingToTheSpecializedLoops) {
  const auto task = [](lk::ElemType type, lk::SlotStorage state, lk::SlotStorage correction, bool stochastic) {
    lk::ParamTask t;
    t.param_type = t.grad_type = type;
    t.num_slots = 2;
    t.stochastic_round = stochastic;
    t.slots[0] = {state, lowbit::QuantFormat::Dyn8Signed};
    t.slots[1] = {state, lowbit::QuantFormat::Dyn8Unsigned};
    t.slots[lk::kCorrectionSlot].storage = correction;
    return t;
  };
  using S = lk::SlotStorage;
  const auto bf16 = lk::ElemType::BF16;
  for (S corr : {S::None, S::Int8, S::Int16}) {
    const lk::TaskShape q = lk::task_shape(task(bf16, S::Quant, corr, false));
    EXPECT_EQ(q.quant_bits, 8) << static_cast<int>(corr);
    EXPECT_EQ(q.corr, corr);
  }
  EXPECT_EQ(lk::task_shape(task(bf16, S::BF16, S::None, true)).dense, S::BF16);
  EXPECT_EQ(lk::task_shape(task(bf16, S::F32, S::None, true)).dense, S::F32);
  EXPECT_EQ(lk::task_shape(task(bf16, S::F32, S::Int8, false)).dense, S::None);
  const lk::TaskShape f16 = lk::task_shape(task(lk::ElemType::F16, S::Quant, S::None, false));
  EXPECT_EQ(f16.quant_bits, 0);
  EXPECT_EQ(f16.dense, S::None);
}

// found_inf set: the call changes nothing, not even the step count.
TEST(StepInterface, FoundInfSkipsTheCallOnEveryPath) {
  for (bool reference : {false, true}) {
    const at::Tensor p0 = at::randn({5000});
    lowbit::ops::StepArgs a;
    a.config.rule = lk::Rule::AdamW;
    a.params = {p0.clone()};
    a.grads = {at::randn({5000})};
    a.counters = {at::zeros({2}, at::kLong)};
    a.lr = at::full({1}, 1e-3, at::kDouble);
    a.slots = {{lk::SlotStorage::F32}, {lk::SlotStorage::F32}};
    a.state = {at::zeros({5000}), at::zeros({5000})};
    a.found_inf = at::ones({1});
    lowbit::ops::optim_step(a, reference);
    EXPECT_TRUE(lowbit_test::bitwise_equal(a.params[0], p0));
    EXPECT_EQ(a.counters[0][0].item<int64_t>(), 0);
    a.found_inf = at::zeros({1});
    lowbit::ops::optim_step(a, reference);
    EXPECT_FALSE(lowbit_test::bitwise_equal(a.params[0], p0));
    EXPECT_EQ(a.counters[0][0].item<int64_t>(), 1);
  }
}
