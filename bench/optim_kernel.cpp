// bench/optim_kernel: the CPU step kernel alone (no dispatcher, no ATen), to split a step's time
// into its parts: the gradient pre-pass (finite check), the fused block loop, and a memcpy of the
// 16 bytes/param a Q8 AdamW step must move. Each round times all three back to back, so the ratios
// are taken under the same load (the lent host is shared; its memcpy alone moves by 1.6x).
//   optim_kernel [numel=2^26] [rounds=15] [case: a row's name, e.g. "AdamW Q8"; default all]
// A numel that fits in L2 (e.g. 16384) measures the loop's compute alone.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <lowbit/kernels/common/float_convert.h>
#include <lowbit/kernels/cpu/grad_stats_cpu.h>
#include <lowbit/kernels/cpu/optim_step_cpu.h>

#include "timing.h"
#include <lowbit/tools/program_args.h>

namespace k = lowbit::kernels;

namespace {

struct Case {
  const char* name;
  k::Rule rule;
  int slots;
  k::SlotStorage storage;
  lowbit::QuantFormat m_format, v_format;
  int64_t block;
  k::ElemType param_type = k::ElemType::F32;    // and the gradient's
  k::SlotStorage correction = k::SlotStorage::None;  // bf16's master-weight correction (Int8: 24 bits)
  lowbit::QuantFormat third_format = lowbit::QuantFormat::Dyn8Unsigned;  // slot 2 (AdEMAMix's nu)
};

// One parameter with its state (up to three slots), in the kernel's raw form.
struct Problem {
  std::vector<float> param, grad;
  std::vector<uint16_t> param16, grad16;  // bf16 cases
  std::vector<int8_t> correction;
  std::vector<float> dense[3];
  std::vector<uint8_t> codes[3];
  std::vector<float> absmax[3];
  int64_t counters[2] = {0, 0};
  double lr = 1e-3;
  k::StepParamRef ref;
  k::StepLaunch launch;

  Problem(const Case& c, int64_t n) : param(n), grad(n) {
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    // Filled in parallel: first touch puts the pages by the threads that use them.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      param[i] = 0.0f;
      grad[i] = 0.0f;
    }
    for (int64_t i = 0; i < n; ++i) {
      param[i] = dist(rng);
      grad[i] = 1e-3f * dist(rng);
    }
    ref.param = param.data();
    ref.grad = grad.data();
    if (c.param_type == k::ElemType::BF16) {
      param16.resize(n);
      grad16.resize(n);
      for (int64_t i = 0; i < n; ++i) {
        param16[i] = k::from_f32<k::bf16_t>(param[i]).bits;
        grad16[i] = k::from_f32<k::bf16_t>(grad[i]).bits;
      }
      ref.param = param16.data();
      ref.grad = grad16.data();
      ref.grad_type = k::ElemType::BF16;
      launch.param_type = k::ElemType::BF16;
    }
    if (c.correction == k::SlotStorage::Int8) {
      correction.assign(n, 0);
      ref.correction = correction.data();
      launch.slots[k::kCorrectionSlot] = {k::SlotStorage::Int8, c.m_format};
    }
    ref.numel = n;
    ref.counters = counters;
    launch.config.rule = c.rule;
    launch.config.weight_decay = 1e-2;
    launch.config.momentum = 0.9;  // SGD
    launch.block_size = c.block;
    launch.num_slots = c.slots;
    launch.lr = &lr;
    const lowbit::QuantFormat fmts[3] = {c.m_format, c.v_format, c.third_format};
    for (int s = 0; s < c.slots; ++s) {
      launch.slots[s] = {c.storage, fmts[s]};
      if (c.storage == k::SlotStorage::F32) {
        dense[s].assign(n, 0.0f);
        ref.slot[s] = dense[s].data();
      } else {
        const bool four = lowbit::format_bits(fmts[s]) == 4;
        codes[s].assign(four ? (n + 1) / 2 : n, 0);
        absmax[s].assign((n + c.block - 1) / c.block, 0.0f);
        ref.slot[s] = codes[s].data();
        ref.absmax[s] = absmax[s].data();
      }
    }
    launch.params = &ref;
    launch.n = 1;
  }
  Problem(const Problem&) = delete;
};

}  // namespace

constexpr const char* kUsage =
    "usage: bench_optim_kernel [N [ROUNDS [ONLY]]]\n"
    "The CPU step kernel alone (no torch) over N elements; ONLY: one row's name.\n";

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv, kUsage)) return 0;
  const int64_t n = argc > 1 ? lowbit_tools::int_arg(argv[1], "N", 1, kUsage) : (int64_t(1) << 26);
  const int rounds = argc > 2 ? static_cast<int>(lowbit_tools::int_arg(argv[2], "ROUNDS", 1, kUsage)) : 15;
  const std::string only = argc > 3 ? argv[3] : "";
  std::printf("numel %lld, %d threads, median of %d rounds (memcpy, pre-pass, step back to back)\n",
              static_cast<long long>(n), omp_get_max_threads(), rounds);
  const int64_t half = n * 8;  // 16 bytes/param: 8 read, 8 written
  std::vector<char> src(half), dst(half);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < half; i += 4096) {
    std::memset(src.data() + i, 1, std::min<int64_t>(4096, half - i));
    std::memset(dst.data() + i, 0, std::min<int64_t>(4096, half - i));
  }
  const auto memcpy_ms = [&] { return lowbit_bench::parallel_memcpy_ms(dst.data(), src.data(), half); };
  using QF = lowbit::QuantFormat;
  const Case cases[] = {
      {"AdamW Q8", k::Rule::AdamW, 2, k::SlotStorage::Quant, QF::Dyn8Signed, QF::Dyn8Unsigned, 256},
      {"AdamW FP8", k::Rule::AdamW, 2, k::SlotStorage::Quant, QF::FP8E4M3, QF::FP8E4M3, 256},
      {"AdamW Q4", k::Rule::AdamW, 2, k::SlotStorage::Quant, QF::DE4Signed, QF::Linear4Unsigned, 128},
      {"AdamW C8", k::Rule::AdamW, 2, k::SlotStorage::Quant, QF::Pow8Signed, QF::Pow8Unsigned, 64},
      {"AdamW FP32", k::Rule::AdamW, 2, k::SlotStorage::F32, QF::Dyn8Signed, QF::Dyn8Unsigned, 256},
      // bf16 parameters and gradients, alone and with the 24-bit mode's int8 correction (host offload's).
      {"bf16 Q8", k::Rule::AdamW, 2, k::SlotStorage::Quant, QF::Dyn8Signed, QF::Dyn8Unsigned, 256, k::ElemType::BF16},
      {"m24 Q8", k::Rule::AdamW, 2, k::SlotStorage::Quant, QF::Dyn8Signed, QF::Dyn8Unsigned, 256, k::ElemType::BF16,
       k::SlotStorage::Int8},
      {"m24 Q4", k::Rule::AdamW, 2, k::SlotStorage::Quant, QF::DE4Signed, QF::Linear4Unsigned, 128, k::ElemType::BF16,
       k::SlotStorage::Int8},
      // One 8-bit slot without (SGD) and with (Adagrad) a sqrt and a division per element.
      {"SGD Q8", k::Rule::SGD, 1, k::SlotStorage::Quant, QF::Dyn8Signed, QF::Dyn8Signed, 256},
      {"Adagrad Q8", k::Rule::Adagrad, 1, k::SlotStorage::Quant, QF::Dyn8Unsigned, QF::Dyn8Unsigned, 256},
      // Three 8-bit slots (m1, m2, nu); LAMB's two passes (the norms, then the update).
      {"AdEMAMix Q8", k::Rule::AdEMAMix, 3, k::SlotStorage::Quant, QF::Dyn8Signed, QF::Dyn8Signed, 256},
      {"LAMB Q8", k::Rule::LAMB, 2, k::SlotStorage::Quant, QF::Dyn8Signed, QF::Dyn8Unsigned, 256},
  };
  std::printf("%-11s %10s %10s %10s %10s %12s %12s %10s\n", "state", "memcpy", "pre-pass", "step", "ns/param",
              "step/memcpy", "(pre+step)/memcpy", "best step");
  for (const Case& c : cases) {
    if (!only.empty() && only != c.name) continue;
    Problem pb(c, n);
    const k::StepLaunch& step = pb.launch;
    const k::GradRef gref{pb.ref.grad, pb.ref.grad_type, n};
    uint8_t finite = 0;
    for (int i = 0; i < 3; ++i) k::optim_step_cpu(step);  // state away from all-zero
    std::vector<double> mc, pre, st, r_step, r_all;
    for (int r = 0; r < rounds; ++r) {
      mc.push_back(memcpy_ms());
      double t0 = lowbit_bench::now_ms();
      k::grad_stats_cpu(&gref, 1, false, &finite, nullptr);
      pre.push_back(lowbit_bench::now_ms() - t0);
      t0 = lowbit_bench::now_ms();
      k::optim_step_cpu(step);
      st.push_back(lowbit_bench::now_ms() - t0);
      r_step.push_back(st.back() / mc.back());
      r_all.push_back((st.back() + pre.back()) / mc.back());
    }
    const double s = lowbit_bench::median(st);
    std::printf("%-11s %10.3f %10.3f %10.3f %10.3f %12.2f %12.2f %10.3f\n", c.name, lowbit_bench::median(mc),
                lowbit_bench::median(pre), s, s * 1e6 / n, lowbit_bench::median(r_step), lowbit_bench::median(r_all),
                *std::min_element(st.begin(), st.end()));
  }
  return 0;
}
