// gpt: a GPT-2-style decoder trained on real English text (Debian's fortunes by default) with any
// lowbit optimizer and state format, or ATen's fused AdamW; the checks CTest runs
// (--check-decreases, --check-resume, --check-recompute); and --probe-max-size, the largest model that trains.
// Flags: `gpt --help`; README.md in this folder.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <stdexcept>

#include "data.h"
#include "flags.h"
#include "probe.h"
#include "parallel.h"
#include "train.h"

namespace {

// N steps straight == N/2 steps, --save, a fresh model and optimizer, --resume, N/2 steps: the
// parameters and every training loss bit for bit.
int check_resume(const gpt::Flags& f, const gpt::Corpus& c) {
  gpt::Flags straight = f, first = f, second = f;
  straight.out = f.out + "_straight";
  first.out = second.out = f.out + "_resumed";
  first.stop_after = f.steps / 2;
  // One checkpoint folder for the job: every rank's files in it (f.out carries ".rankR" past rank 0).
  const std::string job_out = f.sharded && gpt::job(f).rank != 0 ? f.out.substr(0, f.out.rfind(".rank")) : f.out;
  first.save = second.resume = job_out + "_checkpoint";
  std::printf("== %lld steps straight\n", (long long)f.steps);
  const gpt::RunResult a = gpt::train(straight, c, true);
  std::printf("== %lld steps, --save %s\n", (long long)first.stop_after, first.save.c_str());
  const gpt::RunResult b1 = gpt::train(first, c, true);
  std::printf("== --resume %s, steps %lld..%lld\n", second.resume.c_str(), (long long)first.stop_after + 1, (long long)f.steps);
  const gpt::RunResult b2 = gpt::train(second, c, true);
  std::vector<double> resumed = b1.losses;
  resumed.insert(resumed.end(), b2.losses.begin(), b2.losses.end());
  size_t same = 0;
  while (same < a.losses.size() && same < resumed.size() && a.losses[same] == resumed[same]) ++same;
  const bool ok = a.digest == b2.digest && same == a.losses.size() && resumed.size() == a.losses.size();
  std::printf("resume check: parameter digests %016llx vs %016llx, training losses equal for %zu of %zu steps: %s\n",
              (unsigned long long)a.digest, (unsigned long long)b2.digest, same, a.losses.size(),
              ok ? "bit for bit" : "DIFFERENT");
  return ok ? 0 : 1;
}

// Two runs that must end in the same bits: the same training losses and parameter digest.
int check_same_bits(const char* check, const char* a_name, const char* b_name, const gpt::Flags& fa,
                    const gpt::Flags& fb, const gpt::Corpus& c) {
  const gpt::RunResult a = gpt::train(fa, c, true), b = gpt::train(fb, c, true);
  const bool ok = a.digest == b.digest && a.losses == b.losses;
  std::printf("%s check: parameter digests %016llx (%s) vs %016llx (%s): %s\n", check, (unsigned long long)a.digest,
              a_name, (unsigned long long)b.digest, b_name, ok ? "bit for bit" : "DIFFERENT");
  return ok ? 0 : 1;
}

// Activation checkpointing recomputes exactly what the forward computed: the same losses and
// parameters, bit for bit, with and without it.
int check_recompute(const gpt::Flags& f, const gpt::Corpus& c) {
  gpt::Flags plain = f, recompute = f;
  plain.checkpoint_activations = false, recompute.checkpoint_activations = true;
  plain.out = f.out + "_plain", recompute.out = f.out + "_recompute";
  return check_same_bits("recompute", "stored activations", "checkpointed", plain, recompute, c);
}

// A front end that steps each parameter from its gradient's hook gives the bits opt.step() after
// backward() gives: the same losses and parameters with and without it (no clipping: both refuse it).
// Gradient release steps inside backward(); host offload steps on the CPU, the state in host memory.
int check_hook_step(const char* check, const char* name, bool gpt::Flags::*on, const gpt::Flags& f,
                    const gpt::Corpus& c) {
  gpt::Flags plain = f, hooked = f;
  plain.*on = false, hooked.*on = true;
  plain.clip = hooked.clip = 0;
  plain.out = f.out + "_plain", hooked.out = f.out + "_" + name;
  return check_same_bits(check, "step after backward", name, plain, hooked, c);
}

// The tiny CI run: validation loss well below its start, and the last training losses below the first.
int check_decreases(const gpt::Flags& f, const gpt::Corpus& c) {
  const gpt::RunResult r = gpt::train(f, c, true);
  const size_t k = std::min<size_t>(5, r.losses.size());
  double first = 0, last = 0;
  for (size_t i = 0; i < k; ++i) first += r.losses[i] / k, last += r.losses[r.losses.size() - 1 - i] / k;
  const bool ok = r.final_val < 0.8 * r.first_val && last < first;
  std::printf("decrease check: validation loss %.4f -> %.4f, training loss (mean of %zu steps) %.4f -> %.4f, %.1f s: %s\n",
              r.first_val, r.final_val, k, first, last, r.seconds, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  gpt::Flags f;
  try {
    f = gpt::parse_flags(argc, argv);
  } catch (const std::invalid_argument& e) {
    if (std::string(e.what()) == "help") {
      std::printf("%s", gpt::usage().c_str());
      return 0;
    }
    std::fprintf(stderr, "gpt: %s\n%s", e.what(), gpt::usage().c_str());
    return 2;
  }
  try {
    if (f.sharded) {  // rank 0 reports; every rank trains on its slice of each batch, on its own GPU
      const gpt::Job& j = gpt::job(f);
      if (f.batch % j.size != 0)
        throw std::invalid_argument("--batch " + std::to_string(f.batch) + " (the global batch) is not a multiple of the " +
                                    std::to_string(j.size) + " ranks");
      if (j.rank != 0) {
        f.quiet = true;
        f.out += ".rank" + std::to_string(j.rank);
      }
      if (f.device == "cuda") f.device = "cuda:" + std::to_string(j.local_rank);
    }
    if (f.probe) return gpt::run_probe(f);
    const std::string data = f.data.empty() ? gpt::kDefaultData : f.data;
    const auto t0 = std::chrono::steady_clock::now();
    const gpt::Corpus c = gpt::load_corpus(data, f.data_limit, f.vocab, f.val_every);
    if (!f.quiet)
      std::printf("corpus %s: %lld + %lld bytes, tokenizer %s (%lld tokens) in %.1f s\n", data.c_str(),
                  (long long)c.train_bytes, (long long)c.val_bytes, c.bpe.vocab() > 256 ? "BPE" : "bytes",
                  (long long)c.bpe.vocab(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (f.check_resume) return check_resume(f, c);
    if (f.check_decreases) return check_decreases(f, c);
    if (f.check_recompute) return check_recompute(f, c);
    if (f.check_release) return check_hook_step("release", "released", &gpt::Flags::gradient_release, f, c);
    if (f.check_offload) return check_hook_step("offload", "offloaded", &gpt::Flags::offload, f, c);
    gpt::train(f, c);
  } catch (const c10::Error& e) {
    gpt::end_job_on_error(f, e.what_without_backtrace());
    std::fprintf(stderr, "gpt: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    gpt::end_job_on_error(f, e.what());
    std::fprintf(stderr, "gpt: %s\n", e.what());
    return 1;
  }
  return 0;
}
