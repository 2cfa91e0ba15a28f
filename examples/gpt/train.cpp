// The training loop of examples/gpt and its checkpoints.
#include "train.h"

#include <ATen/Context.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "memory.h"
#include "qat_study.h"
#include "model.h"
#include "optimizer.h"
#include "parallel.h"

namespace gpt {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

uint64_t digest_of(const std::vector<at::Tensor>& params) {
  uint64_t h = fnv1a(nullptr, 0);
  for (const at::Tensor& p : params) {
    if (!p.defined()) return 0;  // not this rank's to digest (--fully-sharded: rank 0's)
    const at::Tensor t = p.detach().contiguous().cpu();
    h = fnv1a(t.data_ptr(), t.nbytes(), h);
  }
  return h;
}

// ---- checkpoints: DIR/model.pt (torch::save of the module), DIR/optimizer.pt (torch::save of the
// optimizer: lowbit's codes + absmax as they are, never expanded), DIR/meta.pt (step, the flags
// that must match, the data digest, the generators' states).

at::Generator generator_of(at::Device d) {
  return d.is_cpu() ? at::detail::getDefaultCPUGenerator() : at::globalContext().defaultGenerator(d);
}

void save_checkpoint(const std::string& dir, const Flags& f, const Corpus& c, GPT& model, TrainOptimizer& opt,
                     int64_t step, at::Device dev) {
  mkdir(dir.c_str(), 0755);
  struct stat st {};
  TORCH_CHECK(stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "--save ", dir, ": cannot create the folder");
  const auto t0 = Clock::now();
  if (opt.saves_weights()) {
    opt.save(dir + "/optimizer");  // every rank its files, weights included
    if (job(f).rank != 0) return;  // the rest is the job's, written once
  } else {
    torch::save(model, dir + "/model.pt");
    opt.save(dir + "/optimizer.pt");
  }
  torch::serialize::OutputArchive meta;
  meta.write("version", at::tensor(int64_t(1)));
  meta.write("step", at::tensor(step));
  meta.write("key", c10::IValue(resume_key(f)));
  meta.write("data_digest", at::tensor(static_cast<int64_t>(c.digest)));
  {
    at::Generator g = generator_of(at::kCPU);
    std::lock_guard<std::mutex> lock(g.mutex());
    meta.write("cpu_rng", g.get_state());
  }
  if (!dev.is_cpu()) {
    at::Generator g = generator_of(dev);
    std::lock_guard<std::mutex> lock(g.mutex());
    meta.write("device_rng", g.get_state());
  }
  meta.save_to(dir + "/meta.pt");
  if (!f.quiet) std::printf("saved step %lld to %s/ (%.2f s)\n", static_cast<long long>(step), dir.c_str(), seconds_since(t0));
}

int64_t load_checkpoint(const std::string& dir, const Flags& f, const Corpus& c, GPT& model, TrainOptimizer& opt,
                        at::Device dev) {
  struct stat st {};
  // --sharded / --fully-sharded: the ranks' files (optimizer.rank-R-of-N, any N) hold the weights;
  // load() names what is missing among them.
  TORCH_CHECK(stat((dir + "/meta.pt").c_str(), &st) == 0 &&
                  (opt.saves_weights() ||
                   (stat((dir + "/model.pt").c_str(), &st) == 0 && stat((dir + "/optimizer.pt").c_str(), &st) == 0)),
              "--resume ", dir, ": no checkpoint there (it holds meta.pt, and model.pt and optimizer.pt or, written "
              "by --sharded / --fully-sharded, optimizer.rank-R-of-N; written by --save)");
  torch::serialize::InputArchive meta;
  meta.load_from(dir + "/meta.pt");
  c10::IValue key;
  meta.read("key", key);
  if (key.toStringRef() != resume_key(f)) {
    std::istringstream saved(key.toStringRef()), now(resume_key(f));
    std::string a, b, diff;
    while (saved >> a && now >> b)
      if (a != b) diff += "\n  " + a.substr(0, a.find('=')) + ": checkpoint " + a.substr(a.find('=') + 1) + ", this run " + b.substr(b.find('=') + 1);
    TORCH_CHECK(false, "--resume ", dir, ": the checkpoint was written with other flags:", diff);
  }
  at::Tensor step, digest;
  meta.read("step", step);
  meta.read("data_digest", digest);
  TORCH_CHECK(static_cast<uint64_t>(digest.item<int64_t>()) == c.digest, "--resume ", dir,
              ": the checkpoint was trained on other data (--data / --data-limit / --vocab give other tokens)");
  if (opt.saves_weights()) {
    opt.load(dir + "/optimizer");
  } else {
    torch::load(model, dir + "/model.pt", dev);
    opt.load(dir + "/optimizer.pt");
  }
  at::Tensor state;
  meta.read("cpu_rng", state);
  {
    at::Generator g = generator_of(at::kCPU);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  }
  if (!dev.is_cpu() && meta.try_read("device_rng", state)) {
    at::Generator g = generator_of(dev);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  }
  return step.item<int64_t>();
}

// Text from the model: temperature 0.8, top 40, after a prompt from the validation text.
std::string sample(GPT& model, const Flags& f, const Corpus& c, at::Device dev) {
  torch::NoGradGuard ng;
  std::vector<int32_t> toks;
  for (int64_t i = 0; i < std::min<int64_t>(8, c.val.numel()); ++i) toks.push_back(static_cast<int32_t>(c.val[i].item<int64_t>()));
  const size_t prompt = toks.size();
  at::Generator gen = at::detail::createCPUGenerator(f.seed);
  for (int64_t i = 0; i < f.sample; ++i) {
    const size_t from = toks.size() > static_cast<size_t>(f.context) ? toks.size() - f.context : 0;
    std::vector<int64_t> window(toks.begin() + from, toks.end());
    const at::Tensor idx = at::tensor(window).view({1, -1}).to(dev);
    const at::Tensor logits = model->forward(idx).select(1, -1).squeeze(0).to(at::kFloat).cpu() / 0.8;
    const auto top = logits.topk(std::min<int64_t>(40, logits.size(0)));
    const at::Tensor probs = at::softmax(std::get<0>(top), 0);
    const int64_t k = at::multinomial(probs, 1, false, gen).item<int64_t>();
    toks.push_back(static_cast<int32_t>(std::get<1>(top)[k].item<int64_t>()));
  }
  return c.bpe.decode(std::vector<int32_t>(toks.begin(), toks.begin() + prompt)) + "|" +
         c.bpe.decode(std::vector<int32_t>(toks.begin() + prompt, toks.end()));
}

void plot(const Flags& f) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) return;
  const std::string gp = f.out + ".gp";
  std::ofstream s(gp);
  s << "set terminal pngcairo size 900,500\nset output '" << f.out << ".png'\nset datafile separator ','\n"
    << "set key top right\nset xlabel 'step'\nset ylabel 'cross-entropy (nats/token)'\n"
    << "set title 'GPT " << f.layers << "x" << f.width << ", " << f.optimizer << " "
    << lowbit::state_format_name(f.state_format) << ", " << f.dtype << ", seed " << f.seed << "'\n"
    << "plot '" << f.out << ".csv' using 1:2 with lines title 'train', '' using 1:3 with linespoints pt 7 ps 0.5 title 'validation'\n";
  s.close();
  if (std::system(("gnuplot " + gp + " 2>/dev/null").c_str()) == 0 && !f.quiet) std::printf("plot: %s.png\n", f.out.c_str());
}

// The logged training losses of a CSV this program wrote (step -> loss).
std::map<int64_t, double> train_losses(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "--compare: cannot read ", path);
  std::map<int64_t, double> out;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string step, loss;
    std::getline(s, step, ',');
    std::getline(s, loss, ',');
    if (!loss.empty()) out[std::stoll(step)] = std::stod(loss);
  }
  return out;
}

// --compare: this run's curve against another's, step by step where both logged.
void compare_curves(const Flags& f) {
  const auto mine = train_losses(f.out + ".csv"), theirs = train_losses(f.compare);
  double worst = 0;
  size_t both = 0;
  for (const auto& [step, loss] : mine) {
    const auto t = theirs.find(step);
    if (t == theirs.end()) continue;
    worst = std::max(worst, std::fabs(loss - t->second));
    ++both;
  }
  TORCH_CHECK(both > 0, "--compare ", f.compare, ": no logged step in common with this run");
  const bool same = worst <= f.tolerance;
  std::printf("max |loss difference| against %s over %zu logged steps: %.3e (tolerance %.1e): %s\n", f.compare.c_str(),
              both, worst, f.tolerance, same ? "same curve within float noise" : "DIFFERENT");
  TORCH_CHECK(same, "--compare: the loss curves differ by ", worst, ", more than --tolerance ", f.tolerance);
}

}  // namespace

double evaluate(GPT& model, const Flags& f, const Corpus& c, at::Device dev) {
  torch::NoGradGuard ng;
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(dev));
  for (int64_t i = 0; i < f.eval_batches; ++i) {
    const auto xy = val_batch(c, f.batch, f.context, i, f.eval_batches, dev);
    sum += model->loss(xy.first, xy.second);
  }
  return sum.item<double>() / static_cast<double>(f.eval_batches);
}

at::Device device_of(const Flags& f) {
  const at::Device dev(f.device);
  if (f.threads > 0) at::set_num_threads(f.threads);
  if (dev.is_cuda()) {
    TORCH_CHECK(torch::cuda::is_available(), "--device ", f.device, ": libtorch sees no CUDA device here");
    TORCH_CHECK(!dev.has_index() || dev.index() < static_cast<int>(torch::cuda::device_count()), "--device ", f.device,
                ": there are ", torch::cuda::device_count(), " CUDA devices");
    at::globalContext().setAllowTF32CuBLAS(f.tf32);
    // Bit-identical CUDA runs (and so resumes): deterministic kernels, an error where an op has
    // none. Not warn-only: under it the attention backward keeps its atomics (flash attention's
    // deterministic mode is taken only when ATen would raise, and cuDNN's attention backward has
    // none; seen as loss curves differing between runs). cuBLAS wants a fixed workspace, set here
    // before its first handle unless the environment sets one.
    if (f.deterministic) {
      setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
      at::globalContext().setSDPUseCuDNN(false);
      at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
    }
  }
  return dev;
}

double lr_at(const Flags& f, int64_t s) {
  if (s < f.warmup) return f.lr * static_cast<double>(s + 1) / static_cast<double>(f.warmup);
  const double span = static_cast<double>(std::max<int64_t>(1, f.steps - f.warmup));
  const double t = std::min(1.0, static_cast<double>(s - f.warmup) / span);
  const double lo = f.lr * f.min_lr_ratio;
  return lo + 0.5 * (f.lr - lo) * (1.0 + std::cos(M_PI * t));
}

RunResult train(const Flags& f, const Corpus& c, bool record_losses) {
  RunResult r;
  // Before the run, not after it: the curve to compare with must be there.
  TORCH_CHECK(f.compare.empty() || job(f).rank != 0 || std::ifstream(f.compare).good(), "--compare: cannot read ",
              f.compare);
  const at::Device dev = device_of(f);
  const auto t_setup = Clock::now();
  torch::manual_seed(f.seed);
  ModelConfig mc;
  mc.vocab = f.vocab, mc.context = f.context, mc.layers = f.layers, mc.width = f.width, mc.heads = f.heads;
  mc.dtype = f.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  mc.device = dev, mc.checkpoint_activations = f.checkpoint_activations;
  mc.keyed_init = f.init == "keyed", mc.seed = f.seed;
  if (f.fully_sharded) {
    // Built on the host and sharded onto the GPUs: a model larger than one GPU never has to fit on
    // one. Rank 0 initializes it and broadcasts its values (the others' pages stay untouched), or,
    // keyed, no rank does and each fills its own shards (parallel.cpp).
    mc.device = at::kCPU;
    mc.initialize = job(f).rank == 0 && !mc.keyed_init;
    if (dev.is_cuda()) mc.init_device = dev;
  }
  TORCH_CHECK(c.bpe.vocab() <= f.vocab, "the tokenizer has ", c.bpe.vocab(), " tokens, more than --vocab ", f.vocab);
  GPT model(mc);
  const std::vector<at::Tensor> params = model->parameters();
  std::unique_ptr<TrainOptimizer> opt = make_optimizer(f, params, model.get());
  int64_t start = 0;
  synchronize(dev);  // the initialization's kernels are part of the set-up
  const double setup_s = seconds_since(t_setup);
  if (!f.resume.empty()) start = load_checkpoint(f.resume, f, c, model, *opt, dev);
  TORCH_CHECK(start < f.steps, "--resume ", f.resume, ": the checkpoint is at step ", start, ", nothing left of --steps ", f.steps);
  const int64_t end = f.stop_after ? f.stop_after : f.steps;
  if (!f.quiet) {
    std::printf("GPT %lld layers x %lld wide, %lld heads, context %lld, vocab %lld: %lld parameters (%s, %s%s)\n",
                (long long)f.layers, (long long)f.width, (long long)f.heads, (long long)f.context, (long long)f.vocab,
                (long long)count_params(mc), f.dtype.c_str(), dev.str().c_str(),
                f.checkpoint_activations ? ", activation checkpointing" : "");
    std::printf("optimizer: %s; lr %g, warm-up %lld, cosine to %g x lr at step %lld, weight decay %g, clip %g\n",
                opt->describe().c_str(), f.lr, (long long)f.warmup, f.min_lr_ratio, (long long)f.steps, f.weight_decay, f.clip);
    std::printf("data: %lld training tokens (%lld bytes), %lld validation tokens (%lld bytes); batch %lld x %lld tokens\n",
                (long long)c.train.numel(), (long long)c.train_bytes, (long long)c.val.numel(), (long long)c.val_bytes,
                (long long)f.batch, (long long)f.context);
    std::printf("set-up: model built and initialized (--init %s), optimizer made%s: %.1f s\n", f.init.c_str(),
                opt->fully_sharded() ? ", parameters sharded" : "", setup_s);
    if (start) std::printf("resumed from %s at step %lld\n", f.resume.c_str(), (long long)start);
  }

  // ---- CSV: a fresh run writes the header, a resumed one appends
  std::ofstream csv(f.out + ".csv", start ? std::ios::app : std::ios::trunc);
  TORCH_CHECK(csv.good(), "--out ", f.out, ": cannot write ", f.out, ".csv");
  if (!start) csv << "step,train_loss,val_loss,tokens_per_s,lr\n";
  csv.precision(6);
  if (!start) {
    r.first_val = evaluate(model, f, c, dev);
    csv << 0 << ",," << r.first_val << ",," << lr_at(f, 0) << "\n";
    if (!f.quiet) std::printf("step %6d  val %.4f\n", 0, r.first_val);
  }

  reset_peak(dev);
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(dev));
  int64_t in_interval = 0;
  auto t_interval = Clock::now();
  const auto t_run = Clock::now();
  for (int64_t step = start + 1; step <= end; ++step) {
    const double lr = lr_at(f, step - 1);
    opt->set_lr(lr);
    auto xy = train_batch(c, f.batch, f.context, f.seed, step, dev);
    if (f.sharded) {  // this rank's slice of the global batch; the sharded step averages the gradients
      const int64_t b = f.batch / job(f).size;
      xy = {xy.first.narrow(0, job(f).rank * b, b), xy.second.narrow(0, job(f).rank * b, b)};
    }
    const bool timed = step == f.timeline;
    if (timed) timeline_start(f);
    opt->zero_grad();
    at::Tensor loss = model->loss(xy.first, xy.second);
    if (timed) timeline_mark(f, "forward");
    loss.backward();
    if (timed) timeline_mark(f, "backward");
    opt->step();
    if (timed) {
      timeline_mark(f, "step");
      timeline_print(f);
    }
    loss_sum += loss.detach();
    ++in_interval;
    if (record_losses) r.losses.push_back(loss.item<double>());
    const bool eval_now = step % f.eval_every == 0 || step == f.steps;
    if (step % f.log_every == 0 || eval_now || step == end) {
      job(f).average(loss_sum);  // the global batch's loss (every rank logs at the same steps)
      const double train_loss = loss_sum.item<double>() / static_cast<double>(in_interval);  // waits for the device
      const double secs = seconds_since(t_interval);
      const double tok_s = static_cast<double>(in_interval * f.batch * f.context) / secs;
      const DeviceMemory m = device_memory(dev);
      const int64_t peak = m.available ? m.peak_allocated : host_peak_rss();
      double val = NAN;
      if (eval_now) val = r.final_val = evaluate(model, f, c, dev);
      csv << step << "," << train_loss << ",";
      if (eval_now) csv << val;
      csv << "," << tok_s << "," << lr << "\n";
      csv.flush();
      TORCH_CHECK(std::isfinite(train_loss), "step ", step, ": the training loss is ", train_loss);
      if (!f.quiet) {
        std::printf("step %6lld/%lld  loss %.4f  lr %.2e  %8.0f tok/s  %7.1f ms/step  peak %s%s", (long long)step,
                    (long long)f.steps, train_loss, lr, tok_s, 1e3 * secs / in_interval, gib(peak).c_str(),
                    m.available ? "" : " (host)");
        if (eval_now) std::printf("  val %.4f", val);
        std::printf("\n");
        const std::string split = opt->interval_report();
        if (!split.empty()) std::printf("%s\n", split.c_str());
        std::fflush(stdout);
      }
      loss_sum.zero_();
      in_interval = 0;
      t_interval = Clock::now();
    }
    r.last_step = step;
  }
  r.seconds = seconds_since(t_run);
  csv.close();
  if (!f.save.empty()) save_checkpoint(f.save, f, c, model, *opt, r.last_step, dev);
  if (!f.save_moments.empty()) opt->save_moments(f.save_moments, params, r.last_step);
  // The digest copies every parameter to the host (rank 0 gathers a fully sharded model whole):
  // minutes at tens of billions of parameters, so --no-digest skips it.
  if (f.digest) r.digest = digest_of(opt->whole_parameters(params));
  if (!f.quiet) {
    const std::string report = opt->memory_report();
    if (!report.empty()) std::printf("optimizer memory report:\n%s", report.c_str());
    std::printf("%s\n", memory_breakdown(dev, opt->weight_bytes(params), opt->gradient_bytes(params), opt->state_bytes()).c_str());
    if (const int64_t host = opt->host_bytes()) {
      int64_t n = 0;
      for (const at::Tensor& p : params) n += p.numel();
      std::printf("host memory of the offloaded optimizer: %s (%.3f B/param); host peak resident set %s\n",
                  gib(host).c_str(), double(host) / double(std::max<int64_t>(1, n)), gib(host_peak_rss()).c_str());
    }
    if (f.digest)
      std::printf("steps %lld..%lld in %.1f s; parameter digest %016llx\n", (long long)start + 1, (long long)r.last_step,
                  r.seconds, (unsigned long long)r.digest);
    else
      std::printf("steps %lld..%lld in %.1f s (--no-digest)\n", (long long)start + 1, (long long)r.last_step, r.seconds);
    if (const int64_t replays = opt->step_graph_replays())
      std::printf("optimizer steps replayed from a recorded CUDA graph: %lld\n", static_cast<long long>(replays));
    if (r.last_step == f.steps) std::printf("final validation loss %.4f\n", r.final_val);
    if (f.sample > 0 && !opt->fully_sharded()) std::printf("sample: %s\n", sample(model, f, c, dev).c_str());
    if (r.last_step == f.steps) plot(f);
  }
  if (f.qat_steps && r.last_step == f.steps) run_qat_study(f, c, model, r.final_val, dev);
  if (!f.compare.empty() && job(f).rank == 0) compare_curves(f);
  return r;
}

}  // namespace gpt
