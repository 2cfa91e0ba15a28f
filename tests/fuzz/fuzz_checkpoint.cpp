// lowbit_fuzz_checkpoint --cases N --seed S: a deterministic mutation fuzzer of optimizer
// checkpoints. From real checkpoints of every optimizer x state format it makes damaged files
// (bit flips, truncations, edited entries, damaged zip size fields, tensor records shorter than
// data.pkl claims in a re-sealed zip), loads each into a live optimizer (load_checkpoint) and
// into `lowbit inspect`; from the same optimizers' fragment files (sharded checkpoints, as one,
// two and three writers) damaged files and sets of files, loaded with load_fragments
// (fuzz_fragments.h). It counts per mutation kind how each case ended.
// Allowed: a c10::Error with the optimizer's state and parameters bit-identical, or a load that
// then steps exactly like the original checkpoint. Anything else fails the run.
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
#include "fuzz_common.h"
#ifdef LOWBIT_FUZZ_FRAGMENTS
#include "fuzz_fragments.h"
#endif

namespace lo = lowbit::optim;
using lowbit::StateFormat;
using namespace lowbit_fuzz;

namespace {

// ---------------------------------------------------------------------------------------------
// The originals: every optimizer x state format, two steps taken
// ---------------------------------------------------------------------------------------------

struct Original {
  std::string name;
  Make make;
  StateFormat format;
  std::vector<at::Tensor> params;  // as saved
  std::vector<at::Tensor> grads;   // the next step's gradients
  std::string file;                // the checkpoint's bytes
  lowbit_test::Entries entries;
  std::map<std::string, std::pair<size_t, size_t>> spans;  // zip records
#ifdef LOWBIT_FUZZ_FRAGMENTS
  FragmentOriginal fragments;  // the same state as fragment files
#endif
};

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
#ifdef LOWBIT_FUZZ_FRAGMENTS
      const std::string dir = std::filesystem::path(tmp).parent_path() / ("orig" + std::to_string(out.size()));
      o.fragments = make_fragment_original(*opt, o.params, dir);
#endif
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
                              "wrong_format_id", "wrong_version", "absurd_sizes", "short_record"};
constexpr int kNumCheckpointKinds = sizeof(kKinds) / sizeof(kKinds[0]);
#ifdef LOWBIT_FUZZ_FRAGMENTS
const int kNumKinds = kNumCheckpointKinds + kNumFragmentKinds;
#else
constexpr int kNumKinds = kNumCheckpointKinds;
#endif
// Checkpoint kinds first, then fragment kinds (fuzz_fragments.cpp).
const char* kind_name(int k) {
#ifdef LOWBIT_FUZZ_FRAGMENTS
  if (k >= kNumCheckpointKinds) return kFragmentKinds[k - kNumCheckpointKinds];
#endif
  return kKinds[k];
}

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
  const std::string k = kKinds[kind];
  if (is_byte_kind(k)) return mutate_bytes(o.file, o.spans, k, r);
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
  } catch (const c10::Error& e) {
    last_refusal() = e.what_without_backtrace();
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

#ifdef LOWBIT_FUZZ_FRAGMENTS
// A fragment case: the damaged set of files written under `dir` (emptied first), loaded by
// load_fragments into a live optimizer.
bool run_fragment_case(const Original& o, int kind, Rng& r, const std::filesystem::path& dir, Counts& c,
                       std::string* note, std::string* why) {
  remove_tree(dir.string());
  std::filesystem::create_directories(dir);
  const std::string prefix = (dir / "frag").string();
  for (const auto& [name, bytes] : mutate_fragments(o.fragments, kind, r, (dir / "edit.tmp").string(), note))
    lowbit_test::write_file(prefix + "." + name, bytes);
  ++c.cases;
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome outcome = try_load_fragments(o.make, o.format, o.params, o.grads, o.fragments, prefix, c, why);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (secs > kHangSeconds) {
    ++c.hangs;
    *why = "took " + std::to_string(secs) + " s";
    return false;
  }
  if (outcome == Outcome::Bad) return false;
  ++(outcome == Outcome::Refused ? c.refused : c.loaded_ok);
  return true;
}
#endif

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
  for (int k = 0; k < kNumKinds; ++k) std::cerr << " " << kind_name(k);
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
        if (v == kind_name(k)) only_kind = k;
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
    bool ok = true;
    const int64_t loaded_before = counts[kind].loaded_ok;
    if (kind < kNumCheckpointKinds) {
      lowbit_test::write_file(path, mutate(o, kind, case_rng, &note));
      if (verbose) std::fprintf(stderr, "case %lld %s %s %s %s\n", (long long)n, kind_name(kind), note.c_str(),
                                o.name.c_str(), lowbit::state_format_name(o.format));
      ok = run_case(o, path, counts[kind], &why);
    } else {
#ifdef LOWBIT_FUZZ_FRAGMENTS
      ok = run_fragment_case(o, kind - kNumCheckpointKinds, case_rng, dir / "set", counts[kind], &note, &why);
      if (verbose) std::fprintf(stderr, "case %lld %s %s %s %s\n", (long long)n, kind_name(kind), note.c_str(),
                                o.name.c_str(), lowbit::state_format_name(o.format));
#endif
    }
    if (verbose && ok)
      std::fprintf(stderr, "  -> %s\n", counts[kind].loaded_ok > loaded_before ? "loaded"
                                                                              : ("refused: " + last_refusal()).c_str());
    if (!ok) {
      ++failures;
      std::printf("FAIL case %lld (%s %s, %s %s): %s\n", (long long)n, kind_name(kind), note.c_str(), o.name.c_str(),
                  lowbit::state_format_name(o.format), why.c_str());
    }
  }
  g_case = -1;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  remove_tree(dir.string());
  std::printf("%-22s %8s %8s %9s %7s %5s %6s\n", "mutation", "cases", "refused", "loaded-ok", "crashes", "hangs",
              "silent");
  Counts total;
  const auto row = [](const char* name, const Counts& c) {
    std::printf("%-22s %8lld %8lld %9lld %7lld %5lld %6lld\n", name, (long long)c.cases, (long long)c.refused,
                (long long)c.loaded_ok, (long long)c.crashes, (long long)c.hangs, (long long)c.silent);
  };
  for (int k = 0; k < kNumKinds; ++k) {
    const Counts& c = counts[k];
    row(kind_name(k), c);
    total.cases += c.cases, total.refused += c.refused, total.loaded_ok += c.loaded_ok;
    total.crashes += c.crashes, total.hangs += c.hangs, total.silent += c.silent;
  }
  row("total", total);
  std::printf("seed %llu, %.1f s (%d originals: 8 optimizers x 6 state formats, each as a checkpoint%s)\n",
              (unsigned long long)seed, secs, static_cast<int>(originals.size()),
              kNumKinds > kNumCheckpointKinds ? " and as 1, 2 and 3 writers' fragment files" : "");
  std::fflush(stdout);  // before exit's leak check, which aborts if it finds one
  return failures == 0 ? 0 : 1;
}
