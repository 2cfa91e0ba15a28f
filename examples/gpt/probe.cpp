// The max-size probe: layers double until a config fails with out-of-memory, then bisect between
// the last that trained and the first that did not. Each trial builds the model on the device,
// takes --probe-steps steps on random tokens (memory and time do not depend on the text), and
// frees everything (the allocator's cache too) before the next.
#include "probe.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <lowbit/optim/host_offload.h>

#include "memory.h"
#include "model.h"
#include "optimizer.h"
#include "train.h"

namespace gpt {

namespace {

using Clock = std::chrono::steady_clock;

struct Trial {
  int64_t layers = 0, params = 0;
  bool ok = false;
  std::string why;
  int64_t peak_allocated = 0, peak_reserved = 0, weights = 0, grads = 0, state = 0;
  int64_t host = 0;  // --offload: the optimizer's host memory (state, corrections, weight copies, staging)
  // The last step alone: allocated at its start (weights, state, corrections; gradients were set to
  // none), its peak, and the gradients it held at most: every parameter's without release, the
  // largest parameter's with it (each gradient is stepped and freed as soon as autograd has summed
  // it). held = start + gradients: what training keeps per parameter, activations apart.
  int64_t step_start = 0, step_peak = 0, grads_held = 0;
  double step_ms = 0;
  // --probe-save: torch::save(optimizer) of this config
  double save_s = 0;
  int64_t save_device_extra = 0, save_host_peak_before = 0, save_host_peak_after = 0, save_file_bytes = 0;
};

bool is_oom(const std::string& what) {
  return what.find("out of memory") != std::string::npos || what.find("not enough memory") != std::string::npos ||
         what.find("can't allocate memory") != std::string::npos ||
         what.find("CUBLAS_STATUS_ALLOC_FAILED") != std::string::npos;
}

Trial run_trial(const Flags& f, int64_t layers, at::Device dev, const std::string& save_path) {
  Trial t;
  t.layers = layers;
  empty_cache(dev);
  reset_peak(dev);
  ModelConfig mc;
  mc.vocab = f.vocab, mc.context = f.context, mc.layers = layers, mc.width = f.width, mc.heads = f.heads;
  mc.dtype = f.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  mc.device = dev, mc.checkpoint_activations = f.checkpoint_activations;
  t.params = count_params(mc);
  try {
    torch::manual_seed(f.seed);
    GPT model(mc);
    const std::vector<at::Tensor> params = model->parameters();
    std::unique_ptr<TrainOptimizer> opt = make_optimizer(f, params);
    opt->set_lr(f.lr);
    const auto opts = at::TensorOptions().dtype(at::kLong).device(dev);
    const at::Tensor x = at::randint(f.vocab, {f.batch, f.context}, opts), y = at::randint(f.vocab, {f.batch, f.context}, opts);
    std::vector<double> ms;
    int64_t trial_peak = 0, trial_reserved = 0;
    for (int64_t s = 0; s < f.probe_steps; ++s) {
      opt->zero_grad();
      if (s + 1 == f.probe_steps) {  // the steps so far peaked at trial_peak
        synchronize(dev);
        const DeviceMemory before = device_memory(dev);
        trial_peak = before.peak_allocated, trial_reserved = before.peak_reserved, t.step_start = before.allocated;
        reset_peak(dev);
      }
      const auto t0 = Clock::now();
      at::Tensor loss = model->loss(x, y);
      loss.backward();
      opt->step();
      synchronize(dev);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    ms.erase(ms.begin());  // the first step creates the optimizer state
    std::sort(ms.begin(), ms.end());
    t.step_ms = ms[ms.size() / 2];
    const DeviceMemory m = device_memory(dev);
    t.step_peak = m.peak_allocated;
    t.peak_allocated = std::max(trial_peak, m.peak_allocated), t.peak_reserved = std::max(trial_reserved, m.peak_reserved);
    int64_t largest = 0;
    for (const at::Tensor& p : params) {
      t.weights += static_cast<int64_t>(p.nbytes());
      if (p.grad().defined()) t.grads += static_cast<int64_t>(p.grad().nbytes());
      largest = std::max<int64_t>(largest, static_cast<int64_t>(p.numel()) * p.element_size());
    }
    // Released gradients: the largest parameter's at a time; offloaded: one per staging buffer.
    const int64_t staged = lowbit::optim::HostOffloadOptions().staging_buffers();
    t.grads_held = f.gradient_release ? largest : f.offload ? staged * largest : t.grads;
    t.state = opt->state_bytes();
    t.host = opt->host_bytes();
    t.ok = true;
    if (!save_path.empty()) {
      synchronize(dev);
      const int64_t before = device_memory(dev).allocated;
      reset_peak(dev);
      t.save_host_peak_before = host_peak_rss();
      const auto t0 = Clock::now();
      opt->save(save_path);
      t.save_s = std::chrono::duration<double>(Clock::now() - t0).count();
      t.save_device_extra = device_memory(dev).peak_allocated - before;
      t.save_host_peak_after = host_peak_rss();
      std::ifstream in(save_path, std::ios::binary | std::ios::ate);
      t.save_file_bytes = static_cast<int64_t>(in.tellg());
    }
  } catch (const c10::OutOfMemoryError&) {
    t.why = "out of memory";
  } catch (const c10::Error& e) {
    if (!is_oom(e.what())) throw;
    t.why = "out of memory (" + std::string(e.what_without_backtrace()).substr(0, 80) + ")";
  }
  empty_cache(dev);  // the model, its gradients and the optimizer are gone: give their memory back
  return t;
}

void print_trial(const Trial& t, const Flags& f) {
  if (t.ok && t.peak_reserved > 0)
    std::printf("  %5lld layers %8.3fB params  ok   peak allocated %s, reserved %s, %.1f ms/step, %.0f tok/s\n",
                (long long)t.layers, t.params / 1e9, gib(t.peak_allocated).c_str(), gib(t.peak_reserved).c_str(), t.step_ms,
                f.batch * f.context / (t.step_ms / 1e3));
  else if (t.ok)
    std::printf("  %5lld layers %8.3fB params  ok   host peak resident set %s, %.1f ms/step, %.0f tok/s\n", (long long)t.layers,
                t.params / 1e9, gib(host_peak_rss()).c_str(), t.step_ms, f.batch * f.context / (t.step_ms / 1e3));
  else
    std::printf("  %5lld layers %8.3fB params  FAIL %s\n", (long long)t.layers, t.params / 1e9, t.why.c_str());
  std::fflush(stdout);
}

}  // namespace

int run_probe(const Flags& f) {
  const at::Device dev = device_of(f);
  TORCH_CHECK(!dev.is_cpu() || f.probe_max_layers != Flags().probe_max_layers,
              "--probe-max-size on the CPU: an out-of-memory there ends the process instead of failing a step; "
              "give --probe-max-layers N to cap the search");
  const std::string what = f.optimizer + " " + (f.optimizer == "torch-adamw" ? std::string("(state ") + f.dtype + ")"
                                                                              : lowbit::state_format_name(f.state_format));
  std::printf("probe: %s, %s parameters%s%s%s, width %lld, %lld heads, context %lld, batch %lld, vocab %lld, %s\n",
              what.c_str(), f.dtype.c_str(), f.stochastic_round ? ", stochastic rounding" : "",
              f.master_weight_bits ? (", " + std::to_string(f.master_weight_bits) + "-bit master weights").c_str() : "",
              f.checkpoint_activations ? ", activation checkpointing" : "", (long long)f.width, (long long)f.heads,
              (long long)f.context, (long long)f.batch, (long long)f.vocab, dev.str().c_str());
  // The caching allocator's statistics and emptyCache need it initialized: one allocation does.
  at::zeros({1}, at::TensorOptions().device(dev));
  std::vector<Trial> trials;
  auto attempt = [&](int64_t layers) {
    trials.push_back(run_trial(f, layers, dev, ""));
    print_trial(trials.back(), f);
    return trials.back().ok;
  };
  int64_t good = 0, bad = 0;
  for (int64_t l = std::min(f.layers, f.probe_max_layers);; l = std::min(2 * l, f.probe_max_layers)) {
    if (!attempt(l)) {
      bad = l;
      break;
    }
    good = l;
    if (l >= f.probe_max_layers) break;
  }
  while (bad && bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    if (attempt(mid)) good = mid;
    else bad = mid;
  }
  // ---- CSV of every trial, then the result
  std::ofstream csv(f.out + ".csv");
  csv << "layers,params,ok,peak_allocated,peak_reserved,weights,gradients,optimizer_state,step_ms,step_start,step_peak,"
         "gradients_held\n";
  for (const Trial& t : trials)
    csv << t.layers << "," << t.params << "," << t.ok << "," << t.peak_allocated << "," << t.peak_reserved << ","
        << t.weights << "," << t.grads << "," << t.state << "," << t.step_ms << "," << t.step_start << ","
        << t.step_peak << "," << t.grads_held << "\n";
  csv.close();
  const auto best = std::find_if(trials.begin(), trials.end(), [&](const Trial& t) { return t.ok && t.layers == good; });
  if (best == trials.end()) {
    std::printf("probe: not even %lld layer(s) trained (%s)\n", (long long)bad, trials.back().why.c_str());
    return 1;
  }
  std::printf("largest: %lld layers, %.3fB parameters, %s %s, step %.1f ms%s\n", (long long)best->layers,
              best->params / 1e9, best->peak_reserved > 0 ? "peak allocated" : "host peak resident set (of every trial)",
              gib(best->peak_reserved > 0 ? best->peak_allocated : host_peak_rss()).c_str(), best->step_ms,
              bad ? "" : " (the --probe-max-layers cap; no failure reached)");
  if (best->peak_reserved > 0) {
    const int64_t other = best->peak_allocated - best->weights - best->grads - best->state;
    std::printf("  at the peak: weights %s + gradients %s + optimizer state %s + activations and temporaries %s; "
                "reserved %s (allocator slack %s)\n",
                gib(best->weights).c_str(), gib(best->grads).c_str(), gib(best->state).c_str(), gib(other).c_str(),
                gib(best->peak_reserved).c_str(), gib(best->peak_reserved - best->peak_allocated).c_str());
    const int64_t held = best->step_start + best->grads_held;
    std::printf("  a step: starts at %s allocated (weights, optimizer state and corrections), holds gradients of %s "
                "at most%s; held %.2f B/param; its peak %s = held + activations and temporaries %s\n",
                gib(best->step_start).c_str(), gib(best->grads_held).c_str(),
                f.gradient_release ? " (released: the largest parameter's)" : "", double(held) / double(best->params),
                gib(best->step_peak).c_str(), gib(best->step_peak - held).c_str());
  } else {
    std::printf("  weights %s, gradients %s, optimizer state %s\n", gib(best->weights).c_str(), gib(best->grads).c_str(),
                gib(best->state).c_str());
  }
  if (best->host)
    std::printf("  offloaded to the host: %s (%.2f B/param); host peak resident set %s\n", gib(best->host).c_str(),
                double(best->host) / double(best->params), gib(host_peak_rss()).c_str());
  std::printf("trials: %s.csv\n", f.out.c_str());
  if (!f.probe_save.empty()) {
    const Trial s = run_trial(f, good, dev, f.probe_save);
    if (!s.ok) {
      std::printf("probe-save: the largest config failed this time (%s)\n", s.why.c_str());
      return 1;
    }
    std::printf("save: torch::save(optimizer) of the %lld-layer model to %s: %.1f s, %s on disk (state %s); device "
                "memory above what was allocated: %s; host peak resident set %s -> %s\n",
                (long long)good, f.probe_save.c_str(), s.save_s, gib(s.save_file_bytes).c_str(), gib(s.state).c_str(),
                gib(s.save_device_extra).c_str(), gib(s.save_host_peak_before).c_str(), gib(s.save_host_peak_after).c_str());
  }
  return 0;
}

}  // namespace gpt
