// The fragment family of lowbit_fuzz_checkpoint (fuzz_fragments.h): originals, mutations, outcome.
#include "fuzz_fragments.h"

#include <climits>
#include <filesystem>

#include <lowbit/distributed/sharded_checkpoint.h>

#include "fragment_edit.h"

namespace lowbit_fuzz {

namespace ld = lowbit::distributed;
namespace lt = lowbit_test;

const char* const kFragmentKinds[] = {
    "frag_bitflip_data", "frag_bitflip_pickle", "frag_bitflip_zip",      "frag_truncate",
    "frag_zip_size_field", "frag_swap_tensors", "frag_missing_entry",    "frag_extra_entry",
    "frag_wrong_dtype",  "frag_wrong_shape",    "frag_wrong_block_size", "frag_wrong_format_id",
    "frag_wrong_version", "frag_absurd_sizes",  "frag_wrong_meta",       "frag_files",
    "frag_short_record"};
const int kNumFragmentKinds = sizeof(kFragmentKinds) / sizeof(kFragmentKinds[0]);

namespace {

std::string suffix(int rank, int world) { return "rank-" + std::to_string(rank) + "-of-" + std::to_string(world); }

bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// The bytes of `e` as a file (written through `tmp`).
std::string bytes_of(const lt::Entries& e, const std::string& tmp) {
  lt::write_entries(e, tmp);
  std::string f = lt::read_file(tmp);
  std::filesystem::remove(tmp);
  return f;
}

template <typename Pred>
std::string pick_key(Rng& r, const lt::Entries& e, Pred pred) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : e)
    if (pred(k, v)) keys.push_back(k);
  return keys.empty() ? std::string() : keys[pick(r, keys.size())];
}

bool is_tensor(const std::string&, const c10::IValue& v) { return v.isTensor(); }
bool is_meta(const std::string& k, const c10::IValue& v) { return v.isTensor() && ends_with(k, ".meta"); }

// Value `field` of int64 entry `key` set to `v`; the note says what changed.
void edit(lt::Entries& e, const std::string& key, int64_t field, int64_t v, std::string* note) {
  if (key.empty() || !e.count(key)) return;
  const int64_t n = e.at(key).toTensor().numel();
  if (n == 0) return;
  field %= n;
  lt::set_int(e, key, field, v);
  *note = key + "[" + std::to_string(field) + "] -> " + std::to_string(v);
}

// ---------------------------------------------------------------------------------------------
// Entry edits of one file (re-signed unless the edit is about the digests)
// ---------------------------------------------------------------------------------------------

// Returns whether the file is to be re-signed.
bool edit_entries(lt::Entries& e, const std::string& k, Rng& r, std::string* note) {
  if (k == "swap_tensors") {
    // Each tensor with its digest (a writer that mixed up names: the digests bind the key). Half
    // the time re-signed instead, so that the checks of dtype and size are reached, but only
    // where those differ: two tensors of one dtype and size swapped and re-signed are another
    // valid file, as any edit of values and re-signing makes one.
    const std::string a = pick_key(r, e, is_tensor);
    const std::string b = pick_key(r, e, [&](const std::string& k, const c10::IValue& v) { return v.isTensor() && k != a; });
    if (b.empty()) return true;
    const at::Tensor ta = e[a].toTensor(), tb = e[b].toTensor();
    std::swap(e[a], e[b]);
    *note = a + " <-> " + b;
    if (pick(r, 2) && (ta.scalar_type() != tb.scalar_type() || ta.sizes() != tb.sizes())) return true;
    std::swap(e[a + ".digest"], e[b + ".digest"]);
    return false;
  }
  if (k == "missing_entry") {
    *note = pick_key(r, e, [](const std::string&, const c10::IValue&) { return true; });
    e.erase(*note);
    return !ends_with(*note, ".digest");  // a removed digest stays removed
  }
  if (k == "extra_entry") {
    const int64_t count = lt::ints_of(e, "header")[lt::kCount];
    const std::string f = "f" + std::to_string(pick(r, count + 1));
    switch (pick(r, 4)) {
      case 0: *note = "f" + std::to_string(count) + ".meta"; e[*note] = e.at("header"); break;
      case 1: *note = f + ".t" + std::to_string(4 + pick(r, 3)); e[*note] = c10::IValue(at::zeros({8})); break;
      case 2: *note = "extra"; e[*note] = c10::IValue(int64_t(7)); break;
      default:  // a whole fragment twice: the header counts it
        if (count == 0) {
          *note = "f0.meta";
          e[*note] = e.at("header");
          return true;
        }
        for (const std::string suffix : {".meta", ".slots", ".t0", ".t1", ".t2", ".t3", ".t4", ".t5"})
          if (e.count("f0" + suffix)) e["f" + std::to_string(count) + suffix] = e.at("f0" + suffix);
        lt::set_int(e, "header", lt::kCount, count + 1);
        *note = "f0 duplicated as f" + std::to_string(count);
    }
    return true;
  }
  if (k == "wrong_dtype") {
    const std::string key = pick_key(r, e, is_tensor);
    const at::ScalarType types[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kByte, at::kChar, at::kDouble, at::kLong,
                                    at::kBool, at::kShort, at::kInt};
    const at::ScalarType to = types[pick(r, 10)];
    e[key] = c10::IValue(e[key].toTensor().to(to));
    *note = key + " -> " + c10::toString(to);
    return true;
  }
  if (k == "wrong_shape") {
    const std::string key = pick_key(r, e, is_tensor);
    at::Tensor t = e[key].toTensor();
    switch (pick(r, 4)) {
      case 0: t = t.narrow(0, 0, t.numel() == 0 ? 0 : pick(r, t.numel())).clone(); break;  // fewer
      case 1: t = at::cat({t, t.numel() == 0 ? at::zeros({1}, t.options()) : t.narrow(0, 0, 1 + pick(r, t.numel()))}); break;
      case 2: t = t.numel() % 2 == 0 ? t.reshape({2, -1}) : t.reshape({1, -1}); break;
      default: t = t.narrow(0, 0, 0).clone(); break;
    }
    *note = key + " -> " + std::to_string(t.numel()) + " elements, " + std::to_string(t.dim()) + "-D";
    e[key] = c10::IValue(t);
    return true;
  }
  if (k == "wrong_block_size") {
    const int64_t values[] = {0, -1, 1, 3, 32, 63, 64, 96, 128, 256, 512, 1024, 2048, 4096, 1 << 20, int64_t(1) << 40,
                              INT64_MAX, INT64_MIN};
    edit(e, pick_key(r, e, is_meta), lt::kBlockSize, values[pick(r, 18)], note);
    return true;
  }
  if (k == "wrong_format_id") {
    // The state format of a fragment, or a slot's storage or QuantFormat.
    if (pick(r, 3) == 0)
      edit(e, pick_key(r, e, is_meta), lt::kFormat, pick(r, 10) - 2, note);
    else
      edit(e, pick_key(r, e, [](const std::string& s, const c10::IValue&) { return ends_with(s, ".slots"); }),
           pick(r, 8), pick(r, 12) - 2, note);
    return true;
  }
  if (k == "wrong_version") {
    const int64_t values[] = {0, 1, 1, 3, -1, 1000, INT64_MAX};
    const int64_t v = values[pick(r, 7)];
    edit(e, "header", lt::kVersion, v, note);
    if (pick(r, 4) == 0) edit(e, "header", lt::kMagic, 0x6C6F77626672ll + pick(r, 3) - 1, note);
    if (v != 1 || pick(r, 2)) return true;
    // A well-formed version 1 file: no digests.
    for (auto it = e.begin(); it != e.end();) it = ends_with(it->first, ".digest") ? e.erase(it) : std::next(it);
    *note += ", digests removed";
    return false;
  }
  if (k == "absurd_sizes") {
    // Counts, sizes and positions beyond any real one (not the magic or the seed).
    const int64_t values[] = {-1, INT64_MIN, INT64_MAX, int64_t(1) << 41, int64_t(1) << 62, int64_t(1) << 50};
    const int64_t v = values[pick(r, 6)];
    if (pick(r, 3) == 0) {
      const int64_t fields[] = {lt::kRank, lt::kWorld, lt::kCount, lt::kSkipped};
      edit(e, "header", fields[pick(r, 4)], v, note);
    } else {
      edit(e, pick_key(r, e, is_meta), pick(r, 10), v, note);
    }
    return true;
  }
  // wrong_meta: plausible values, off by a little, of the fields a reader can check: another
  // parameter, a shifted range, another format, block size or slot count, another writer or
  // fragment count. Not the step, seed or skipped steps, which a file states and nothing can
  // check (the overflow count is not loaded: an edit of it loads and steps like the original).
  const int64_t deltas[] = {-256, -128, -64, -1, 1, 64, 128, 256};
  const int64_t d = deltas[pick(r, 8)];
  if (pick(r, 4) == 0) {
    const int64_t fields[] = {lt::kRank, lt::kWorld, lt::kCount};
    const int64_t field = fields[pick(r, 3)];
    edit(e, "header", field, lt::ints_of(e, "header")[field] + d / std::abs(d), note);
  } else {
    const std::string key = pick_key(r, e, is_meta);
    if (key.empty()) return true;
    // A weight piece's meta ("w<i>.meta") has fields of its own, fewer than a fragment's.
    const bool weight = key[0] == 'w';
    const int64_t fragment_fields[] = {lt::kGroup,  lt::kIndex,     lt::kOffset, lt::kNumel,   lt::kParamNumel,
                                       lt::kFormat, lt::kBlockSize, lt::kNslots, lt::kOverflow};
    const int64_t weight_fields[] = {lt::kWGroup, lt::kWIndex, lt::kWOffset, lt::kWNumel, lt::kWParamNumel, lt::kWDtype};
    const int64_t field = weight ? weight_fields[pick(r, 6)] : fragment_fields[pick(r, 9)];
    const int64_t old = lt::ints_of(e, key).at(field);
    const bool small = weight ? (field == lt::kWGroup || field == lt::kWIndex || field == lt::kWDtype)
                              : (field == lt::kGroup || field == lt::kIndex || field == lt::kNslots || field == lt::kFormat);
    edit(e, key, field, old + (small ? d / std::abs(d) : d), note);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Set edits: which files there are
// ---------------------------------------------------------------------------------------------

FileSet mutate_set(const FragmentSet& set, Rng& r, const std::string& tmp, std::string* note) {
  const int world = static_cast<int>(set.files.size());
  FileSet out;
  std::vector<int> holders;  // writers with fragments, whose copies duplicate something
  for (int w = 0; w < world; ++w) {
    out[suffix(w, world)] = set.files[w];
    if (lt::ints_of(set.entries[w], "header")[lt::kCount] > 0) holders.push_back(w);
  }
  const int victim = holders.empty() ? static_cast<int>(pick(r, world)) : holders[pick(r, holders.size())];
  switch (pick(r, 7)) {
    case 0:
      out.erase(suffix(victim, world));
      *note = "missing " + suffix(victim, world);
      break;
    case 1: {  // one more writer, holding a copy of another's fragments: every file relabelled
      out.clear();
      for (int w = 0; w <= world; ++w) {
        lt::Entries e = set.entries[w < world ? w : victim];
        lt::set_int(e, "header", lt::kRank, w);
        lt::set_int(e, "header", lt::kWorld, world + 1);
        lt::resign_fragments(e);
        out[suffix(w, world + 1)] = bytes_of(e, tmp);
      }
      *note = "writer " + std::to_string(victim) + " duplicated as writer " + std::to_string(world);
      break;
    }
    case 2:
      out[suffix(world, world)] = set.files[victim];
      *note = "extra " + suffix(world, world);
      break;
    case 3:
      out[suffix(0, world + 1)] = set.files[victim];
      *note = "extra " + suffix(0, world + 1);
      break;
    case 4:
      if (world >= 2) {
        std::swap(out[suffix(0, world)], out[suffix(world - 1, world)]);
        *note = "files of ranks 0 and " + std::to_string(world - 1) + " swapped";
        break;
      }
      [[fallthrough]];
    case 5:
      out[suffix(victim, world)] = "";
      *note = "empty " + suffix(victim, world);
      break;
    default:
      out["rank-0" + std::to_string(victim) + "-of-" + std::to_string(world)] = set.files[victim];
      *note = "extra rank-0" + std::to_string(victim) + "-of-" + std::to_string(world);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Originals and cases
// ---------------------------------------------------------------------------------------------

FragmentOriginal make_fragment_original(const lo::LowbitOptimizer& opt, const std::vector<at::Tensor>& params,
                                        const std::string& dir) {
  std::filesystem::create_directories(dir);
  FragmentOriginal o;
  o.prefix = dir + "/frag";
  ld::save_fragments(opt, o.prefix);
  const lt::Entries one = lt::read_entries(ld::fragment_file(o.prefix, 0, 1));
  for (int world = 1; world <= 3; ++world) {
    FragmentSet set;
    set.entries = world == 1 ? std::vector<lt::Entries>{one} : lt::split_fragment_file(one, world);
    for (int w = 0; w < world; ++w) {
      // Written under the name it has in a case, so that the zip's folder name is the same.
      const std::string path = dir + "/set/frag." + suffix(w, world);
      std::filesystem::create_directories(dir + "/set");
      lt::write_entries(set.entries[w], path);
      set.files.push_back(lt::read_file(path));
      set.spans.push_back(lt::record_spans(path));
      std::filesystem::remove(path);
    }
    o.sets.push_back(std::move(set));
  }
  std::filesystem::remove(dir + "/set");
  for (const auto& p : params) o.grads2.push_back(at::randn(p.sizes()) * 0.1);
  return o;
}

FileSet mutate_fragments(const FragmentOriginal& o, int kind, Rng& r, const std::string& tmp, std::string* note) {
  const FragmentSet& set = o.sets[pick(r, o.sets.size())];
  const int world = static_cast<int>(set.files.size());
  const std::string k = std::string(kFragmentKinds[kind]).substr(5);  // without "frag_"
  if (k == "files") return mutate_set(set, r, tmp, note);
  FileSet out;
  std::vector<int> holders;  // writers with fragments: the files most edits have something to damage in
  for (int w = 0; w < world; ++w) {
    out[suffix(w, world)] = set.files[w];
    if (lt::ints_of(set.entries[w], "header")[lt::kCount] > 0) holders.push_back(w);
  }
  const int victim = holders.empty() ? static_cast<int>(pick(r, world)) : holders[pick(r, holders.size())];
  *note = suffix(victim, world) + ": ";
  if (is_byte_kind(k)) {
    out[suffix(victim, world)] = mutate_bytes(set.files[victim], set.spans[victim], k, r);
    return out;
  }
  lt::Entries e = set.entries[victim];
  std::string what;
  if (edit_entries(e, k, r, &what)) lt::resign_fragments(e);
  *note += what;
  out[suffix(victim, world)] = bytes_of(e, tmp);
  return out;
}

Outcome try_load_fragments(const Make& make, StateFormat format, const std::vector<at::Tensor>& params,
                           const std::vector<at::Tensor>& grads, const FragmentOriginal& o, const std::string& prefix,
                           Counts& c, std::string* why) {
  std::vector<at::Tensor> p = clone_all(params);
  auto live = make(p, format);
  ld::load_fragments(*live, o.prefix);
  step(*live, p, o.grads2);  // state and parameters now differ from the checkpoint's
  const auto before = snapshot(*live, p);
  try {
    ld::load_fragments(*live, prefix);
  } catch (const c10::Error& e) {
    last_refusal() = e.what_without_backtrace();
    if (same_bits(before, snapshot(*live, p))) return Outcome::Refused;
    ++c.silent;
    *why = "load_fragments: refused, but the optimizer's state or parameters changed";
    return Outcome::Bad;
  } catch (const std::exception& e) {
    ++c.crashes;
    *why = std::string("load_fragments: not a c10::Error: ") + e.what();
    return Outcome::Bad;
  }
  // Loaded: with the checkpoint's parameters, it must step exactly like the original.
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < p.size(); ++i) p[i].copy_(params[i]);
  }
  std::vector<at::Tensor> q = clone_all(params);
  auto ref = make(q, format);
  ld::load_fragments(*ref, o.prefix);
  try {
    step(*live, p, grads);
  } catch (const c10::Error& e) {
    ++c.silent;
    *why = std::string("load_fragments: loaded, then the step failed: ") + e.what_without_backtrace();
    return Outcome::Bad;
  }
  step(*ref, q, grads);
  if (!same_bits(snapshot(*live, p), snapshot(*ref, q))) {
    ++c.silent;
    *why = "load_fragments: loaded, but steps differently from the original";
    return Outcome::Bad;
  }
  return Outcome::LoadedOk;
}

}  // namespace lowbit_fuzz
