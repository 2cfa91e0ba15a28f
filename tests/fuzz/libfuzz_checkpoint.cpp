// lowbit_libfuzz_checkpoint: a libFuzzer harness (clang; scripts/libfuzz builds and runs it) of
// what reads optimizer checkpoints. An input is one byte that picks the target, then a file's
// bytes. Bit 0 of the target byte: clear, the file as a single-process checkpoint, loaded with
// load_checkpoint into a live optimizer (optimizer x state format = byte / 4 mod 48) and listed by
// `lowbit inspect`; set, the file as the one writer's fragment file of a sharded checkpoint,
// loaded with load_fragments. Bit 1 set: the rest is not a zip archive but its records (records
// mode: name length, name, byte count, bytes, repeated), which the harness writes as a zip with
// every size and CRC-32 right (tests/fuzz/zip_rewrite.h): mutations of a pickle or a tensor's
// bytes then reach libtorch's reader and the checks behind the zip's, where a raw input's would
// mostly end at a CRC-32. Allowed, as in the seeded fuzzer (fuzz_checkpoint.cpp): a c10::Error
// with the live optimizer's state and parameters bit-identical, or a consistent load: the loaded
// state, saved again and loaded into a fresh optimizer, is bit-identical, and a step either runs
// or ends in a c10::Error. Anything else aborts (libFuzzer keeps the input). The live optimizers
// hold the trained state of real checkpoints; LOWBIT_LIBFUZZ_SEEDS=<dir> writes those checkpoints
// and fragment files there, raw and as records, as the seed corpus (192 inputs) and exits.
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

#include <lowbit/distributed/sharded_checkpoint.h>
#include <lowbit/tools/inspect.h>

#include "../checkpoint_edit.h"
#include "fuzz_common.h"
#include "zip_rewrite.h"

using namespace lowbit_fuzz;
namespace ld = lowbit::distributed;

namespace {

struct Target {
  std::string name;
  Make make;
  StateFormat format;
  std::vector<at::Tensor> params, grads;
  std::string checkpoint, fragments;  // the original's files on disk
};

std::vector<Target> g_targets;
std::string g_dir;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "lowbit_libfuzz_checkpoint: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void make_targets() {
  g_dir = "/tmp/lowbit_libfuzz_" + std::to_string(getpid());
  remove_tree(g_dir);
  mkdir(g_dir.c_str(), 0700);
  for (const auto& [name, make] : optimizers())
    for (StateFormat f : lowbit::kAllStateFormats) {
      at::manual_seed(static_cast<uint64_t>(g_targets.size()));
      Target t{name, make, f, {at::randn({4608}), at::randn({70})}, {}, {}, {}};
      auto opt = make(t.params, f);
      for (int s = 0; s < 2; ++s) step(*opt, t.params, {at::randn({4608}) * 0.1, at::randn({70}) * 0.1});
      t.grads = {at::randn({4608}) * 0.1, at::randn({70}) * 0.1};
      const std::string base = g_dir + "/orig" + std::to_string(g_targets.size());
      t.checkpoint = base + ".pt";
      torch::save(*opt, t.checkpoint);
      t.fragments = base + "_frag";
      ld::save_fragments(*opt, t.fragments);
      g_targets.push_back(std::move(t));
    }
}

// Records mode: a record is its name's length (1 byte), its name, its byte count (4 bytes,
// little-endian) and its bytes, inflated. Whatever does not make a whole record at the end is left out.
std::string records_of(const std::string& path) {
  std::vector<lowbit::optim::ZipRecord> records;
  const std::string error = lowbit::optim::check_zip_archive(path, &records);
  if (!error.empty()) finding("a seed is not a well-formed archive: " + error);
  const lowbit::optim::ArchiveFile file(path);
  std::string out;
  for (const auto& r : records) {
    std::string bytes;
    const std::string why = lowbit::optim::read_zip_record(file, r, &bytes);
    if (!why.empty() || r.name.size() > 255) finding("a seed's record cannot be read: " + why);
    out += static_cast<char>(r.name.size());
    out += r.name;
    for (int k = 0; k < 4; ++k) out += static_cast<char>((bytes.size() >> (8 * k)) & 0xFF);
    out += bytes;
  }
  return out;
}

std::string zip_of_records(const std::string& in) {
  std::vector<lowbit_test::ZipEntry> entries;
  size_t at = 0;
  while (at < in.size()) {
    const size_t name_len = static_cast<unsigned char>(in[at]);
    if (in.size() - at < 1 + name_len + 4) break;
    lowbit_test::ZipEntry e;
    e.name = in.substr(at + 1, name_len);
    at += 1 + name_len;
    uint32_t n = 0;
    for (int k = 0; k < 4; ++k) n |= uint32_t(static_cast<unsigned char>(in[at + k])) << (8 * k);
    at += 4;
    if (in.size() - at < n) break;
    e.bytes = in.substr(at, n);
    at += n;
    entries.push_back(std::move(e));
  }
  return lowbit_test::zip_archive(std::move(entries));
}

void write_seeds(const std::string& dir) {
  for (size_t k = 0; k < g_targets.size(); ++k) {
    const Target& t = g_targets[k];
    const std::string paths[2] = {t.checkpoint, ld::fragment_file(t.fragments, 0, 1)};
    for (int mode = 0; mode < 4; ++mode) {
      const std::string& path = paths[mode & 1];
      const std::string body = (mode & 2) ? records_of(path) : lowbit_test::read_file(path);
      const int byte = static_cast<int>(4 * k) + mode;
      lowbit_test::write_file(dir + "/seed_" + std::to_string(byte), std::string(1, static_cast<char>(byte)) + body);
    }
  }
}

// A load into `live` (params `p`) and the same kind of save; `load` may throw c10::Error only.
struct Io {
  std::function<void(lo::LowbitOptimizer&)> load_original;
  std::function<void(lo::LowbitOptimizer&)> load_input;
  std::function<void(lo::LowbitOptimizer&, const std::string&)> save;
  std::function<void(lo::LowbitOptimizer&, const std::string&)> load_saved;
};

void check_outcome(const Target& t, const Io& io) {
  std::vector<at::Tensor> p = clone_all(t.params);
  auto live = t.make(p, t.format);
  io.load_original(*live);
  const auto before = snapshot(*live, p);
  try {
    io.load_input(*live);
  } catch (const c10::Error&) {
    if (!same_bits(before, snapshot(*live, p))) finding("refused, but the optimizer's state or parameters changed");
    return;
  } catch (const std::exception& e) {
    finding(std::string("not a c10::Error: ") + e.what());
  }
  // Loaded: what it holds is what a save of it holds.
  const std::string again = g_dir + "/again";
  std::vector<at::Tensor> q = clone_all(t.params);
  auto fresh = t.make(q, t.format);
  try {
    io.save(*live, again);
    io.load_saved(*fresh, again);
  } catch (const std::exception& e) {
    finding(std::string("loaded, but its save does not load again: ") + e.what());
  }
  if (!same_bits(snapshot(*live, p), snapshot(*fresh, q))) finding("loaded, but a save of it loads differently");
  try {
    step(*live, p, t.grads);
  } catch (const c10::Error&) {
  }
}

void run_checkpoint(const Target& t, const std::string& path) {
  Io io;
  io.load_original = [&](lo::LowbitOptimizer& o) { lo::load_checkpoint(o, t.checkpoint); };
  io.load_input = [&](lo::LowbitOptimizer& o) { lo::load_checkpoint(o, path); };
  io.save = [](lo::LowbitOptimizer& o, const std::string& to) { torch::save(o, to); };
  io.load_saved = [](lo::LowbitOptimizer& o, const std::string& from) { lo::load_checkpoint(o, from); };
  check_outcome(t, io);
  try {
    std::ostringstream out;
    lowbit::tools::inspect_checkpoint(path, out);
  } catch (const c10::Error&) {
  } catch (const std::exception& e) {
    finding(std::string("inspect: not a c10::Error: ") + e.what());
  }
}

void run_fragments(const Target& t, const std::string& prefix) {
  Io io;
  io.load_original = [&](lo::LowbitOptimizer& o) { ld::load_fragments(o, t.fragments); };
  io.load_input = [&](lo::LowbitOptimizer& o) { ld::load_fragments(o, prefix); };
  io.save = [](lo::LowbitOptimizer& o, const std::string& to) { ld::save_fragments(o, to); };
  io.load_saved = [](lo::LowbitOptimizer& o, const std::string& from) { ld::load_fragments(o, from); };
  check_outcome(t, io);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  at::set_num_threads(1);
  make_targets();
  if (const char* seeds = std::getenv("LOWBIT_LIBFUZZ_SEEDS")) {
    write_seeds(seeds);
    remove_tree(g_dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Target& t = g_targets[(data[0] / 4) % g_targets.size()];
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 2) bytes = zip_of_records(bytes);
  // The same names for every input: libtorch writes a file's name into its zip.
  if (data[0] % 2 == 0) {
    const std::string path = g_dir + "/input.pt";
    lowbit_test::write_file(path, bytes);
    run_checkpoint(t, path);
  } else {
    const std::string prefix = g_dir + "/input";
    lowbit_test::write_file(ld::fragment_file(prefix, 0, 1), bytes);
    run_fragments(t, prefix);
  }
  return 0;
}
