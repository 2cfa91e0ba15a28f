// bench/optim_step: ns per parameter of one optimizer step for every lowbit optimizer and state
// format, in the same run as libtorch's torch::optim::AdamW and ATen's fused AdamW (at::_fused_adamw_,
// fp32 state), and a memcpy of the bytes
// a Q8 AdamW step must move (param + grad read, param written, 2 bytes of state read and written).
// The rows step in rounds (each once per round), each step timed right after a memcpy. "x fused" is
// the median over rounds of the row's step / ATen fused's step of the same round, with its range;
// "x memcpy" divides a row's median by the median of every memcpy of the run; "pairs" is the median
// of each step's ratio to the memcpy just before it (on a shared host the bandwidth drifts).
//   optim_step [numel=2^26] [reps=10] [rows]   (default: past the last-level cache of a server CPU)
//     rows: a comma-separated list of the rows to run, each "optimizer:state" as printed (e.g.
//     "AdamW:Q4,AdamW nocheck:FP32"; the 4096 small tensors: "small:Q8"); ATen fused always runs
//     (the yardstick). Default: all rows but "offload:Q8", "offload:Q4" and "offload-pinned:Q8" /
//     "offload-pinned:Q4" (the host offload's CPU work at 1.21B parameters, named only).
//   optim_step --device cuda [tensors rows cols reps]   the GPU step bench (optim_step_gpu.cpp)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <cstdio>
#include <cstring>
#include <string>

#include <ATen/Context.h>
#include <lowbit/lowbit.h>
#include <lowbit/tensors/optim_ops.h>
#include <lowbit/tools/program_args.h>

#include "timing.h"
#ifdef LOWBIT_BENCH_HAS_GPU_STEP
#include "optim_step_gpu.h"
#endif

namespace lo = lowbit::optim;
using lowbit::StateFormat;

namespace {

// ATen's fused AdamW (what torch.optim.AdamW(fused=True) runs on the CPU since torch 2.4): fp32 state,
// one vectorized pass per tensor, threads through at::parallel_for.
struct AtenFusedAdamW {
  at::Tensor p, m, v, steps;
  explicit AtenFusedAdamW(at::Tensor param)
      : p(param), m(at::zeros_like(param)), v(at::zeros_like(param)), steps(at::zeros({}, at::kFloat)) {}
  void step() {
    steps.add_(1);
    at::_fused_adamw_({p}, {p.grad()}, {m}, {v}, {}, {steps}, 1e-3, 0.9, 0.999, 1e-2, 1e-8, false, false);
  }
};

}  // namespace

constexpr const char* kUsage =
    "usage: bench_optim_step [--device cpu|cuda] [N [REPS [ROWS]]]\n"
    "One optimizer step over N parameters per rule and state format, against ATen's fused AdamW.\n";

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv, kUsage)) return 0;
  if (argc > 1 && std::string(argv[1]) == "--device") {
    const std::string device = argc > 2 ? argv[2] : "";
    if (device == "cuda") {
#ifdef LOWBIT_BENCH_HAS_GPU_STEP
      argv[2] = argv[0];  // the GPU bench reads its arguments after its own name
      return lowbit_bench::optim_step_gpu_main(argc - 2, argv + 2);
#else
      std::fprintf(stderr, "optim_step --device cuda: this build has no CUDA (configure with -DLOWBIT_CUDA=ON)\n");
      return 2;
#endif
    }
    if (device != "cpu") {
      std::fprintf(stderr, "optim_step --device: expected cpu or cuda, got '%s'\n", device.c_str());
      return 2;
    }
    argv += 2;
    argc -= 2;
  }
  const int64_t n = argc > 1 ? lowbit_tools::int_arg(argv[1], "N", 1, kUsage) : (int64_t(1) << 26);
  const int reps = argc > 2 ? static_cast<int>(lowbit_tools::int_arg(argv[2], "REPS", 1, kUsage)) : 10;
  const std::string only = argc > 3 ? "," + std::string(argv[3]) + "," : "";
  const auto want = [&](const std::string& name, const std::string& state) {
    return only.empty() || only.find("," + name + ":" + state + ",") != std::string::npos;
  };
  std::printf("numel %lld, %d threads, %d rounds of every row, each step after a memcpy\n", static_cast<long long>(n),
              omp_get_max_threads(), reps);

  // memcpy of the bytes a Q8 AdamW step moves: 4 (p) + 4 (g) + 2 (m, v codes) read; 4 + 2 written.
  const int64_t bytes = n * 16;
  std::vector<char> src(bytes / 2), dst(bytes / 2);
  std::memset(src.data(), 1, src.size());
  std::memset(dst.data(), 0, dst.size());
  const auto memcpy_once = [&] {
    return lowbit_bench::parallel_memcpy_ms(dst.data(), src.data(), static_cast<int64_t>(src.size()));
  };
  std::vector<double> all_memcpy;

  // Every row's optimizer is made first (each over parameters and gradients of its own), then all
  // step in rounds: each row once per round, in the same order, each step right after a memcpy. A
  // host whose pace drifts (a shared machine's does, by tens of percent within minutes) then moves
  // them alike: "x fused" is the median over rounds of a row's step / ATen fused's step in that round.
  struct Row {
    std::string name, state;
    std::function<void()> step;
    std::vector<double> ms, per_memcpy, per_fused;  // per round
  };
  std::vector<Row> rows;
  const auto param = [&](at::ScalarType dtype) {
    at::Tensor p = at::randn({n}).to(dtype);
    p.mutable_grad() = (at::randn({n}) * 1e-3).to(dtype);
    return p;
  };
  const auto one = [&](at::ScalarType dtype = at::kFloat) { return std::vector<at::Tensor>{param(dtype)}; };
  const auto add = [&](const std::string& name, const std::string& state, auto opt) {
    rows.push_back({name, state, [opt] { opt->step(); }, {}, {}, {}});
  };
  if (want("torch", "FP32")) {
    at::Tensor p = param(at::kFloat);
    add("torch", "FP32", std::make_shared<torch::optim::AdamW>(std::vector<at::Tensor>{p}, torch::optim::AdamWOptions(1e-3)));
  }
  const size_t fused_row = rows.size();
  add("ATen fused", "FP32", std::make_shared<AtenFusedAdamW>(param(at::kFloat)));
  for (StateFormat f : lowbit::kAllStateFormats) {
    if (!want("AdamW", lowbit::state_format_name(f))) continue;
    add("AdamW", lowbit::state_format_name(f), std::make_shared<lo::AdamW>(one(),
                                                                           lo::AdamWOptions(1e-3).state_format(f)));
  }
  // The same without the non-finite check (skip_nonfinite(false)): no read of every gradient before
  // the step, which ATen's fused AdamW does not do either.
  for (StateFormat f : {StateFormat::FP32, StateFormat::Q8}) {
    if (!want("AdamW nocheck", lowbit::state_format_name(f))) continue;
    add("AdamW nocheck", lowbit::state_format_name(f),
        std::make_shared<lo::AdamW>(one(),
                                    lo::AdamWOptions(1e-3).state_format(f).skip_nonfinite(false)));
  }
  // bf16 parameters and gradients (half the parameter bytes; memcpy and torch rows stay fp32).
  if (want("AdamW-bf16", "Q8"))
    add("AdamW-bf16", "Q8", std::make_shared<lo::AdamW>(one(at::kBFloat16),
                                                        lo::AdamWOptions(1e-3).state_format(StateFormat::Q8)));
  // bf16 parameters rounded stochastically (bf16_stochastic_round), quantized or bf16 state.
  for (StateFormat f : {StateFormat::Q8, StateFormat::BF16}) {
    if (!want("AdamW-bf16-SR", lowbit::state_format_name(f))) continue;
    add("AdamW-bf16-SR", lowbit::state_format_name(f),
        std::make_shared<lo::AdamW>(one(at::kBFloat16),
                                    lo::AdamWOptions(1e-3).state_format(f).bf16_stochastic_round(true)));
  }
  // bf16 parameters with a 24-bit master correction (the memory floor's, and host offload's), Q8 and Q4.
  for (StateFormat f : {StateFormat::Q8, StateFormat::Q4}) {
    if (!want("AdamW-bf16-m24", lowbit::state_format_name(f))) continue;
    add("AdamW-bf16-m24", lowbit::state_format_name(f),
        std::make_shared<lo::AdamW>(one(at::kBFloat16),
                                    lo::AdamWOptions(1e-3).state_format(f).master_weight_bits(24)));
  }
  // bf16 parameters with the 32-bit mode's int16 correction, and fp16 parameters: the shapes the
  // vector files' per-block loop takes (AVX2's, also on AVX-512 machines).
  if (want("AdamW-bf16-m32", "Q8"))
    add("AdamW-bf16-m32", "Q8",
        std::make_shared<lo::AdamW>(one(at::kBFloat16),
                                    lo::AdamWOptions(1e-3).state_format(StateFormat::Q8).master_weight_bits(32)));
  if (want("AdamW-fp16", "Q8"))
    add("AdamW-fp16", "Q8", std::make_shared<lo::AdamW>(one(at::kHalf),
                                                        lo::AdamWOptions(1e-3).state_format(StateFormat::Q8)));
  // The other optimizers in Q8.
  if (want("Adam", "Q8")) add("Adam", "Q8", std::make_shared<lo::Adam>(one(), lo::AdamOptions(1e-3)));
  if (want("SGD", "Q8")) add("SGD", "Q8", std::make_shared<lo::SGD>(one(), lo::SGDOptions(1e-3).momentum(0.9)));
  if (want("Lion", "Q8")) add("Lion", "Q8", std::make_shared<lo::Lion>(one(), lo::LionOptions()));
  if (want("RMSprop", "Q8")) add("RMSprop", "Q8", std::make_shared<lo::RMSprop>(one(), lo::RMSpropOptions()));
  if (want("Adagrad", "Q8")) add("Adagrad", "Q8", std::make_shared<lo::Adagrad>(one(), lo::AdagradOptions()));
  if (want("AdEMAMix", "Q8")) add("AdEMAMix", "Q8", std::make_shared<lo::AdEMAMix>(one(), lo::AdEMAMixOptions()));
  if (want("LAMB", "Q8")) add("LAMB", "Q8", std::make_shared<lo::LAMB>(one(), lo::LAMBOptions()));
  // LAMB's check rides on its first pass (LowbitOptimizer::step_only); "prepass" is the check as its
  // own read of the gradients first (a flag given to step_parameters), "nocheck" none at all.
  if (want("LAMB prepass", "Q8")) {
    struct PrePass {
      at::Tensor p;
      lo::LAMB o;
      explicit PrePass(const at::Tensor& q) : p(q), o({q}, lo::LAMBOptions()) {}
      void step() { o.step_parameters({p}, std::get<0>(lowbit::ops::grad_check({p.grad()}, {0}, 1, false))); }
    };
    add("LAMB prepass", "Q8", std::make_shared<PrePass>(param(at::kFloat)));
  }
  if (want("LAMB nocheck", "Q8"))
    add("LAMB nocheck", "Q8", std::make_shared<lo::LAMB>(one(), lo::LAMBOptions().skip_nonfinite(false)));

  for (Row& r : rows)
    for (int i = 0; i < 2; ++i) r.step();  // warm-up: state made, pages touched
  for (int round = 0; round < reps; ++round) {
    for (Row& r : rows) {
      const double m = memcpy_once();
      all_memcpy.push_back(m);
      const double t0 = lowbit_bench::now_ms();
      r.step();
      r.ms.push_back(lowbit_bench::now_ms() - t0);
      r.per_memcpy.push_back(r.ms.back() / m);
    }
    for (Row& r : rows) r.per_fused.push_back(r.ms.back() / rows[fused_row].ms.back());
  }

  // Many small tensors: 4096 of 4096 elements (per-parameter overhead, one fused launch per group).
  if (want("small", "Q8")) {
    std::vector<at::Tensor> small, small_torch;
    for (int i = 0; i < 4096; ++i) {
      small.push_back(at::randn({4096}));
      small.back().mutable_grad() = at::randn({4096}) * 1e-3;
      small_torch.push_back(small.back().detach().clone());
      small_torch.back().mutable_grad() = small.back().grad().clone();
    }
    torch::optim::AdamW t(small_torch, torch::optim::AdamWOptions(1e-3));
    lo::AdamW o(small, lo::AdamWOptions(1e-3));
    std::vector<at::Tensor> fp, fg, fm, fv, fs;
    for (const at::Tensor& q : small) {
      fp.push_back(q.detach().clone());
      fg.push_back(q.grad().clone());
      fm.push_back(at::zeros_like(q));
      fv.push_back(at::zeros_like(q));
      fs.push_back(at::zeros({}, at::kFloat));
    }
    const auto fused_step = [&] {  // what torch.optim.AdamW(fused=True).step() calls
      at::_foreach_add_(fs, 1);
      at::_fused_adamw_(fp, fg, fm, fv, {}, fs, 1e-3, 0.9, 0.999, 1e-2, 1e-8, false, false);
    };
    const double tms = lowbit_bench::time_ms([&] { t.step(); }, false, reps, 2);
    const double fms = lowbit_bench::time_ms(fused_step, false, reps, 2);
    const double oms = lowbit_bench::time_ms([&] { o.step(); }, false, reps, 2);
    std::printf("4096 tensors of 4096: torch AdamW %.2f ms, ATen fused %.2f ms, lowbit AdamW Q8 %.2f ms (%.2fx fused)\n",
                tms, fms, oms, oms / fms);
  }
  // The host offload's CPU work alone: the GPT example's block matrices at 1.21B parameters (24 blocks
  // of width 2048: qkv, projection, the two MLP matrices), bf16 with a 24-bit master and Q8 or Q4 state,
  // stepped one parameter at a time as HostOffload steps them, each with its non-finite flag made
  // beforehand (the offload makes it on the accelerator); "offload-pinned:Q8" puts the weights and
  // gradients in pinned memory, as the offload's host copies and staging buffers are ("offload:Q4", ...
  // the same with Q4 state). Only when
  // named in ROWS (9 GB of host memory).
  for (const bool pinned : {false, true}) {
  for (const StateFormat format : {StateFormat::Q8, StateFormat::Q4}) {
    const std::string name = pinned ? "offload-pinned" : "offload";
    if (only.find("," + name + ":" + lowbit::state_format_name(format) + ",") == std::string::npos) continue;
    if (pinned && !at::globalContext().hasCUDA()) {
      std::printf("%s: no accelerator, so no pinned memory\n", name.c_str());
      continue;
    }
    std::vector<at::Tensor> params;
    int64_t total = 0;
    for (int block = 0; block < 24; ++block)
      for (const int64_t numel : {2048 * 6144, 2048 * 2048, 2048 * 8192, 8192 * 2048}) {
        const auto options = at::TensorOptions().dtype(at::kBFloat16).pinned_memory(pinned);
        params.push_back(at::empty({numel}, options).copy_(at::randn({numel})));
        params.back().mutable_grad() = at::empty({numel}, options).copy_(at::randn({numel}) * 1e-3);
        total += numel;
      }
    lo::AdamW opt(params, lo::AdamWOptions(1e-3).state_format(format).master_weight_bits(24));
    std::vector<at::Tensor> found;
    for (size_t k = 0; k < params.size(); ++k) found.push_back(at::zeros({1}));  // randn gradients: finite
    const auto each = [&] {
      for (size_t k = 0; k < params.size(); ++k) opt.step_parameters({params[k]}, found[k]);
    };
    std::vector<double> ms;
    for (int i = 0; i < reps + 2; ++i) {
      memcpy_once();
      const double t0 = lowbit_bench::now_ms();
      each();
      if (i >= 2) ms.push_back(lowbit_bench::now_ms() - t0);
    }
    const double med = lowbit_bench::median(ms);
    std::printf("%s:%s: %lld parameters in %zu tensors, one at a time: %.1f ms a step, %.3f ns/param\n", name.c_str(),
                lowbit::state_format_name(format), static_cast<long long>(total), params.size(), med,
                med * 1e6 / static_cast<double>(total));
  }
  }
  const double memcpy_ms = lowbit_bench::median(all_memcpy), fused_ms = lowbit_bench::median(rows[fused_row].ms);
  const double torch_ms = want("torch", "FP32") ? lowbit_bench::median(rows[0].ms) : fused_ms;
  std::printf("%-14s %-6s %10s %10s %10s %18s %10s %8s\n", "optimizer", "state", "ms", "ns/param", "x torch",
              "x fused [range]", "x memcpy", "pairs");
  std::printf("%-14s %-6s %10.2f %10.3f %10.2f %18.2f %10s %8s\n", "memcpy", "-", memcpy_ms, memcpy_ms * 1e6 / n,
              memcpy_ms / torch_ms, memcpy_ms / fused_ms, "1.00", "");
  for (const Row& r : rows) {
    const double ms = lowbit_bench::median(r.ms);
    char fused[40];
    std::snprintf(fused, sizeof fused, "%.2f [%.2f-%.2f]", lowbit_bench::median(r.per_fused),
                  *std::min_element(r.per_fused.begin(), r.per_fused.end()),
                  *std::max_element(r.per_fused.begin(), r.per_fused.end()));
    std::printf("%-14s %-6s %10.2f %10.3f %10.2f %18s %10.2f %8.2f\n", r.name.c_str(), r.state.c_str(), ms,
                ms * 1e6 / n, ms / torch_ms, fused, ms / memcpy_ms, lowbit_bench::median(r.per_memcpy));
  }
  return 0;
}
