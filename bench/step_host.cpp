// bench/step_host: where the host's time of one optimizer step over many small tensors goes, split
// by layer: the whole opt.step() (replaying its step graph, then with step graphs off), the
// gradient pre-pass op, the step op's argument checks, the step op through the dispatcher (checks
// + launch preparation + kernel launches), and the raw cost of
// touching every tensor once. Host time = enqueueing only (no device wait), the median of several
// runs of `inner` calls each. On the CPU the op times include the kernel itself.
//   step_host [cpu|cuda] [tensors=4096] [numel=4096] [state=Q8|FP32|...] [bf16_master24]
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <lowbit/lowbit.h>
#include <lowbit/tensors/optim_ops.h>

#include "timing.h"
#include <lowbit/tools/program_args.h>

namespace lo = lowbit::optim;
using lowbit::StateFormat;

namespace {

void sync(const at::Device& d) {
  if (d.is_cuda()) at::empty({1}, at::device(d)).cpu();  // a host read drains the stream
}

// Median over 7 runs of the host time of `inner` calls of fn, in microseconds per call; the
// device drains between runs so a full launch queue never blocks the host.
double host_us(const std::function<void()>& fn, const at::Device& d, int inner) {
  fn();
  sync(d);
  std::vector<double> us;
  for (int r = 0; r < 7; ++r) {
    const double t0 = lowbit_bench::now_ms();
    for (int i = 0; i < inner; ++i) fn();
    us.push_back((lowbit_bench::now_ms() - t0) * 1e3 / inner);
    sync(d);
  }
  return lowbit_bench::median(us);
}

StateFormat parse_format(const std::string& s) {
  for (StateFormat f : lowbit::kAllStateFormats)
    if (lowbit::state_format_name(f) == s) return f;
  std::fprintf(stderr, "unknown state format %s\n", s.c_str());
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv,
                               "usage: bench_step_host [cpu|cuda [TENSORS [NUMEL [FORMAT [bf16_master24]]]]]\n"
                               "The host's time of one step over many small tensors, by layer.\n"))
    return 0;
  const at::Device dev(argc > 1 ? argv[1] : "cpu");
  const int64_t n = argc > 2 ? std::atoll(argv[2]) : 4096;
  const int64_t numel = argc > 3 ? std::atoll(argv[3]) : 4096;
  const StateFormat fmt = parse_format(argc > 4 ? argv[4] : "Q8");
  const bool master = argc > 5 && std::strcmp(argv[5], "bf16_master24") == 0;
  at::set_num_threads(1);
  const auto dt = master ? at::kBFloat16 : at::kFloat;
  std::vector<at::Tensor> params;
  for (int64_t i = 0; i < n; ++i) {
    params.push_back(at::randn({numel}, at::device(dev)).to(dt));
    params.back().mutable_grad() = (at::randn({numel}, at::device(dev)) * 1e-3).to(dt);
  }
  auto options = lo::AdamWOptions(1e-3).state_format(fmt);
  if (master) options.master_weight_bits(24);
  lo::AdamW opt(params, options);
  opt.step();

  // The step op's arguments, built as the optimizer builds them (one group, one layout).
  lowbit::ops::StepArgs a;
  const lo::ParamState* st0 = opt.state_of(params[0]);
  for (const auto& s : st0->slots) a.slots.push_back(s.type);
  a.block_size = st0->block_size;
  a.config.rule = lowbit::kernels::Rule::AdamW;
  a.config.weight_decay = 0.01;
  a.lr = at::full({1}, 1e-3, at::device(dev).dtype(at::kDouble));
  a.found_inf = at::zeros({1}, at::device(dev).dtype(at::kFloat));
  for (int64_t i = 0; i < n; ++i) {
    const lo::ParamState* st = opt.state_of(params[i]);
    a.params.push_back(params[i]);
    a.grads.push_back(params[i].grad());
    a.counters.push_back(st->counters);
    a.rng_keys.push_back(i);
    for (const auto& s : st->slots) {
      if (s.type.storage == lowbit::kernels::SlotStorage::Quant) {
        a.state.push_back(s.quantized.codes());
        a.state.push_back(s.quantized.absmax());
      } else if (s.type.storage != lowbit::kernels::SlotStorage::None) {
        a.state.push_back(s.dense);
      }
    }
  }
  const std::vector<int64_t> groups(n, 0);

  std::printf("step_host on %s: %lld tensors of %lld, %s%s; host microseconds per call (per tensor)\n",
              dev.str().c_str(), static_cast<long long>(n), static_cast<long long>(numel), argv[4] ? argv[4] : "Q8",
              master ? ", bf16 + 24-bit master" : "");
  const auto row = [&](const char* name, double us) {
    std::printf("  %-44s %10.1f us  (%6.3f us/tensor)\n", name, us, us / n);
  };
  const int inner = dev.is_cuda() ? 8 : 3;
  // For a profiler: one layer alone, reps x `inner` calls (LOWBIT_STEP_HOST_ONLY=step, check or op;
  // LOWBIT_STEP_HOST_REPS=reps, 25 if unset).
  if (const char* only = std::getenv("LOWBIT_STEP_HOST_ONLY")) {
    const std::string o = only;
    const std::function<void()> fn = o == "step"    ? std::function<void()>([&] { opt.step(); })
                                     : o == "check" ? std::function<void()>([&] { lowbit::ops::check_step_call(a, "lowbit::optim_step_"); })
                                                    : std::function<void()>([&] { lowbit::ops::optim_step(a); });
    const char* reps = std::getenv("LOWBIT_STEP_HOST_REPS");
    for (int r = 0, n_reps = reps ? std::atoi(reps) : 25; r < n_reps; ++r) {
      for (int i = 0; i < inner; ++i) fn();
      sync(dev);
    }
    return 0;
  }
  row("opt.step()", host_us([&] { opt.step(); }, dev, inner));
  std::printf("  (step graph replays so far: %lld)\n", static_cast<long long>(opt.step_graph_replays()));
  opt.set_step_graphs(false);
  row("opt.step(), step graphs off", host_us([&] { opt.step(); }, dev, inner));
  opt.set_step_graphs(true);
  // Gradient release and host offload step one parameter at a time (LowbitOptimizer::step_parameters).
  row("step_parameters, each tensor alone", host_us([&] {
        for (const at::Tensor& p : params) opt.step_parameters({p});
      }, dev, 1));
  row("grad_check op (pre-pass)", host_us([&] { lowbit::ops::grad_check(a.grads, groups, 1, false); }, dev, inner));
  row("check_step_call (argument checks)",
      host_us([&] { lowbit::ops::check_step_call(a, "lowbit::optim_step_"); }, dev, inner));
  row("optim_step_ op (dispatcher, checks, launch)", host_us([&] { lowbit::ops::optim_step(a); }, dev, inner));
  int64_t sink = 0;
  row("touch: data_ptr of every argument tensor", host_us(
                                                      [&] {
                                                        for (const auto* v : {&a.params, &a.grads, &a.state, &a.counters})
                                                          for (const at::Tensor& t : *v)
                                                            sink += reinterpret_cast<intptr_t>(t.const_data_ptr());
                                                      },
                                                      dev, inner));
  row("touch: copy the argument lists",
      host_us([&] { lowbit::ops::StepArgs b = a; sink += static_cast<int64_t>(b.state.size()); }, dev, inner));
  std::printf("  (sink %lld)\n", static_cast<long long>(sink & 1));
  return 0;
}
