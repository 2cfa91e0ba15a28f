// What the checkpoint fuzzers (the seeded driver fuzz_checkpoint.cpp with fuzz_fragments.cpp, and
// the libFuzzer harness libfuzz_checkpoint.cpp) share: the optimizers their originals come from,
// one training step, the bits an optimizer holds (so that "refused with the state unchanged" and
// "loaded and steps exactly like the original" are checked the same way everywhere), the counts of
// outcomes, and the mutations of a file's bytes (the same for checkpoints and fragment files).
#pragma once

#include <torch/torch.h>

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <lowbit/lowbit.h>

#include "pickle_claims.h"
#include "zip_rewrite.h"

namespace lowbit_fuzz {

namespace lo = lowbit::optim;
using lowbit::StateFormat;

using Make = std::function<std::unique_ptr<lo::LowbitOptimizer>(std::vector<at::Tensor>, StateFormat)>;

// Every lowbit optimizer, each with options that give it all its slots (SGD momentum, RMSprop
// centered with momentum).
inline std::vector<std::pair<std::string, Make>> optimizers() {
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

inline std::vector<at::Tensor> clone_all(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.clone());
  return out;
}

inline void step(lo::LowbitOptimizer& opt, std::vector<at::Tensor>& p, const std::vector<at::Tensor>& g) {
  for (size_t i = 0; i < p.size(); ++i) p[i].mutable_grad() = g[i].clone();
  opt.step();
}

// Every bit an optimizer holds for its parameters: the parameters, each slot's tensors, counters, lr.
inline std::vector<at::Tensor> snapshot(const lo::LowbitOptimizer& opt, const std::vector<at::Tensor>& p) {
  std::vector<at::Tensor> s;
  for (const auto& t : p) {
    s.push_back(t.clone());
    const lo::ParamState* st = opt.state_of(t);
    if (!st) {
      s.push_back(at::tensor({int64_t(-1)}));  // "no state" differs from every state
      continue;
    }
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
  for (const auto& g : opt.param_groups()) s.push_back(at::tensor({g.options().get_lr()}, at::kDouble));
  s.push_back(at::tensor({opt.skipped_steps(), opt.state_bytes()}));
  return s;
}

inline bool same_bits(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sizes() != b[i].sizes() || a[i].scalar_type() != b[i].scalar_type()) return false;
    const at::Tensor x = a[i].contiguous(), y = b[i].contiguous();
    if (std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return true;
}

// `path` and all it holds. POSIX calls: the torch wheel's libtorch exports std::filesystem
// symbols that clash with the toolchain's, and its remove_all crashes.
inline void remove_tree(const std::string& path) {
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") remove_tree(path + "/" + name);
    }
    closedir(d);
    rmdir(path.c_str());
  } else {
    unlink(path.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// Outcomes
// ---------------------------------------------------------------------------------------------

struct Counts {
  int64_t cases = 0, refused = 0, loaded_ok = 0, crashes = 0, hangs = 0, silent = 0;
};

enum class Outcome { Refused, LoadedOk, Bad };

constexpr double kHangSeconds = 10.0;

// The last refusal's message, for LOWBIT_FUZZ_VERBOSE: which check refused a case.
inline std::string& last_refusal() {
  static std::string message;
  return message;
}

// ---------------------------------------------------------------------------------------------
// Mutations of a file's bytes
// ---------------------------------------------------------------------------------------------

using Rng = std::mt19937_64;
inline int64_t pick(Rng& r, int64_t n) { return static_cast<int64_t>(r() % static_cast<uint64_t>(n)); }

// [offset, stored size) of each zip record by name (lowbit_test::record_spans).
using Spans = std::map<std::string, std::pair<size_t, size_t>>;

inline bool is_byte_kind(const std::string& k) {
  return k == "bitflip_data" || k == "bitflip_pickle" || k == "bitflip_zip" || k == "truncate" || k == "zip_size_field" ||
         k == "short_record";
}

// short_record: fewer bytes in a tensor's record than data.pkl claims for it, in an archive
// re-sealed (sizes, offsets and CRC-32s recomputed: zip_rewrite.h) so that only a check of each
// tensor against its record can tell. The record cut short; or in data.pkl (pickle_claims.h) the
// storage's element count, a size, the offset or a stride made larger; or the large claim, 2^24
// elements (64 MB of floats) for both storage and size over one of the smallest records (a few
// bytes), sometimes cut shorter still; or claims whose byte counts overflow 64 bits.
inline std::string short_record(const std::string& file, Rng& r) {
  using lowbit_test::PickleInt;
  std::vector<lowbit_test::ZipEntry> entries = lowbit_test::zip_entries(file);
  lowbit_test::ZipEntry* pkl = lowbit_test::find_entry_in_folder(entries, "data.pkl");
  const std::vector<lowbit_test::TensorClaims> claims =
      pkl ? lowbit_test::tensor_claims(pkl->bytes) : std::vector<lowbit_test::TensorClaims>{};
  if (claims.empty()) return file;  // nothing to claim (no tensor in the file)
  const int variant = static_cast<int>(pick(r, 6));
  size_t which = pick(r, claims.size());
  if (variant == 3) {  // one of the smallest records
    std::vector<size_t> smallest;
    uint64_t least = UINT64_MAX;
    for (size_t i = 0; i < claims.size(); ++i) {
      const auto* e = lowbit_test::find_entry_in_folder(entries, "data/" + claims[i].key);
      const uint64_t n = e ? e->bytes.size() : 0;
      if (n < least) smallest.clear(), least = n;
      if (n == least) smallest.push_back(i);
    }
    which = smallest[pick(r, smallest.size())];
  }
  const lowbit_test::TensorClaims& t = claims[which];
  lowbit_test::ZipEntry* record = lowbit_test::find_entry_in_folder(entries, "data/" + t.key);
  std::string& p = pkl->bytes;
  // Edits from the end of the pickle: sizes and strides come after the element count.
  const int64_t deltas[] = {1, 2, 3, 64, 255, 256, 4096, 1 + pick(r, 1 << 20)};
  const int64_t d = deltas[pick(r, 8)];
  const bool has_sizes = !t.sizes.empty();
  switch (variant) {
    case 0: {  // the record cut short
      if (!record || record->bytes.empty()) break;
      const size_t n = record->bytes.size();
      const size_t keeps[] = {0, n - 1, n / 2, static_cast<size_t>(pick(r, n))};
      record->bytes.resize(keeps[pick(r, 4)]);
      break;
    }
    case 1:  // the storage claims more elements
      p = lowbit_test::set_pickle_int(p, t.numel, t.numel.value + d);
      break;
    case 2:  // a size larger than the storage holds
      if (has_sizes) {
        const PickleInt& s = t.sizes[pick(r, t.sizes.size())];
        p = lowbit_test::set_pickle_int(p, s, s.value + d);
      } else {
        p = lowbit_test::set_pickle_int(p, t.numel, t.numel.value + d);
      }
      break;
    case 3: {  // 2^24 elements over one of the smallest records
      constexpr int64_t kLarge = int64_t(1) << 24;
      if (has_sizes) p = lowbit_test::set_pickle_int(p, t.sizes[0], kLarge);
      if (!has_sizes || pick(r, 4) != 0) p = lowbit_test::set_pickle_int(p, t.numel, kLarge);
      if (record && pick(r, 3) == 0) record->bytes.resize(std::min<size_t>(record->bytes.size(), pick(r, 16)));
      break;
    }
    case 4:  // the storage offset or a stride larger
      if (has_sizes && pick(r, 2)) {
        const PickleInt& s = t.strides[pick(r, t.strides.size())];
        p = lowbit_test::set_pickle_int(p, s, pick(r, 2) ? s.value + 1 : s.value + d);
      } else {
        p = lowbit_test::set_pickle_int(p, t.offset, t.offset.value + d);
      }
      break;
    default: {  // byte counts past 64 bits (times the item size), or past any memory
      const int64_t huge[] = {int64_t(1) << 40, int64_t(1) << 61, int64_t(1) << 62, INT64_MAX, (int64_t(3) << 61) + 1};
      const int64_t v = huge[pick(r, 5)];
      const int which_claim = static_cast<int>(pick(r, 3));
      if (has_sizes && which_claim != 1) p = lowbit_test::set_pickle_int(p, t.sizes[0], v);
      if (!has_sizes || which_claim != 0) p = lowbit_test::set_pickle_int(p, t.numel, v);
    }
  }
  return lowbit_test::zip_archive(std::move(entries));
}

// `file` damaged by byte-level mutation `k` (is_byte_kind): a flipped bit in a tensor's bytes
// (data), in another record (pickle), or outside every record (zip: local headers, central
// directory); a truncation at a record's start or end (every section) or anywhere; a central
// directory entry's size field set to a value from a list of extremes; a tensor's record shorter
// than data.pkl claims, the zip re-sealed (short_record).
inline std::string mutate_bytes(const std::string& file, const Spans& spans, const std::string& k, Rng& r) {
  std::string f = file;
  auto flip_at = [&](size_t at) { f[at] = static_cast<char>(f[at] ^ (1 << pick(r, 8))); };
  if (k == "bitflip_data" || k == "bitflip_pickle") {
    std::vector<std::pair<size_t, size_t>> in;
    for (const auto& [name, s] : spans)
      if ((name.rfind("data/", 0) == 0) == (k == "bitflip_data") && s.second > 0) in.push_back(s);
    const auto s = in[pick(r, in.size())];
    flip_at(s.first + pick(r, s.second));
    return f;
  }
  if (k == "bitflip_zip") {
    std::vector<bool> in_record(f.size(), false);
    for (const auto& [name, s] : spans)
      for (size_t i = s.first; i < s.first + s.second && i < f.size(); ++i) in_record[i] = true;
    std::vector<size_t> outside;
    for (size_t i = 0; i < f.size(); ++i)
      if (!in_record[i]) outside.push_back(i);
    flip_at(outside[pick(r, outside.size())]);
    return f;
  }
  if (k == "short_record") return short_record(file, r);
  if (k == "truncate") {
    std::vector<size_t> cuts = {0};
    for (const auto& [name, s] : spans) {
      cuts.push_back(s.first);
      cuts.push_back(s.first + s.second);
    }
    size_t cut = pick(r, 2) ? cuts[pick(r, cuts.size())] : pick(r, f.size());
    cut = std::min(cut + pick(r, 3), f.size() - 1);
    return f.substr(0, cut);
  }
  // zip_size_field: a central directory entry's uncompressed (24) or compressed (20) size.
  std::vector<size_t> dirs;
  for (size_t i = 0; i + 46 < f.size(); ++i)
    if (std::memcmp(f.data() + i, "PK\x01\x02", 4) == 0) dirs.push_back(i);
  const size_t d = dirs[pick(r, dirs.size())] + (pick(r, 2) ? 24 : 20);
  const uint32_t values[] = {0xFFFFFFFFu, 0xFFFFFFFEu, 0x7FFFFFFFu, 0x80000000u, 0u, 1u, static_cast<uint32_t>(r())};
  const uint32_t v = values[pick(r, 7)];
  std::memcpy(&f[d], &v, 4);
  return f;
}

}  // namespace lowbit_fuzz
