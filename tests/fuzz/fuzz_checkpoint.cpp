// lowbit_fuzz_checkpoint --cases N --seed S: a deterministic mutation fuzzer of optimizer
// checkpoints. From real checkpoints of every optimizer x state format it makes damaged files
// (bit flips, truncations, edited entries, damaged zip size fields), loads each into a live
// optimizer (load_checkpoint) and into `lowbit inspect`, and counts per mutation kind how each case ended. Allowed: a c10::Error with the optimizer's state and parameters bit-identical, or a
// load that then steps exactly like the original checkpoint. Anything else fails the run.
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <unistd.h>

#include <lowbit/lowbit.h>
#include <lowbit/tools/inspect.h>

#include "../checkpoint_edit.h"

namespace lo = lowbit::optim;
using lowbit::StateFormat;

namespace {

// ---------------------------------------------------------------------------------------------
// The originals: every optimizer x state format, two steps taken
// ---------------------------------------------------------------------------------------------

using Make = std::function<std::unique_ptr<lo::LowbitOptimizer>(std::vector<at::Tensor>, StateFormat)>;

std::vector<std::pair<std::string, Make>> optimizers() {
  return {
      {"Adam", [](auto p, auto f) { return std::make_unique<lo::Adam>(p, lo::AdamOptions().state_format(f)); }},
      {"AdamW", [](auto p, auto f) { return std::make_unique<lo::AdamW>(p, lo::AdamWOptions().state_format(f)); }},
      {"SGD", [](auto p, auto f) { return std::make_unique<lo::SGD>(p, lo::SGDOptions(0.1).momentum(0.9).state_format(f)); }},
      {"Lion", [](auto p, auto f) { return std::make_unique<lo::Lion>(p, lo::LionOptions().state_format(f)); }},
      {"RMSprop", [](auto p, auto f) {
         return std::make_unique<lo::RMSprop>(p, lo::RMSpropOptions().centered(true).momentum(0.5).state_format(f));
       }},
      {"Adagrad", [](auto p, auto f) { return std::make_unique<lo::Adagrad>(p, lo::AdagradOptions().state_format(f)); }},
      {"AdEMAMix", [](auto p, auto f) { return std::make_unique<lo::AdEMAMix>(p, lo::AdEMAMixOptions().state_format(f)); }},
      {"LAMB", [](auto p, auto f) { return std::make_unique<lo::LAMB>(p, lo::LAMBOptions().state_format(f)); }},
  };
}

struct Original {
  std::string name;
  Make make;
  StateFormat format;
  std::vector<at::Tensor> params;  // as saved
  std::vector<at::Tensor> grads;   // the next step's gradients
  std::string file;                // the checkpoint's bytes
  lowbit_test::Entries entries;
  std::map<std::string, std::pair<size_t, size_t>> spans;  // zip records
};

std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.clone());
  return out;
}

void step(lo::LowbitOptimizer& opt, std::vector<at::Tensor>& p, const std::vector<at::Tensor>& g) {
  for (size_t i = 0; i < p.size(); ++i) p[i].mutable_grad() = g[i].clone();
  opt.step();
}

std::vector<Original> make_originals(const std::string& tmp) {
  std::vector<Original> out;
  for (const auto& [name, make] : optimizers()) {
    for (StateFormat f : lowbit::kAllStateFormats) {
      at::manual_seed(out.size());
      Original o{name, make, f, {at::randn({4608}), at::randn({70})}, {}, {}, {}, {}};
      auto opt = make(o.params, f);
      for (int s = 0; s < 2; ++s) step(*opt, o.params, {at::randn({4608}) * 0.1, at::randn({70}) * 0.1});
      o.grads = {at::randn({4608}) * 0.1, at::randn({70}) * 0.1};
      torch::save(*opt, tmp);
      o.file = lowbit_test::read_file(tmp);
      o.entries = lowbit_test::read_entries(tmp);
      o.spans = lowbit_test::record_spans(tmp);
      out.push_back(std::move(o));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------------------------

const char* const kKinds[] = {"bitflip_data", "bitflip_pickle", "bitflip_zip", "truncate", "zip_size_field",
                              "swap_tensors", "missing_entry", "wrong_dtype", "wrong_shape", "wrong_block_size",
                              "wrong_format_id", "wrong_version", "absurd_sizes"};
constexpr int kNumKinds = sizeof(kKinds) / sizeof(kKinds[0]);

using Rng = std::mt19937_64;
int64_t pick(Rng& r, int64_t n) { return static_cast<int64_t>(r() % static_cast<uint64_t>(n)); }

template <typename Pred>
std::string pick_key(Rng& r, const lowbit_test::Entries& e, Pred pred) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : e)
    if (pred(k, v)) keys.push_back(k);
  return keys.empty() ? std::string() : keys[pick(r, keys.size())];
}

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

std::string write(const lowbit_test::Entries& e) {
  const std::string tmp = std::filesystem::temp_directory_path() / ("lowbit_fuzz_edit_" + std::to_string(getpid()));
  lowbit_test::write_entries(e, tmp);
  std::string f = lowbit_test::read_file(tmp);
  std::filesystem::remove(tmp);
  return f;
}

// A damaged file's bytes for mutation `kind` of `o`; `note` says what an entry edit changed.
std::string mutate(const Original& o, int kind, Rng& r, std::string* note) {
  std::string f = o.file;
  const std::string k = kKinds[kind];
  auto flip_in = [&](size_t from, size_t n) {
    if (n == 0) return;
    const size_t at = from + pick(r, n);
    f[at] = static_cast<char>(f[at] ^ (1 << pick(r, 8)));
  };
  if (k == "bitflip_data" || k == "bitflip_pickle") {
    std::vector<std::pair<size_t, size_t>> spans;
    for (const auto& [name, s] : o.spans)
      if ((name.rfind("data/", 0) == 0) == (k == "bitflip_data")) spans.push_back(s);
    const auto s = spans[pick(r, spans.size())];
    flip_in(s.first, s.second);
    return f;
  }
  if (k == "bitflip_zip") {  // a bit outside every record: local headers, central directory
    std::vector<bool> in_record(f.size(), false);
    for (const auto& [name, s] : o.spans)
      for (size_t i = s.first; i < s.first + s.second && i < f.size(); ++i) in_record[i] = true;
    std::vector<size_t> outside;
    for (size_t i = 0; i < f.size(); ++i)
      if (!in_record[i]) outside.push_back(i);
    const size_t at = outside[pick(r, outside.size())];
    f[at] = static_cast<char>(f[at] ^ (1 << pick(r, 8)));
    return f;
  }
  if (k == "truncate") {  // at a record's start or end (every section), or anywhere
    std::vector<size_t> cuts = {0};
    for (const auto& [name, s] : o.spans) {
      cuts.push_back(s.first);
      cuts.push_back(s.first + s.second);
    }
    size_t cut = pick(r, 2) ? cuts[pick(r, cuts.size())] : pick(r, f.size());
    cut = std::min(cut + pick(r, 3), f.size() - 1);
    return f.substr(0, cut);
  }
  if (k == "zip_size_field") {  // a central directory entry's uncompressed (24) or compressed (20) size
    std::vector<size_t> dirs;
    for (size_t i = 0; i + 46 < f.size(); ++i)
      if (std::memcmp(f.data() + i, "PK\x01\x02", 4) == 0) dirs.push_back(i);
    const size_t d = dirs[pick(r, dirs.size())] + (pick(r, 2) ? 24 : 20);
    const uint32_t values[] = {0xFFFFFFFFu, 0xFFFFFFFEu, 0x7FFFFFFFu, 0x80000000u, 0u, 1u,
                               static_cast<uint32_t>(r())};
    const uint32_t v = values[pick(r, 7)];
    std::memcpy(&f[d], &v, 4);
    return f;
  }
  // Entry edits: the archive re-written, digests recomputed so that the loader's own checks are reached.
  lowbit_test::Entries e = o.entries;
  auto is_tensor = [](const std::string&, const c10::IValue& v) { return v.isTensor(); };
  if (k == "swap_tensors") {
    // Each tensor moves with its digest (a writer that mixed up names): only the header is re-signed.
    const std::string a = pick_key(r, e, is_tensor), b = pick_key(r, e, is_tensor);
    std::swap(e[a], e[b]);
    std::swap(e[a + "/digest"], e[b + "/digest"]);
    *note = a + " <-> " + b;
    lowbit_test::resign(e, true);
    return write(e);
  } else if (k == "missing_entry") {
    *note = pick_key(r, e, [](const std::string& key, const c10::IValue&) { return !ends_with(key, "digest"); });
    e.erase(*note);
  } else if (k == "wrong_dtype") {
    const std::string key = pick_key(r, e, is_tensor);
    const at::ScalarType types[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kByte, at::kChar, at::kDouble, at::kLong, at::kBool};
    const at::ScalarType to = types[pick(r, 8)];
    e[key] = c10::IValue(e[key].toTensor().to(to));
    *note = key + " -> " + c10::toString(to);
  } else if (k == "wrong_shape") {
    const std::string key = pick_key(r, e, is_tensor);
    at::Tensor t = e[key].toTensor();
    switch (pick(r, 4)) {
      case 0: t = t.narrow(0, 0, pick(r, t.numel() + 1)).clone(); break;       // fewer elements
      case 1: t = at::cat({t, t.narrow(0, 0, 1 + pick(r, t.numel()))}); break;  // more
      case 2: t = t.numel() % 2 == 0 ? t.reshape({2, -1}) : t.reshape({1, -1}); break;  // 2-D, same numel
      default: t = t.narrow(0, 0, 0).clone(); break;                           // empty
    }
    *note = key + " -> " + std::to_string(t.numel()) + " elements, " + std::to_string(t.dim()) + "-D";
    e[key] = c10::IValue(t);
  } else if (k == "wrong_block_size") {
    const std::string key = pick_key(r, e, [](const std::string& s, const c10::IValue&) { return ends_with(s, "/block_size"); });
    const int64_t values[] = {0, -1, 1, 3, 32, 63, 64, 96, 128, 256, 512, 1024, 2048, 4096, 1 << 20, int64_t(1) << 40,
                              INT64_MAX, INT64_MIN};
    if (!key.empty()) e[key] = c10::IValue(values[pick(r, 18)]);
    if (!key.empty()) *note = key + " -> " + std::to_string(e[key].toInt());
  } else if (k == "wrong_format_id") {
    const std::string key = pick_key(r, e, [](const std::string& s, const c10::IValue&) {
      return ends_with(s, "/format") || ends_with(s, "/storage") || ends_with(s, "/qformat");
    });
    if (!key.empty()) e[key] = c10::IValue(pick(r, 16) - 3);
    if (!key.empty()) *note = key + " -> " + std::to_string(e[key].toInt());
  } else if (k == "wrong_version") {
    const int64_t values[] = {0, 1, 3, -1, 1000, INT64_MAX};
    e["lowbit/version"] = c10::IValue(values[pick(r, 6)]);
    if (pick(r, 2)) e["lowbit/magic"] = c10::IValue(int64_t(0x6C6F7762697400 + pick(r, 3)));
  } else if (k == "absurd_sizes") {
    // Counts and sizes beyond any real one (the seed is any 64-bit value, not a size).
    const std::string key = pick_key(r, e, [](const std::string& s, const c10::IValue& v) {
      return v.isInt() && !ends_with(s, "digest") && s != "lowbit/magic" && s != "lowbit/seed";
    });
    const int64_t values[] = {-1, INT64_MIN, INT64_MAX, int64_t(1) << 41, int64_t(1) << 62, int64_t(1) << 50};
    e[key] = c10::IValue(values[pick(r, 6)]);
    *note = key + " -> " + std::to_string(e[key].toInt());
  }
  lowbit_test::resign(e);
  return write(e);
}

// ---------------------------------------------------------------------------------------------
// One case
// ---------------------------------------------------------------------------------------------

// Every bit an optimizer holds for its parameters: the parameters, each slot's tensors, counters, lr.
std::vector<at::Tensor> snapshot(const lo::LowbitOptimizer& opt, const std::vector<at::Tensor>& p) {
  std::vector<at::Tensor> s;
  for (const auto& t : p) {
    s.push_back(t.clone());
    const lo::ParamState* st = opt.state_of(t);
    if (!st) continue;
    s.push_back(st->counters.clone());
    s.push_back(at::tensor({static_cast<int64_t>(st->format), st->block_size}));
    for (const auto& slot : st->slots) {
      if (slot.dense.defined()) s.push_back(slot.dense.clone());
      if (slot.quantized.defined()) {
        s.push_back(slot.quantized.codes().clone());
        s.push_back(slot.quantized.absmax().clone());
      }
    }
  }
  s.push_back(at::tensor({opt.param_groups()[0].options().get_lr()}, at::kDouble));
  s.push_back(at::tensor({opt.skipped_steps(), opt.state_bytes()}));
  return s;
}

bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type()) return false;
    const at::Tensor x = a[i].contiguous(), y = b[i].contiguous();
    if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return true;
}

struct Counts {
  int64_t cases = 0, refused = 0, loaded_ok = 0, crashes = 0, hangs = 0, silent = 0;
};

constexpr double kHangSeconds = 10.0;

enum class Outcome { Refused, LoadedOk, Bad };

// One loader on a live optimizer that holds the original's trained state: refused with the state
// bit-identical, or loaded and then stepping exactly like the original; anything else is Bad (and
// counted, with `why`). `load` may throw c10::Error only.
Outcome try_load(const Original& o, const std::string& path, const char* via,
                 const std::function<void(lo::LowbitOptimizer&)>& load, Counts& c, std::string* why) {
  std::vector<at::Tensor> p = clone_all(o.params);
  auto live = o.make(p, o.format);
  lo::load_checkpoint(*live, path + ".orig");
  const auto before = snapshot(*live, p);
  try {
    load(*live);
  } catch (const c10::Error&) {
    if (same_bits(before, snapshot(*live, p))) return Outcome::Refused;
    ++c.silent;
    *why = std::string(via) + ": refused, but the optimizer's state or parameters changed";
    return Outcome::Bad;
  } catch (const std::exception& e) {
    ++c.crashes;
    *why = std::string(via) + ": not a c10::Error: " + e.what();
    return Outcome::Bad;
  }
  // Loaded: it must step exactly like the original checkpoint.
  std::vector<at::Tensor> q = clone_all(o.params);
  auto ref = o.make(q, o.format);
  lo::load_checkpoint(*ref, path + ".orig");
  try {
    step(*live, p, o.grads);
  } catch (const c10::Error& e) {
    ++c.silent;
    *why = std::string(via) + ": loaded, then the step failed: " + e.what_without_backtrace();
    return Outcome::Bad;
  }
  step(*ref, q, o.grads);
  if (!same_bits(snapshot(*live, p), snapshot(*ref, q))) {
    ++c.silent;
    *why = std::string(via) + ": loaded, but steps differently from the original";
    return Outcome::Bad;
  }
  return Outcome::LoadedOk;
}

// Returns false (and says why) if the case ended in anything but a clean refusal or an exact load
// (load_checkpoint), or in anything but an error or a listing (`lowbit inspect`).
bool run_case(const Original& o, const std::string& path, Counts& c, std::string* why) {
  ++c.cases;
  lowbit_test::write_file(path + ".orig", o.file);
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome outcome =
      try_load(o, path, "load_checkpoint", [&](lo::LowbitOptimizer& opt) { lo::load_checkpoint(opt, path); }, c, why);
  bool bad = outcome == Outcome::Bad;
  try {
    std::ostringstream out;
    lowbit::tools::inspect_checkpoint(path, out);
  } catch (const c10::Error&) {
  } catch (const std::exception& e) {
    if (!bad) ++c.crashes;
    *why = std::string("inspect: not a c10::Error: ") + e.what();
    bad = true;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (secs > kHangSeconds) {
    ++c.hangs;
    *why = "took " + std::to_string(secs) + " s";
    return false;
  }
  if (bad) return false;
  ++(outcome == Outcome::Refused ? c.refused : c.loaded_ok);
  return true;
}

// ---------------------------------------------------------------------------------------------
// A crash names its case (so that --case K reproduces it): written from the signal handler with
// write(2) only, then the signal goes on as it would have.
// ---------------------------------------------------------------------------------------------

volatile int64_t g_case = -1;
volatile uint64_t g_seed = 0;

void write_number(char*& at, uint64_t v) {
  char digits[24];
  int n = 0;
  do digits[n++] = static_cast<char>('0' + v % 10); while ((v /= 10) != 0);
  while (n > 0) *at++ = digits[--n];
}

void on_crash(int sig) {
  char buf[160];
  char* at = buf;
  for (const char* s = "\nlowbit_fuzz_checkpoint: signal "; *s;) *at++ = *s++;
  write_number(at, static_cast<uint64_t>(sig));
  if (g_case < 0) {  // after the last case: at exit (a leak report aborts there)
    for (const char* s = " after the last case\n"; *s;) *at++ = *s++;
    ssize_t ignored = ::write(2, buf, static_cast<size_t>(at - buf));
    (void)ignored;
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  for (const char* s = " in case "; *s;) *at++ = *s++;
  write_number(at, static_cast<uint64_t>(g_case));
  for (const char* s = " (rerun: --seed "; *s;) *at++ = *s++;
  write_number(at, g_seed);
  for (const char* s = " --case "; *s;) *at++ = *s++;
  write_number(at, static_cast<uint64_t>(g_case));
  for (const char* s = ")\n"; *s;) *at++ = *s++;
  ssize_t ignored = ::write(2, buf, static_cast<size_t>(at - buf));
  (void)ignored;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

int usage() {
  std::cerr << "usage: lowbit_fuzz_checkpoint [--cases N] [--seed S] [--from K] [--case K] [--kind NAME]\n"
               "  --cases N  cases 0..N-1 (default 600)     --seed S  the run's seed (default 1)\n"
               "  --from K   skip cases below K             --case K  case K of seed S alone\n"
               "  --kind NAME  only this mutation kind, one of:";
  for (const char* k : kKinds) std::cerr << " " << k;
  std::cerr << "\n";
  return 2;
}

// A whole decimal number in [0, max]; anything else (empty, a sign, trailing characters, too
// large) is refused with a message naming the option and the value.
bool parse_number(const std::string& opt, const std::string& v, uint64_t max, uint64_t* out) {
  uint64_t x = 0;
  bool ok = !v.empty();
  for (const char ch : v) {
    if (ch < '0' || ch > '9' || x > (max - static_cast<uint64_t>(ch - '0')) / 10) ok = false;
    if (!ok) break;
    x = x * 10 + static_cast<uint64_t>(ch - '0');
  }
  if (!ok) {
    std::cerr << "lowbit_fuzz_checkpoint: " << opt << " must be a whole number in 0.." << max << ", got '" << v
              << "'\n";
    return false;
  }
  *out = x;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t cases = 600;
  uint64_t seed = 1;
  int only_kind = -1;
  int64_t first = 0;  // --from N: start at case N (each case is reproducible alone)
  const bool verbose = std::getenv("LOWBIT_FUZZ_VERBOSE") != nullptr;
  constexpr uint64_t kMaxCases = uint64_t(1) << 40;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return usage(), 0;
    const bool known = a == "--cases" || a == "--seed" || a == "--from" || a == "--case" || a == "--kind";
    if (!known) {
      std::cerr << "lowbit_fuzz_checkpoint: unknown option '" << a << "'\n";
      return usage();
    }
    if (i + 1 >= argc) {
      std::cerr << "lowbit_fuzz_checkpoint: " << a << " needs a value\n";
      return usage();
    }
    const std::string v = argv[++i];
    uint64_t x = 0;
    if (a == "--kind") {
      for (int k = 0; k < kNumKinds; ++k)
        if (v == kKinds[k]) only_kind = k;
      if (only_kind < 0) {
        std::cerr << "lowbit_fuzz_checkpoint: unknown --kind '" << v << "'\n";
        return usage();
      }
    } else if (!parse_number(a, v, a == "--seed" ? UINT64_MAX : kMaxCases, &x)) {
      return 2;
    } else if (a == "--cases") {
      cases = static_cast<int64_t>(x);
    } else if (a == "--seed") {
      seed = x;
    } else if (a == "--from") {
      first = static_cast<int64_t>(x);
    } else {  // --case K: case K alone (the run's random choices up to K are replayed, not loaded)
      first = static_cast<int64_t>(x);
      cases = first + 1;
    }
  }
  g_seed = seed;
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_crash);
  at::set_num_threads(1);
  // A folder of its own per run, and the same file name in every run: libtorch names the archive's
  // folder inside the zip after the file, so a name with the pid in it would move every record by
  // the pid's digits, and a flipped byte of the zip's structure (bitflip_zip) would land elsewhere
  // from run to run: the same seed would not give the same cases.
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("lowbit_fuzz_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "checkpoint.pt").string();
  const auto originals = make_originals(path);
  Rng rng(seed);
  std::vector<Counts> counts(kNumKinds);
  int64_t failures = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < cases; ++n) {
    const Original& o = originals[pick(rng, originals.size())];
    if (n < first) continue;
    const int kind = only_kind >= 0 ? only_kind : static_cast<int>(n % kNumKinds);
    g_case = n;
    Rng case_rng(seed * 0x9E3779B97F4A7C15ull + n);  // each case reproducible alone
    std::string note, why;
    lowbit_test::write_file(path, mutate(o, kind, case_rng, &note));
    if (verbose) std::fprintf(stderr, "case %lld %s %s %s %s\n", (long long)n, kKinds[kind], note.c_str(), o.name.c_str(),
                              lowbit::state_format_name(o.format));
    if (!run_case(o, path, counts[kind], &why)) {
      ++failures;
      std::printf("FAIL case %lld (%s %s, %s %s): %s\n", (long long)n, kKinds[kind], note.c_str(), o.name.c_str(),
                  lowbit::state_format_name(o.format), why.c_str());
    }
  }
  g_case = -1;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".orig");
  std::filesystem::remove(dir);
  std::printf("%-18s %8s %8s %9s %7s %5s %6s\n", "mutation", "cases", "refused", "loaded-ok", "crashes", "hangs",
              "silent");
  Counts total;
  const auto row = [](const char* name, const Counts& c) {
    std::printf("%-18s %8lld %8lld %9lld %7lld %5lld %6lld\n", name, (long long)c.cases, (long long)c.refused,
                (long long)c.loaded_ok, (long long)c.crashes, (long long)c.hangs, (long long)c.silent);
  };
  for (int k = 0; k < kNumKinds; ++k) {
    const Counts& c = counts[k];
    row(kKinds[k], c);
    total.cases += c.cases, total.refused += c.refused, total.loaded_ok += c.loaded_ok;
    total.crashes += c.crashes, total.hangs += c.hangs, total.silent += c.silent;
  }
  row("total", total);
  std::printf("seed %llu, %.1f s (%d originals: 8 optimizers x 6 state formats)\n", (unsigned long long)seed, secs,
              static_cast<int>(originals.size()));
  std::fflush(stdout);  // before exit's leak check, which aborts if it finds one
  return failures == 0 ? 0 : 1;
}
