// Fragment files (distributed/sharded_checkpoint.cpp) as maps of entries, for the tests and the
// fuzzer: edit an entry and re-sign the file (each tensor's "<key>.digest"), relabel a file as
// another writer's, and cut one writer's file into several writers' files, as a sharded job saves.
#pragma once

#include <cctype>

#include <lowbit/kernels/common/format_table.h>
#include <lowbit/kernels/common/state_slots.h>

#include "../checkpoint_edit.h"

namespace lowbit_test {

// Fields of the "header" entry, of each "f<i>.meta" entry and of each "w<i>.meta" entry
// (sharded_checkpoint.cpp; kWeightCount and the weight pieces from version 3).
enum HeaderField { kMagic = 0, kVersion, kRank, kWorld, kSeed, kCount, kSkipped, kWeightCount };
enum MetaField { kGroup = 0, kIndex, kOffset, kNumel, kParamNumel, kFormat, kBlockSize, kNslots, kStep, kOverflow };
enum WeightField { kWGroup = 0, kWIndex, kWOffset, kWNumel, kWParamNumel, kWDtype };

// Every tensor's digest recomputed, so that an edit reaches the loader's checks behind the digests.
inline void resign_fragments(Entries& e) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : e)
    if (v.isTensor()) keys.push_back(k);
  for (const std::string& k : keys) e[k + ".digest"] = c10::IValue(lowbit::optim::tensor_digest(k, e[k].toTensor()));
}

inline std::vector<int64_t> ints_of(const Entries& e, const std::string& key) {
  const at::Tensor t = e.at(key).toTensor().contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

// Value `field` of the int64 entry `key` set to `v` (a copy: the original's tensor is untouched).
inline void set_int(Entries& e, const std::string& key, int64_t field, int64_t v) {
  at::Tensor t = e.at(key).toTensor().clone();
  t.data_ptr<int64_t>()[field] = v;
  e[key] = c10::IValue(t);
}

// The file of `path` as writer `rank` of `world` (header re-signed), written to `to`.
inline void relabel_fragment_file(const std::string& path, const std::string& to, int rank, int world) {
  Entries e = read_entries(path);
  set_int(e, "header", kRank, rank);
  set_int(e, "header", kWorld, world);
  resign_fragments(e);
  write_entries(e, to);
}

// A version-3 file's entries as version `version` wrote them: before 3 without the weight pieces
// (the header one value shorter), before 2 without digests.
inline Entries as_version(const Entries& e, int64_t version) {
  Entries out;
  for (const auto& [k, v] : e) {
    const bool weight = k.size() > 1 && k[0] == 'w' && std::isdigit(static_cast<unsigned char>(k[1]));
    const bool digest = k.size() > 7 && k.compare(k.size() - 7, 7, ".digest") == 0;
    if ((version < 3 && weight) || (version < 2 && digest)) continue;
    out.emplace(k, v);
  }
  std::vector<int64_t> h = ints_of(e, "header");
  h[kVersion] = version;
  if (version < 3) h.resize(kWeightCount);
  out["header"] = c10::IValue(at::tensor(h));
  if (version >= 2) resign_fragments(out);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Cutting a file into several writers' files
// ---------------------------------------------------------------------------------------------

// One fragment's entries: meta, slots and state tensors.
struct FragmentEntries {
  std::vector<int64_t> meta, slots;
  std::vector<at::Tensor> tensors;
};

inline FragmentEntries fragment_entries(const Entries& e, int64_t i) {
  const std::string key = "f" + std::to_string(i);
  FragmentEntries f{ints_of(e, key + ".meta"), ints_of(e, key + ".slots"), {}};
  for (int64_t k = 0; e.count(key + ".t" + std::to_string(k)); ++k)
    f.tensors.push_back(e.at(key + ".t" + std::to_string(k)).toTensor());
  return f;
}

// Elements [begin, begin + len) of fragment `f` (begin a multiple of its block size).
inline FragmentEntries fragment_range(const FragmentEntries& f, int64_t begin, int64_t len) {
  FragmentEntries out{f.meta, f.slots, {}};
  out.meta[kOffset] = f.meta[kOffset] + begin;
  out.meta[kNumel] = len;
  const int64_t bs = f.meta[kBlockSize];
  size_t t = 0;
  for (size_t k = 0; k + 1 < f.slots.size(); k += 2) {
    const auto storage = static_cast<lowbit::kernels::SlotStorage>(f.slots[k]);
    if (storage == lowbit::kernels::SlotStorage::None) continue;
    if (storage == lowbit::kernels::SlotStorage::Quant) {
      const auto q = static_cast<lowbit::QuantFormat>(f.slots[k + 1]);
      out.tensors.push_back(
          f.tensors[t++].narrow(0, lowbit::code_bytes(q, begin), lowbit::code_bytes(q, len)).clone());
      out.tensors.push_back(f.tensors[t++].narrow(0, begin / bs, (len + bs - 1) / bs).clone());
    } else {
      out.tensors.push_back(f.tensors[t++].narrow(0, begin, len).clone());
    }
  }
  return out;
}

// One weight piece's entries: meta and values.
struct WeightEntries {
  std::vector<int64_t> meta;
  at::Tensor values;
};

inline WeightEntries weight_entries(const Entries& e, int64_t i) {
  const std::string key = "w" + std::to_string(i);
  return {ints_of(e, key + ".meta"), e.at(key).toTensor()};
}

// The entries of writer `rank` of `world` holding `frags` and `weights`, with `like`'s seed and
// skipped steps, signed.
inline Entries fragment_file_entries(const Entries& like, int rank, int world, const std::vector<FragmentEntries>& frags,
                                     const std::vector<WeightEntries>& weights = {}) {
  std::vector<int64_t> h = ints_of(like, "header");
  h[kRank] = rank;
  h[kWorld] = world;
  h[kCount] = static_cast<int64_t>(frags.size());
  if (h.size() > kWeightCount) h[kWeightCount] = static_cast<int64_t>(weights.size());
  Entries e;
  e["header"] = c10::IValue(at::tensor(h));
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::string key = "w" + std::to_string(i);
    e[key + ".meta"] = c10::IValue(at::tensor(weights[i].meta));
    e[key] = c10::IValue(weights[i].values);
  }
  for (size_t i = 0; i < frags.size(); ++i) {
    const std::string key = "f" + std::to_string(i);
    e[key + ".meta"] = c10::IValue(at::tensor(frags[i].meta));
    e[key + ".slots"] = c10::IValue(at::tensor(frags[i].slots, at::kLong));
    for (size_t k = 0; k < frags[i].tensors.size(); ++k)
      e[key + ".t" + std::to_string(k)] = c10::IValue(frags[i].tensors[k]);
  }
  resign_fragments(e);
  return e;
}

// One writer's entries `e` (every parameter whole) as `world` writers' entries, as a sharded job
// writes them: each fragment cut near its middle at a multiple of 256 (whole blocks of every
// default block size) and of its block size, the first part to writer w, the second to w + 1 (w going round
// the writers); a writer may end up with no fragment. Weight pieces are cut the same way.
inline std::vector<Entries> split_fragment_file(const Entries& e, int world) {
  std::vector<std::vector<FragmentEntries>> per(world);
  std::vector<std::vector<WeightEntries>> weights(world);
  const std::vector<int64_t> header = ints_of(e, "header");
  const int64_t pieces = header.size() > kWeightCount ? header[kWeightCount] : 0;
  for (int64_t i = 0, w = 0; i < pieces; ++i, w = (w + 1) % world) {
    const WeightEntries p = weight_entries(e, i);
    const int64_t n = p.meta[kWNumel], cut = n / 2 / 256 * 256;
    if (world == 1 || cut == 0) {
      weights[w].push_back(p);
      continue;
    }
    WeightEntries a = p, b = p;
    a.meta[kWNumel] = cut;
    a.values = p.values.narrow(0, 0, cut).clone();
    b.meta[kWOffset] = p.meta[kWOffset] + cut;
    b.meta[kWNumel] = n - cut;
    b.values = p.values.narrow(0, cut, n - cut).clone();
    weights[w].push_back(a);
    weights[(w + 1) % world].push_back(b);
  }
  const int64_t count = ints_of(e, "header")[kCount];
  int w = 0;
  for (int64_t i = 0; i < count; ++i, w = (w + 1) % world) {
    const FragmentEntries f = fragment_entries(e, i);
    const int64_t align = std::max<int64_t>(256, f.meta[kBlockSize]);
    const int64_t n = f.meta[kNumel], cut = n / 2 / align * align;
    if (world == 1 || cut == 0) {
      per[w].push_back(f);
      continue;
    }
    per[w].push_back(fragment_range(f, 0, cut));
    per[(w + 1) % world].push_back(fragment_range(f, cut, n - cut));
  }
  std::vector<Entries> out;
  for (int r = 0; r < world; ++r) out.push_back(fragment_file_entries(e, r, world, per[r], weights[r]));
  return out;
}

}  // namespace lowbit_test
