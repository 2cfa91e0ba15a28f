// bench/optim_step_gpu: one optimizer step on the GPU, ms per step (median of CUDA-event timings),
// for every lowbit rule x state format, ATen's fused AdamW (at::_fused_adamw_: fp32 state; bf16
// params with bf16 state), and a device copy of the bytes the Q8 AdamW step moves, in one run.
// "GB/s" and "% copy" count the bytes a row must move: each input read once, each output written
// once (the parameter; every state slot, its block scales and any master-weight correction, as the
// optimizer holds them); the non-finite check reads the gradient once more, LAMB's norm pass reads
// the parameter, the gradient and the state once more. "x fused" divides by ATen's fused fp32
// AdamW of the same run. The last line names the rule x format row (fp32 parameters, check on)
// furthest from the copy.
//   optim_step_gpu [tensors=64] [rows=4096] [cols=4096] [reps=20]
//   (also reached as `bench_optim_step --device cuda [...]`)
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <lowbit/lowbit.h>
#include <lowbit/tools/program_args.h>

#include "optim_step_gpu.h"
#include "timing.h"

namespace lo = lowbit::optim;
using lowbit::StateFormat;

namespace {

using lowbit_bench::median;

double time_ms(const std::function<void()>& fn, int reps) { return lowbit_bench::time_ms(fn, true, reps); }

struct Row {
  std::string name;
  double ms, bytes_per_param, state_bytes_per_param;
  double host_ms = 0;  // time to enqueue one step (no device wait), lowbit rows
};

int64_t g_tensors, g_rows, g_cols, g_reps;
double g_copy_gbs = 0, g_fused_ms = 0;
std::vector<Row> g_table;

void report(const Row& r, int64_t numel) {
  const double gbs = r.bytes_per_param * numel / (r.ms * 1e6);
  g_table.push_back(r);
  std::printf("%-38s %9.3f ms %8.1f GB/s %6.1f %% copy %6.2f x fused  %5.2f B/param state  %7.3f ms host\n",
              r.name.c_str(), r.ms, gbs, g_copy_gbs > 0 ? 100.0 * gbs / g_copy_gbs : 0.0,
              g_fused_ms > 0 ? r.ms / g_fused_ms : 0.0, r.state_bytes_per_param, r.host_ms);
  std::fflush(stdout);
}

std::vector<at::Tensor> make(int64_t tensors, int64_t rows, int64_t cols, at::ScalarType dt, double scale) {
  std::vector<at::Tensor> v;
  for (int64_t i = 0; i < tensors; ++i) v.push_back((at::randn({rows, cols}, at::device(at::kCUDA)) * scale).to(dt));
  return v;
}

// Bytes a step moves per parameter: p read and written, g read (once more for the check), every
// state byte (codes, block scales, a master-weight correction) read and written; a norm pass before
// the update (LAMB) reads p, g and the state once more.
double step_bytes(at::ScalarType pt, double state_bytes, bool check, bool norm_pass) {
  const double p = pt == at::kFloat ? 4 : 2;
  return 2 * p + p * (check ? 2 : 1) + 2 * state_bytes + (norm_pass ? 2 * p + state_bytes : 0);
}

// The rule x format rows (fp32 parameters, check on): their % of copy, for the closing line.
std::vector<std::pair<std::string, double>> g_matrix;
double percent_of_copy(const Row& r, int64_t numel) { return 100.0 * r.bytes_per_param * numel / (r.ms * 1e6) / g_copy_gbs; }

// Besides one step timed from an idle device (the rows above; the host's enqueue time shows in
// them), how a training loop sees many small tensors: steps back to back (the host enqueues step
// k + 1 while the device runs step k) and one step captured in a CUDA graph and replayed. The
// first step of a run waits for the host alone (nothing is queued yet): 50 steps per run make it
// a fiftieth of each, as in a long training loop (10 made it a tenth, ~1 ms of 4096 tensors' step).
constexpr int kBackToBack = 50;
template <typename Fn>
double back_to_back_ms(Fn fn) {
  return time_ms([&] {
    for (int i = 0; i < kBackToBack; ++i) fn();
  }, std::max<int>(3, static_cast<int>(g_reps) / 4)) / kBackToBack;
}
template <typename Fn>
double graph_replay_ms(Fn fn) {
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool();
    c10::cuda::CUDAStreamGuard guard(stream);
    graph.capture_begin();
    fn();
    graph.capture_end();
  }
  return time_ms([&] { graph.replay(); }, static_cast<int>(g_reps));
}

// Host time to enqueue one step from an idle device (median of 5): what small tensors cost when the
// GPU outruns the host.
double enqueue_ms(lowbit::optim::LowbitOptimizer& opt) {
  std::vector<double> host;
  for (int i = 0; i < 5; ++i) {
    torch::cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    opt.step();
    host.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  torch::cuda::synchronize();
  return median(host);
}

struct Shape {
  int64_t tensors, rows, cols;
};

// One lowbit row; `overlapped` adds the back-to-back and CUDA-graph rows, `norm_pass` counts LAMB's
// extra read, `matrix` enters the row in the rule x format summary.
template <typename Opt, typename Options>
void lowbit_row(const std::string& name, Options opts, at::ScalarType pt, Shape shape, bool overlapped = false,
                bool norm_pass = false, bool matrix = false) {
  std::vector<at::Tensor> p = make(shape.tensors, shape.rows, shape.cols, pt, 1.0);
  for (auto& t : p) t.mutable_grad() = (at::randn_like(t, at::kFloat) * 1e-2).to(pt);
  Opt opt(p, opts);
  const double ms = time_ms([&] { opt.step(); }, static_cast<int>(g_reps));
  const double host_ms = enqueue_ms(opt);
  const int64_t numel = shape.tensors * shape.rows * shape.cols;
  const double state = double(opt.state_bytes()) / numel;
  Row r{name, ms, step_bytes(pt, state, opts.skip_nonfinite(), norm_pass), state};
  r.host_ms = host_ms;
  report(r, numel);
  if (matrix) g_matrix.emplace_back(name, percent_of_copy(r, numel));
  if (overlapped) {
    // Back to back with the optimizer's own step graphs (the default), then with them off (every
    // step enqueued anew: the host's pass over every tensor), then one step captured by the caller.
    report({name + ", back to back", back_to_back_ms([&] { opt.step(); }), r.bytes_per_param, r.state_bytes_per_param}, numel);
    std::printf("  (step graph replays so far: %lld)\n", static_cast<long long>(opt.step_graph_replays()));
    opt.set_step_graphs(false);
    Row off{name + ", back to back, graphs off", back_to_back_ms([&] { opt.step(); }), r.bytes_per_param,
            r.state_bytes_per_param};
    off.host_ms = enqueue_ms(opt);
    report(off, numel);
    report({name + ", CUDA graph", graph_replay_ms([&] { opt.step(); }), r.bytes_per_param, r.state_bytes_per_param}, numel);
  }
}

// Every state format of one rule, fp32 parameters, check on.
template <typename Opt, typename MakeOptions>
void rule_rows(const std::string& rule, MakeOptions make_options, Shape shape, bool norm_pass = false) {
  for (StateFormat f : lowbit::kAllStateFormats)
    lowbit_row<Opt>("lowbit " + rule + " " + lowbit::state_format_name(f), make_options().state_format(f),
                    at::kFloat, shape, false, norm_pass, true);
}

// ATen's fused AdamW (what torch.optim.AdamW(fused=True) runs) over tensors of dtype: parameters
// and state of that dtype, fp32 step counts.
double aten_fused_row(const std::string& name, int64_t tensors, int64_t rows, int64_t cols, at::ScalarType dt,
                      int64_t n, bool overlapped = false) {
  std::vector<at::Tensor> p = make(tensors, rows, cols, dt, 1.0), g, m, v, steps;
  for (auto& t : p) {
    g.push_back((at::randn_like(t, at::kFloat) * 1e-2).to(dt));
    m.push_back(at::zeros_like(t));
    v.push_back(at::zeros_like(t));
    steps.push_back(at::zeros({}, t.options().dtype(at::kFloat)));
  }
  const auto step = [&] {
    at::_foreach_add_(steps, 1);
    at::_fused_adamw_(p, g, m, v, {}, steps, 1e-3, 0.9, 0.999, 1e-2, 1e-8, false, false);
  };
  const double ms = time_ms(step, static_cast<int>(g_reps));
  const bool f32 = dt == at::kFloat;
  report({name, ms, f32 ? 28.0 : 14.0, f32 ? 8.0 : 4.0}, n);
  if (overlapped) {
    report({name + ", back to back", back_to_back_ms(step), f32 ? 28.0 : 14.0, f32 ? 8.0 : 4.0}, n);
    report({name + ", CUDA graph", graph_replay_ms(step), f32 ? 28.0 : 14.0, f32 ? 8.0 : 4.0}, n);
  }
  return ms;
}

}  // namespace

int lowbit_bench::optim_step_gpu_main(int argc, char** argv) {
  constexpr const char* kUsage =
      "usage: bench_optim_step_gpu [TENSORS [ROWS [COLS [REPS]]]]\n"
      "One optimizer step on the GPU per rule and state format over TENSORS tensors of ROWS x COLS,\n"
      "beside ATen's fused AdamW and a device copy (medians of REPS steps).\n";
  if (lowbit_tools::wants_help(argc, argv, kUsage)) return 0;
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "optim_step_gpu: no CUDA device visible\n");
    return 2;
  }
  g_tensors = argc > 1 ? lowbit_tools::int_arg(argv[1], "TENSORS", 1, kUsage) : 64;
  g_rows = argc > 2 ? lowbit_tools::int_arg(argv[2], "ROWS", 1, kUsage) : 4096;
  g_cols = argc > 3 ? lowbit_tools::int_arg(argv[3], "COLS", 1, kUsage) : 4096;
  g_reps = argc > 4 ? lowbit_tools::int_arg(argv[4], "REPS", 1, kUsage) : 20;
  const int64_t n = g_tensors * g_rows * g_cols;
  std::printf("GPU %s, %lld tensors of %lld x %lld = %.3f B params, median of %lld steps\n",
              at::cuda::getCurrentDeviceProperties()->name, (long long)g_tensors, (long long)g_rows, (long long)g_cols,
              n / 1e9, (long long)g_reps);
  torch::NoGradGuard no_grad;
  {
    // A device copy of 8 bytes/param: 16 bytes moved (the Q8 AdamW step without the check).
    at::Tensor src = at::randn({n * 2}, at::device(at::kCUDA)), dst = at::empty_like(src);
    const double ms = time_ms([&] { dst.copy_(src); }, static_cast<int>(g_reps));
    g_copy_gbs = 16.0 * n / (ms * 1e6);
    report({"device copy (16 B/param)", ms, 16, 0}, n);
  }
  g_fused_ms = aten_fused_row("ATen _fused_adamw_ fp32", g_tensors, g_rows, g_cols, at::kFloat, n);
  aten_fused_row("ATen _fused_adamw_ bf16 p+state", g_tensors, g_rows, g_cols, at::kBFloat16, n);
  const Shape big{g_tensors, g_rows, g_cols};
  const auto F = at::kFloat, BF = at::kBFloat16;
  // AdamW in every format (fp32 parameters), then with the check off.
  rule_rows<lo::AdamW>("AdamW", [] { return lo::AdamWOptions(1e-3); }, big);
  lowbit_row<lo::AdamW>("lowbit AdamW Q8, check off", lo::AdamWOptions(1e-3).skip_nonfinite(false).state_format(StateFormat::Q8), F, big);
  lowbit_row<lo::AdamW>("lowbit AdamW C8, check off", lo::AdamWOptions(1e-3).skip_nonfinite(false).state_format(StateFormat::C8), F, big);
  // bf16 parameters rounded to nearest, as ATen's bf16 row stores them: 10 bytes per parameter (12 with the check).
  lowbit_row<lo::AdamW>("lowbit AdamW Q8, bf16 params", lo::AdamWOptions(1e-3).state_format(StateFormat::Q8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW Q8, bf16 params, check off", lo::AdamWOptions(1e-3).skip_nonfinite(false).state_format(StateFormat::Q8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW Q8, bf16 params SR", lo::AdamWOptions(1e-3).bf16_stochastic_round(true).state_format(StateFormat::Q8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW BF16, bf16 params", lo::AdamWOptions(1e-3).state_format(StateFormat::BF16), BF, big);
  // Master weights (bf16 params + correction, read and written like the state).
  lowbit_row<lo::AdamW>("lowbit AdamW Q8, bf16 + 24-bit master", lo::AdamWOptions(1e-3).master_weight_bits(24).state_format(StateFormat::Q8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW Q8, bf16 + 24-bit master, check off", lo::AdamWOptions(1e-3).master_weight_bits(24).skip_nonfinite(false).state_format(StateFormat::Q8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW Q8, bf16 + 32-bit master", lo::AdamWOptions(1e-3).master_weight_bits(32).state_format(StateFormat::Q8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW C8, bf16 + 24-bit master", lo::AdamWOptions(1e-3).master_weight_bits(24).state_format(StateFormat::C8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW C8, bf16 + 24-bit master, check off", lo::AdamWOptions(1e-3).master_weight_bits(24).skip_nonfinite(false).state_format(StateFormat::C8), BF, big);
  lowbit_row<lo::AdamW>("lowbit AdamW Q4, bf16 + 24-bit master, check off", lo::AdamWOptions(1e-3).master_weight_bits(24).skip_nonfinite(false).state_format(StateFormat::Q4), BF, big);
  // Every other rule in every format.
  rule_rows<lo::Adam>("Adam", [] { return lo::AdamOptions(1e-3); }, big);
  rule_rows<lo::SGD>("SGD momentum", [] { return lo::SGDOptions(1e-2).momentum(0.9); }, big);
  rule_rows<lo::Lion>("Lion", [] { return lo::LionOptions(1e-4); }, big);
  rule_rows<lo::RMSprop>("RMSprop", [] { return lo::RMSpropOptions(1e-3); }, big);
  rule_rows<lo::Adagrad>("Adagrad", [] { return lo::AdagradOptions(1e-2); }, big);
  rule_rows<lo::AdEMAMix>("AdEMAMix", [] { return lo::AdEMAMixOptions(1e-3); }, big);
  rule_rows<lo::LAMB>("LAMB (with its norm pass)", [] { return lo::LAMBOptions(1e-3); }, big, true);
  // The same parameters as 4096 tensors of 256 x 1024 (when the default shape is used).
  if (n % (256 * 1024) == 0) {
    const Shape small{n / (256 * 1024), 256, 1024};
    const std::string many = std::to_string(small.tensors) + " small tensors";
    lowbit_row<lo::AdamW>("lowbit AdamW Q8, " + many, lo::AdamWOptions(1e-3).state_format(StateFormat::Q8), F, small, true);
    aten_fused_row("ATen _fused_adamw_ fp32, small tensors", small.tensors, 256, 1024, at::kFloat, n, true);
    lowbit_row<lo::AdamW>("lowbit AdamW C8, " + many, lo::AdamWOptions(1e-3).state_format(StateFormat::C8), F, small, true);
    lowbit_row<lo::AdamW>("lowbit AdamW Q8, bf16 + 24-bit master, check off, " + many,
                          lo::AdamWOptions(1e-3).master_weight_bits(24).skip_nonfinite(false).state_format(StateFormat::Q8),
                          BF, small, true);
  }
  const auto worst = std::min_element(g_matrix.begin(), g_matrix.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
  if (worst != g_matrix.end())
    std::printf("rule x format rows (fp32 params, check on): %zu, the lowest %.1f %% copy (%s)\n", g_matrix.size(),
                worst->second, worst->first.c_str());
  return 0;
}
