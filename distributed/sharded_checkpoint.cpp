// Fragment checkpoints: write each holder's pieces (version 2: a digest per entry), read every
// writer's file (zip CRC-32s, digests, every value's range, dtypes and sizes) and check the whole,
// convert a parameter saved in another layout where the caller asks to (LoadOptions), then load the
// ranges each optimizer needs. POSIX directory calls, not std::filesystem (the torch
// wheel exports std::filesystem symbols that clash with the toolchain's).
#include "sharded_checkpoint.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <torch/serialize/archive.h>

#include "../optim/checkpoint_reader.h"
#include "../optim/fragment_access.h"

#include "../optim/step_calls.h"
#include "sharded_optimizer.h"

namespace lowbit {
namespace distributed {

using optim::FragmentAccess;
using optim::append_state_range;

namespace {

constexpr int64_t kMagic = 0x6C6F77626672ll;  // "lowbfr"
// Version 2 adds a digest per entry (optim::tensor_digest: its key, dtype, sizes and bytes) as
// entry "<key>.digest". Version 1 files (lowbit before the digests) still load: they pass every
// other check below (the zip's CRC-32s included), only without digests; refusing them would strand
// every sharded checkpoint written so far, and the CRC-32s already catch damage to their bytes.
constexpr int64_t kVersionDigests = 2;
constexpr int64_t kVersionWeights = 3;
// magic, version, rank, world size, seed, fragment count, skipped steps, and from version 3 the
// count of weight pieces
int64_t header_size(int64_t version) { return version >= kVersionWeights ? 8 : 7; }
constexpr int64_t kMax = optim::kMaxCheckpointCount;

struct Meta {  // the int64 header of one fragment
  int64_t group, index, offset, numel, param_numel, format, block_size, nslots, step, overflow;
};
constexpr const char* kMetaFields[] = {"group", "index",      "offset", "numel", "param_numel",
                                       "format", "block_size", "nslots", "step",  "overflow"};
constexpr int64_t kMetaSize = sizeof(kMetaFields) / sizeof(kMetaFields[0]);
static_assert(kMetaSize * sizeof(int64_t) == sizeof(Meta), "one name per Meta field");

struct FileFragment {
  Meta meta;
  std::vector<kernels::SlotType> slots;
  std::vector<at::Tensor> tensors;  // as append_state_range gives them
  std::string name;                 // "<file>: fragment <i> (parameter <j> of group <g>)"
  std::string where;                // "load fragments: " + name, for errors
};

struct FileHeader {
  int64_t version, rank, world_size, seed, count, skipped, weight_count = 0;
};

// One writer's piece of one parameter's values: elements [offset, offset + numel) of parameter
// `index` of group `group` (entries "w<i>.meta": group, index, offset, numel, param_numel, dtype,
// and "w<i>": the values).
struct WeightPiece {
  int64_t group = 0, index = 0, offset = 0, numel = 0, param_numel = 0;
  at::Tensor values;
  std::string where;
};

// How many tensors a slot of `storage` holds in a file: codes + absmax, values, or none.
int tensors_of(kernels::SlotStorage storage) {
  return storage == kernels::SlotStorage::Quant ? 2 : storage == kernels::SlotStorage::None ? 0 : 1;
}

std::string fragment_key(int64_t i) { return "f" + std::to_string(i); }

// The work block every writer gives dense (FP32 / BF16) state, whatever the rule: state_layout's.
int64_t dense_work_block(StateFormat f) {
  return optim::state_layout(kernels::StepConfig{}, f, 1, 0, 0, QuantFormat::FP8E4M3, "load fragments").block_size;
}

// A quantized slot's codes are in a format of its state format: the signed or the unsigned one,
// or for FP8 either float8 format (fp8_second_moment).
bool in_state_format(StateFormat f, QuantFormat q) {
  return q == quant_format_for(f, true) || q == quant_format_for(f, false) ||
         (f == StateFormat::FP8 && (q == QuantFormat::FP8E4M3 || q == QuantFormat::FP8E5M2));
}

// ---------------------------------------------------------------------------------------------
// Writing (version 2): every entry a tensor, each followed by its digest
// ---------------------------------------------------------------------------------------------

void put(torch::serialize::OutputArchive& ar, const std::string& key, const at::Tensor& t) {
  const at::Tensor c = t.cpu().contiguous();
  ar.write(key, c);
  ar.write(key + ".digest", c10::IValue(optim::tensor_digest(key, c)));
}

void write_file(const std::string& path, int rank, int world_size, uint64_t seed, int64_t skipped,
                const std::vector<const Fragment*>& frags, const std::vector<WeightPiece>& weights) {
  torch::serialize::OutputArchive ar;
  put(ar, "header", at::tensor(std::vector<int64_t>{kMagic, kFragmentFormatVersion, rank, world_size,
                                                    static_cast<int64_t>(seed), static_cast<int64_t>(frags.size()),
                                                    skipped, static_cast<int64_t>(weights.size())}));
  for (size_t i = 0; i < weights.size(); ++i) {
    const WeightPiece& w = weights[i];
    const std::string key = "w" + std::to_string(i);
    put(ar, key + ".meta", at::tensor(std::vector<int64_t>{w.group, w.index, w.offset, w.numel, w.param_numel,
                                                           static_cast<int64_t>(w.values.scalar_type())}));
    put(ar, key, w.values.reshape({-1}));
  }
  for (size_t i = 0; i < frags.size(); ++i) {
    const Fragment& f = *frags[i];
    const optim::ParamState& st = f.state;
    const at::Tensor c = st.counters.cpu();
    const std::string key = fragment_key(static_cast<int64_t>(i));
    put(ar, key + ".meta", at::tensor(std::vector<int64_t>{
                               static_cast<int64_t>(f.group), static_cast<int64_t>(f.index), f.offset, f.numel,
                               f.param_numel, static_cast<int64_t>(st.format), st.block_size,
                               static_cast<int64_t>(st.slots.size()), c.data_ptr<int64_t>()[0], c.data_ptr<int64_t>()[1]}));
    std::vector<int64_t> slots;
    for (const auto& s : st.slots) {
      slots.push_back(static_cast<int64_t>(s.type.storage));
      slots.push_back(static_cast<int64_t>(s.type.format));
    }
    put(ar, key + ".slots", at::tensor(slots, at::kLong));
    std::vector<at::Tensor> ts;
    append_state_range(st, 0, f.numel, ts);
    for (size_t k = 0; k < ts.size(); ++k) put(ar, key + ".t" + std::to_string(k), ts[k]);
  }
  ar.save_to(path);
}

// ---------------------------------------------------------------------------------------------
// Reading: the zip and its CRC-32s first (libtorch checks neither), then every entry checked
// (type, dtype, shape, digest, each value's range) before any is used
// ---------------------------------------------------------------------------------------------

class FileReader {
 public:
  explicit FileReader(const std::string& path) : path_(path), who_("load fragments: " + path) {
    try {
      optim::load_checkpoint_archive(path, ar_);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "load fragments: ", e.what_without_backtrace());
    }
  }

  int64_t version = 0;  // 0 until the header is read: no digests expected before
  const std::string& path() const { return path_; }
  const std::string& who() const { return who_; }

  // A state tensor of `dtype` (flat, cpu), its digest checked in version 2.
  at::Tensor tensor(const std::string& key, at::ScalarType dtype) {
    c10::IValue v;
    TORCH_CHECK(ar_.try_read(key, v), who_, ": entry '", key, "' is missing");
    TORCH_CHECK(v.isTensor(), who_, ": entry '", key, "' is not a tensor (", v.tagKind(), ")");
    const at::Tensor t = v.toTensor();
    optim::check_stored_tensor(who_, key, t, dtype);
    read_.insert(key);
    if (version >= kVersionDigests) {
      const std::string dk = key + ".digest";
      TORCH_CHECK(ar_.try_read(dk, v) && v.isInt(), who_, ": entry '", dk, "' is missing or not an integer");
      optim::check_tensor_digest(who_, key, t, v.toInt());
      read_.insert(dk);
    }
    return t;
  }

  // An int64 entry of exactly `n` values.
  std::vector<int64_t> ints(const std::string& key, int64_t n) {
    const at::Tensor t = tensor(key, at::kLong);
    TORCH_CHECK(t.numel() == n, who_, ": entry '", key, "' has ", t.numel(), " values, expected ", n);
    const at::Tensor c = t.contiguous();
    return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + n);
  }

  // Entries beyond those read are none a writer writes (an edited or spliced file).
  void check_no_other_entries() {
    const std::vector<std::string> keys = ar_.keys();
    for (const std::string& k : keys)
      TORCH_CHECK(read_.count(k), who_, ": entry '", k, "' is not one a version-", version, " writer writes");
    TORCH_CHECK(keys.size() == read_.size(), who_, ": ", keys.size(), " entries, expected ", read_.size());
  }

  // Count checks against what the archive holds before a loop trusts them.
  int64_t entries() { return static_cast<int64_t>(ar_.keys().size()); }

 private:
  torch::serialize::InputArchive ar_;
  std::string path_, who_;
  std::set<std::string> read_;
};

void check_range(const std::string& who, const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  TORCH_CHECK(v >= lo && v <= hi, who, ": ", field, " is ", v, ", expected ", lo, "..", hi);
}

FileHeader read_header(FileReader& r, int rank, int world_size) {
  // Version unknown yet: its digest is checked below. Contiguous before its values are read by
  // index: a file may give it any strides that stay inside its storage (stride 0 among them).
  const at::Tensor t = r.tensor("header", at::kLong).contiguous();
  TORCH_CHECK(t.numel() >= 2 && t.data_ptr<int64_t>()[0] == kMagic, r.who(),
              " is not a lowbit fragment file (no fragment header)");
  const int64_t* x = t.data_ptr<int64_t>();
  TORCH_CHECK(x[1] >= 1 && x[1] <= kFragmentFormatVersion, r.who(), ": format version ", x[1],
              " is not supported (this lowbit reads versions 1 to ", kFragmentFormatVersion, ")");
  TORCH_CHECK(t.numel() == header_size(x[1]), r.who(), ": the header has ", t.numel(), " values; version ", x[1],
              " writes ", header_size(x[1]));
  FileHeader h{x[1], x[2], x[3], x[4], x[5], x[6]};
  if (h.version >= kVersionWeights) h.weight_count = x[7];
  r.version = h.version;
  if (h.version >= kVersionDigests) r.ints("header", header_size(h.version));  // now with its digest
  TORCH_CHECK(h.rank == rank && h.world_size == world_size, r.who(), ": the header says rank ", h.rank, " of ",
              h.world_size, ", the file name rank ", rank, " of ", world_size);
  // Each fragment has at least two entries (meta and slots), each weight piece two (meta and
  // values): larger counts are not this file's.
  check_range(r.who(), "the header's fragment count", h.count, 0, r.entries() / 2);
  check_range(r.who(), "the header's weight-piece count", h.weight_count, 0, r.entries() / 2 - h.count);
  check_range(r.who(), "the header's skipped-step count", h.skipped, 0, kMax);
  return h;
}

// Weight piece i, its meta checked field by field before its values are read.
WeightPiece read_weights(FileReader& r, int64_t i) {
  const std::string key = "w" + std::to_string(i);
  const std::vector<int64_t> m = r.ints(key + ".meta", 6);
  const std::string where = c10::str("load fragments: ", r.path(), ": weight piece ", i);
  const char* names[] = {"group", "index", "offset", "numel", "param_numel", "dtype"};
  const auto check = [&](int k, int64_t lo, int64_t hi) {
    check_range(where, c10::str("field ", names[k], " of '", key, ".meta'"), m[k], lo, hi);
  };
  check(0, 0, kMax);
  check(1, 0, kMax);
  check(4, 1, kMax);
  check(2, 0, m[4]);
  check(3, 0, m[4] - m[2]);
  const auto dtype = static_cast<at::ScalarType>(m[5]);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, where, ": field dtype of '", key,
              ".meta' is ", m[5], ", not float32, bfloat16 or float16");
  WeightPiece w{m[0], m[1], m[2], m[3], m[4], r.tensor(key, dtype), ""};
  w.where = c10::str(where, " (parameter ", w.index, " of group ", w.group, ")");
  TORCH_CHECK(w.values.numel() == w.numel, w.where, ": entry '", key, "' has ", w.values.numel(), " values, expected ",
              w.numel);
  return w;
}

// The fragment's meta values, each checked against its range and the others before any is used.
Meta read_meta(FileReader& r, const std::string& key, const std::string& where) {
  const std::vector<int64_t> m = r.ints(key + ".meta", kMetaSize);
  Meta meta;
  std::memcpy(&meta, m.data(), sizeof meta);
  const auto check = [&](int k, int64_t lo, int64_t hi) {
    check_range(where, c10::str("field ", kMetaFields[k], " of '", key, ".meta'"), m[k], lo, hi);
  };
  check(0, 0, kMax);                                   // group
  check(1, 0, kMax);                                   // index
  check(4, 1, kMax);                                   // param_numel
  check(2, 0, meta.param_numel);                       // offset
  check(3, 0, meta.param_numel - meta.offset);         // numel: inside the parameter
  check(5, 0, kNumStateFormats - 1);                   // format
  check(6, 1, kMax);                                   // block_size
  check(7, 0, kernels::kMaxSlots);                     // nslots
  check(8, 0, kMax);                                   // step
  check(9, 0, kMax);                                   // overflow
  const auto format = static_cast<StateFormat>(meta.format);
  if (is_quantized(format)) {
    // Quantization blocks are global to the parameter: a fragment starts on a block boundary.
    optim::check_quant_block_size(where, key + ".meta block_size", quant_format_for(format, true), meta.block_size);
    TORCH_CHECK(meta.offset % meta.block_size == 0, where, ": offset ", meta.offset,
                " is not a multiple of the block size ", meta.block_size);
  } else {
    // As the unsharded reader checks: a converting load would otherwise take any value here.
    const int64_t work = dense_work_block(format);
    TORCH_CHECK(meta.block_size == work, where, ": field block_size of '", key, ".meta' is ", meta.block_size,
                ", expected ", work, " for ", state_format_name(format), " state");
  }
  return meta;
}

// Slot k's storage and format, checked against the fragment's state format: quantized storage for
// a quantized format, FP32 / BF16 values for those formats, a correction only in the last slot.
kernels::SlotType read_slot_type(const std::string& where, const Meta& meta, const std::vector<int64_t>& slots,
                                 int64_t k) {
  const std::string field = c10::str(where, ": slot ", k);
  check_range(field, "storage", slots[2 * k], 0, static_cast<int64_t>(kernels::SlotStorage::Int8));
  check_range(field, "format", slots[2 * k + 1], 0, kNumQuantFormats - 1);
  kernels::SlotType t{static_cast<kernels::SlotStorage>(slots[2 * k]), static_cast<QuantFormat>(slots[2 * k + 1])};
  const auto format = static_cast<StateFormat>(meta.format);
  bool fits = true;
  switch (t.storage) {
    case kernels::SlotStorage::None: break;
    case kernels::SlotStorage::F32: fits = format == StateFormat::FP32; break;
    case kernels::SlotStorage::BF16: fits = format == StateFormat::BF16; break;
    case kernels::SlotStorage::Quant: fits = is_quantized(format) && in_state_format(format, t.format); break;
    case kernels::SlotStorage::Int16:
    case kernels::SlotStorage::Int8: fits = k == kernels::kCorrectionSlot; break;
  }
  TORCH_CHECK(fits, field, " is stored as ", kernels::slot_type_name(t), ", which a ",
              state_format_name(format), " state ", k == kernels::kCorrectionSlot ? "" : "in this slot ",
              "does not hold");
  return t;
}

// The tensors of one slot: dtype and size from the slot and the fragment's numel / block size;
// quantized ones with finite block scales and codes (the checks of optim/checkpoint_reader.h).
void read_slot_tensors(FileReader& r, const std::string& key, const Meta& meta, kernels::SlotType t, int64_t* next,
                       std::vector<at::Tensor>* out) {
  const auto tkey = [&] { return key + ".t" + std::to_string((*next)++); };
  using S = kernels::SlotStorage;
  if (t.storage == S::None) return;
  if (t.storage == S::Quant) {
    const std::string ck = tkey(), ak = tkey();
    const at::Tensor codes = r.tensor(ck, at::kByte), absmax = r.tensor(ak, at::kFloat);
    TORCH_CHECK(codes.numel() == code_bytes(t.format, meta.numel), r.who(), ": entry '", ck, "' has ", codes.numel(),
                " code bytes, expected ", code_bytes(t.format, meta.numel), " for ", meta.numel, " elements of ",
                format_name(t.format));
    const int64_t blocks = (meta.numel + meta.block_size - 1) / meta.block_size;
    TORCH_CHECK(absmax.numel() == blocks, r.who(), ": entry '", ak, "' has ", absmax.numel(), " block scales, expected ",
                blocks, " (", meta.numel, " elements in blocks of ", meta.block_size, ")");
    optim::check_block_scales(r.who(), ak, absmax);
    optim::check_codes_finite(r.who(), ck, codes, t.format);
    out->push_back(codes);
    out->push_back(absmax);
    return;
  }
  const at::ScalarType dtype = t.storage == S::F32    ? at::kFloat
                               : t.storage == S::BF16 ? at::kBFloat16
                               : t.storage == S::Int16 ? at::kShort
                                                       : at::kChar;
  const std::string vk = tkey();
  const at::Tensor values = r.tensor(vk, dtype);
  TORCH_CHECK(values.numel() == meta.numel, r.who(), ": entry '", vk, "' has ", values.numel(), " values, expected ",
              meta.numel);
  out->push_back(values);
}

FileFragment read_fragment(FileReader& r, int64_t i) {
  const std::string key = fragment_key(i);
  FileFragment f;
  f.name = c10::str(r.path(), ": fragment ", i);
  f.where = "load fragments: " + f.name;
  f.meta = read_meta(r, key, f.where);
  const std::string param = c10::str(" (parameter ", f.meta.index, " of group ", f.meta.group, ")");
  f.name += param;
  f.where += param;
  const std::vector<int64_t> slots = r.ints(key + ".slots", 2 * f.meta.nslots);
  int64_t next = 0;
  for (int64_t k = 0; k < f.meta.nslots; ++k) {
    f.slots.push_back(read_slot_type(f.where, f.meta, slots, k));
    read_slot_tensors(r, key, f.meta, f.slots.back(), &next, &f.tensors);
  }
  return f;
}

// One writer's file, whole: rank and world size are those of its name.
std::vector<FileFragment> read_file(const std::string& path, int rank, int world_size, FileHeader* h,
                                    std::vector<WeightPiece>* weights) {
  FileReader r(path);
  *h = read_header(r, rank, world_size);
  std::vector<FileFragment> out;
  for (int64_t i = 0; i < h->count; ++i) out.push_back(read_fragment(r, i));
  for (int64_t i = 0; i < h->weight_count; ++i) weights->push_back(read_weights(r, i));
  r.check_no_other_entries();
  return out;
}

// A writer's file: its name and the rank and world size the name says.
struct WriterFile {
  std::string path;
  int rank, world_size;
};

// Every writer's file of `prefix`: exactly ranks 0..N-1 of one N, or an error naming what is wrong
// (a missing rank, files of two world sizes, a rank outside 0..N-1, a name no writer gives).
std::vector<WriterFile> writer_files(const std::string& prefix) {
  const auto slash = prefix.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash == 0 ? 1 : slash);
  const std::string base = (slash == std::string::npos ? prefix : prefix.substr(slash + 1)) + ".rank-";
  DIR* d = opendir(dir.c_str());
  TORCH_CHECK(d, "load fragments: cannot open the directory ", dir, " of ", prefix);
  std::set<int> ranks;
  int world = -1;
  std::string error;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.compare(0, base.size(), base) != 0) continue;
    int r = -1, n = -1;
    char tail = 0;
    if (std::sscanf(name.c_str() + base.size(), "%d-of-%d%c", &r, &n, &tail) != 2) continue;
    const std::string path = dir + "/" + name;
    if (n < 1 || r < 0 || r >= n || name != base + std::to_string(r) + "-of-" + std::to_string(n))
      error = c10::str("load fragments: ", path, " is not a writer's file name (rank ", r, " of ", n,
                       "); remove or rename it");
    else if (world >= 0 && n != world)
      error = c10::str("load fragments: ", prefix, " has files of ", world, " and of ", n,
                       " writers; remove the stale ones");
    if (!error.empty()) break;
    world = n;
    ranks.insert(r);
  }
  closedir(d);
  TORCH_CHECK(error.empty(), error);
  TORCH_CHECK(world > 0, "load fragments: no fragment files ", prefix, ".rank-*-of-*");
  std::vector<WriterFile> files;
  for (int r = 0; r < world; ++r) {
    TORCH_CHECK(ranks.count(r), "load fragments: the file of rank ", r, " of ", world, " is missing: ",
                fragment_file(prefix, r, world));
    files.push_back({fragment_file(prefix, r, world), r, world});
  }
  return files;
}

// The whole state of one parameter from all fragments of it, checked for exact coverage and against
// what the optimizer would create for it (format, block size, slots), converted into that layout
// where the load asks to.
struct Whole {
  optim::ParamState state;
  bool present = false;
};

// What a load does with state saved in another layout than the optimizer's: convert it or refuse
// it, naming the call that converts (ShardedOptimizer::load's or load_fragments').
struct LoadRequest {
  bool convert;
  const char* convert_call;
};

// The layout fragment `f` was saved in.
optim::StateLayout saved_layout(const FileFragment& f) {
  optim::StateLayout l;
  l.format = static_cast<StateFormat>(f.meta.format);
  l.block_size = f.meta.block_size;
  l.slots = f.slots;
  return l;
}

// "Q8 in blocks of 256, slots Dyn8Signed, Dyn8Unsigned": a layout for errors.
std::string layout_name(const optim::StateLayout& l) {
  std::string slots;
  for (const kernels::SlotType& t : l.slots) slots += (slots.empty() ? "" : ", ") + kernels::slot_type_name(t);
  return c10::str(state_format_name(l.format), " in blocks of ", l.block_size, ", slots ", slots);
}

// Fragments of one parameter, sorted by offset: its whole numel, every element once, one step, and
// one layout (what the ranks of one job write of one parameter, whatever the optimizer's layout).
void check_coverage(const std::vector<FileFragment>& frags, const at::Tensor& p) {
  const FileFragment& first = frags[0];
  int64_t next = 0;
  for (const FileFragment& f : frags) {
    const std::string& where = f.where;
    TORCH_CHECK(f.meta.param_numel == p.numel(), where, ": the parameter has ", f.meta.param_numel,
                " elements in the checkpoint but ", p.numel(), " here");
    TORCH_CHECK(f.meta.offset >= next, where, ": elements ", f.meta.offset, "..",
                std::min(next, f.meta.offset + f.meta.numel), " are in two fragments (duplicated fragment)");
    TORCH_CHECK(f.meta.offset == next, where, ": elements ", next, "..", f.meta.offset,
                " are in no fragment (missing fragment)");
    TORCH_CHECK(f.meta.format == first.meta.format && f.meta.block_size == first.meta.block_size &&
                    f.slots == first.slots,
                where, " holds its state as ", layout_name(saved_layout(f)), " but ", first.name, " as ",
                layout_name(saved_layout(first)), " (fragments of two checkpoints?)");
    TORCH_CHECK(f.meta.step == first.meta.step, where, ": fragments at different steps (", f.meta.step, " and ",
                first.meta.step, ")");
    next = f.meta.offset + f.meta.numel;
  }
  TORCH_CHECK(next == p.numel(), frags.back().where, ": elements ", next, "..", p.numel(),
              " are in no fragment (missing fragment)");
}

// What no conversion bridges: which slots the rule uses with these options (amsgrad's, say), and a
// master-weight correction stored as master_weight_bits asks (it is loaded as stored, never requantized).
void check_slots(const FileFragment& f, const optim::StateLayout& want) {
  TORCH_CHECK(f.slots.size() == want.slots.size(), f.where, " has ", f.slots.size(),
              " state slots but this optimizer has ", want.slots.size());
  using S = kernels::SlotStorage;
  for (size_t k = 0; k < want.slots.size(); ++k) {
    const kernels::SlotType have = f.slots[k], need = want.slots[k];
    const bool correction = kernels::is_correction(have.storage) || kernels::is_correction(need.storage);
    TORCH_CHECK((have.storage == S::None) == (need.storage == S::None) && (!correction || have == need), f.where,
                ": state slot ", k, " is stored as ", kernels::slot_type_name(have), " but this optimizer stores it as ",
                kernels::slot_type_name(need), correction ? " (master_weight_bits)" : "");
  }
}

// Whether the parameter's state, saved as `first` says, must be converted into `want`: refused,
// saying how to convert, unless the load asks to.
bool needs_conversion(const FileFragment& first, const optim::StateLayout& want, const LoadRequest& request) {
  const std::string difference = optim::layout_difference(saved_layout(first), want);
  if (difference.empty()) return false;
  TORCH_CHECK(request.convert, first.where, ": ", difference, ". To convert it on purpose, load with ",
              request.convert_call, " (the state is expanded to fp32 and requantized into this optimizer's layout), "
              "or configure this optimizer as the checkpoint's (state_format, override_state_format, "
              "min_quant_numel, block_size, fp8_second_moment)");
  return true;
}

// The checked fragments of `p` concatenated slot by slot in the layout they were saved in (every
// fragment but the last is a whole number of blocks: read_meta checked that each starts on a block
// boundary, check_coverage that all have one block size).
optim::ParamState join_fragments(const std::vector<FileFragment>& frags, const at::Tensor& p) {
  const optim::StateLayout saved = saved_layout(frags[0]);
  optim::ParamState st;
  st.format = saved.format;
  st.block_size = saved.block_size;
  st.counters = at::tensor(std::vector<int64_t>{frags[0].meta.step, 0}).to(p.device());
  st.slots.resize(saved.slots.size());
  size_t t = 0;
  for (size_t k = 0; k < saved.slots.size(); ++k) {
    optim::StateSlot& s = st.slots[k];
    s.type = saved.slots[k];
    const int per = tensors_of(s.type.storage);
    std::vector<at::Tensor> a, b;
    for (const FileFragment& f : frags) {
      if (per >= 1) a.push_back(f.tensors.at(t));
      if (per == 2) b.push_back(f.tensors.at(t + 1));
    }
    if (per == 1) s.dense = at::cat(a).to(p.device());
    if (per == 2)
      s.quantized = QTensor(at::cat(a).to(p.device()), at::cat(b).to(p.device()), {p.numel()}, s.type.format,
                            st.block_size);
    t += per;
  }
  return st;
}

// The whole parameter's saved state in this optimizer's layout: each moment expanded to fp32 and
// quantized again by make_state, as LowbitOptimizer::converted_state does for an unsharded load, so a
// converting sharded load equals load_checkpoint's conversion sliced (blocks are global to the
// parameter). The step count and the master-weight correction (independent of the moments' format)
// as stored.
optim::ParamState converted_state(const optim::LowbitOptimizer& o, size_t group, const at::Tensor& p,
                                  const optim::ParamState& saved) {
  std::vector<at::Tensor> values;
  for (size_t k = 0; k < saved.slots.size() && k < size_t(kernels::kMomentSlots); ++k)
    values.push_back(saved.slots[k].to_float());
  optim::ParamState st = FragmentAccess::make_state(o, group, p, p.numel(), values);
  st.counters = saved.counters;
  const size_t c = kernels::kCorrectionSlot;
  if (st.slots.size() > c && kernels::is_correction(st.slots[c].type.storage)) st.slots[c] = saved.slots[c];
  return st;
}

// Every writer's file read and checked whole, then every parameter's fragments against the
// optimizer: throws before anything is changed.
using ParamKey = std::pair<int64_t, int64_t>;  // (group, index)

// Every parameter of `o` whole from the writers' weight pieces: each element exactly once, the
// parameter's dtype and size; a piece of a parameter `o` does not have is refused.
// weight_dtypes: the dtype each parameter's weights are kept in where it is not the parameter's own
// (a fully sharded model's float32 shards that compute in bfloat16); null: the parameters' dtypes.
std::map<ParamKey, at::Tensor> join_weights(const optim::LowbitOptimizer& o, std::vector<WeightPiece> pieces,
                                            const std::string& files,
                                            const std::map<ParamKey, at::ScalarType>* weight_dtypes) {
  std::map<ParamKey, std::vector<WeightPiece>> by_param;
  for (WeightPiece& w : pieces) by_param[{w.group, w.index}].push_back(std::move(w));
  const auto& groups = o.param_groups();
  std::map<ParamKey, at::Tensor> out;
  for (auto& [key, ws] : by_param)
    TORCH_CHECK(key.first < static_cast<int64_t>(groups.size()) &&
                    key.second < static_cast<int64_t>(groups[key.first].params().size()),
                ws[0].where, ": this optimizer has no parameter ", key.second, " in group ", key.first);
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t i = 0; i < groups[gi].params().size(); ++i) {
      const at::Tensor& p = groups[gi].params()[i];
      auto it = by_param.find({static_cast<int64_t>(gi), static_cast<int64_t>(i)});
      TORCH_CHECK(it != by_param.end(), "load fragments: ", files, ": the files hold weights (version ", kVersionWeights,
                  ") but none of parameter ", i, " of group ", gi);
      std::vector<WeightPiece>& ws = it->second;
      std::sort(ws.begin(), ws.end(), [](const WeightPiece& a, const WeightPiece& b) { return a.offset < b.offset; });
      int64_t next = 0;
      std::vector<at::Tensor> parts;
      for (const WeightPiece& w : ws) {
        TORCH_CHECK(w.param_numel == p.numel(), w.where, ": the parameter has ", w.param_numel,
                    " elements in the checkpoint but ", p.numel(), " here");
        const at::ScalarType kept = weight_dtypes ? weight_dtypes->at(it->first) : p.scalar_type();
        TORCH_CHECK(w.values.scalar_type() == kept, w.where, ": the weights are ", w.values.scalar_type(),
                    ", the parameter ", kept);
        TORCH_CHECK(w.offset >= next, w.where, ": elements ", w.offset, "..", std::min(next, w.offset + w.numel),
                    " are in two weight pieces (duplicated piece)");
        TORCH_CHECK(w.offset == next, w.where, ": elements ", next, "..", w.offset,
                    " are in no weight piece (missing piece)");
        parts.push_back(w.values);
        next = w.offset + w.numel;
      }
      TORCH_CHECK(next == p.numel(), ws.back().where, ": elements ", next, "..", p.numel(),
                  " are in no weight piece (missing piece)");
      out[it->first] = at::cat(parts).view(p.sizes());
    }
  return out;
}

std::map<std::pair<int64_t, int64_t>, Whole> assemble(const optim::LowbitOptimizer& o, const std::string& prefix,
                                                      const LoadRequest& request, uint64_t* seed, int64_t* skipped,
                                                      std::map<ParamKey, at::Tensor>* weights,
                                                      const std::map<ParamKey, at::ScalarType>* weight_dtypes = nullptr) {
  std::map<std::pair<int64_t, int64_t>, std::vector<FileFragment>> by_param;
  std::vector<WeightPiece> pieces;
  int64_t with_weights = 0, files = 0;
  for (const WriterFile& file : writer_files(prefix)) {
    FileHeader h;
    for (FileFragment& f : read_file(file.path, file.rank, file.world_size, &h, &pieces))
      by_param[{f.meta.group, f.meta.index}].push_back(std::move(f));
    with_weights += h.version >= kVersionWeights;
    ++files;
    if (file.rank == 0) {
      *seed = static_cast<uint64_t>(h.seed);
      *skipped = h.skipped;
    }
    // Both are the job's, not a rank's: every writer saved the same.
    TORCH_CHECK(static_cast<uint64_t>(h.seed) == *seed, "load fragments: ", file.path,
                " has another stochastic-rounding seed (", h.seed, ") than rank 0's file (", *seed, ")");
    TORCH_CHECK(h.skipped == *skipped, "load fragments: ", file.path, " counts ", h.skipped,
                " skipped steps, rank 0's file ", *skipped);
  }
  TORCH_CHECK(with_weights == 0 || with_weights == files, "load fragments: ", prefix, ": ", with_weights, " of ", files,
              " files hold weights (version ", kVersionWeights, "); the files of one save all do or none");
  const auto& groups = o.param_groups();
  std::map<std::pair<int64_t, int64_t>, Whole> out;
  for (auto& kv : by_param) {
    const int64_t gi = kv.first.first, i = kv.first.second;
    auto& frags = kv.second;
    TORCH_CHECK(gi < static_cast<int64_t>(groups.size()) && i < static_cast<int64_t>(groups[gi].params().size()),
                frags[0].where, ": this optimizer has no parameter ", i, " in group ", gi);
    const at::Tensor& p = groups[gi].params()[i];
    const optim::StateLayout want = FragmentAccess::layout(o, static_cast<size_t>(gi), p);
    std::sort(frags.begin(), frags.end(),
              [](const FileFragment& a, const FileFragment& b) { return a.meta.offset < b.meta.offset; });
    check_coverage(frags, p);
    check_slots(frags[0], want);
    const bool convert = needs_conversion(frags[0], want, request);
    Whole w;
    w.present = true;
    w.state = join_fragments(frags, p);
    if (convert) w.state = converted_state(o, static_cast<size_t>(gi), p, w.state);
    out[kv.first] = std::move(w);
  }
  // After the state: its errors come first.
  if (with_weights)
    *weights = join_weights(o, std::move(pieces),
                            files == 1 ? fragment_file(prefix, 0, 1) : c10::str(prefix, ".rank-*-of-", files),
                            weight_dtypes);
  return out;
}

// Elements [begin, begin + len) of a whole state as a fresh state of its own.
optim::ParamState slice_state(const optim::ParamState& whole, int64_t begin, int64_t len) {
  optim::ParamState st;
  st.format = whole.format;
  st.block_size = whole.block_size;
  st.counters = whole.counters.clone();
  st.slots.resize(whole.slots.size());
  for (size_t k = 0; k < whole.slots.size(); ++k) {
    const optim::StateSlot& w = whole.slots[k];
    optim::StateSlot& s = st.slots[k];
    s.type = w.type;
    if (w.type.storage == kernels::SlotStorage::Quant) {
      std::vector<at::Tensor> ts;
      optim::ParamState one;
      one.block_size = whole.block_size;
      one.slots = {w};
      append_state_range(one, begin, len, ts);
      s.quantized = QTensor(ts[0].clone(), ts[1].clone(), {len}, w.type.format, whole.block_size);
    } else if (w.type.storage != kernels::SlotStorage::None) {
      s.dense = w.dense.narrow(0, begin, len).clone();
    }
  }
  return st;
}

}  // namespace

std::string fragment_file(const std::string& prefix, int rank, int world_size) {
  return prefix + ".rank-" + std::to_string(rank) + "-of-" + std::to_string(world_size);
}

void save_fragments(const optim::LowbitOptimizer& o, const std::string& prefix) {
  std::vector<Fragment> frags;
  std::vector<WeightPiece> weights;
  const auto& groups = o.param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t i = 0; i < groups[gi].params().size(); ++i) {
      const at::Tensor& p = groups[gi].params()[i];
      weights.push_back({static_cast<int64_t>(gi), static_cast<int64_t>(i), 0, p.numel(), p.numel(), p.detach(), ""});
      const optim::ParamState* st = o.state_of(p);
      if (!st) continue;
      Fragment f;
      f.group = gi;
      f.index = i;
      f.offset = 0;
      f.numel = f.param_numel = p.numel();
      f.state = *st;
      frags.push_back(std::move(f));
    }
  std::vector<const Fragment*> ptrs;
  for (const Fragment& f : frags) ptrs.push_back(&f);
  write_file(fragment_file(prefix, 0, 1), 0, 1, FragmentAccess::seed(o), o.skipped_steps(), ptrs, weights);
}

void load_fragments(optim::LowbitOptimizer& o, const std::string& prefix, const optim::LoadOptions& options) {
  uint64_t seed = 0;
  int64_t skipped = 0;
  const LoadRequest request{options.convert_state_format(),
                            "lowbit::distributed::load_fragments(optimizer, prefix, "
                            "LoadOptions().convert_state_format(true))"};
  std::map<ParamKey, at::Tensor> weights;
  auto wholes = assemble(o, prefix, request, &seed, &skipped, &weights);  // throws before anything is changed
  // The checkpoint's state replaces the whole state: a parameter it has no state for has none after
  // (as LowbitOptimizer::load does), not the state it had before.
  const auto& groups = o.param_groups();
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t i = 0; i < groups[gi].params().size(); ++i) {
      auto it = wholes.find({static_cast<int64_t>(gi), static_cast<int64_t>(i)});
      if (it == wholes.end())
        FragmentAccess::clear_state(o, groups[gi].params()[i]);
      else
        FragmentAccess::set_state(o, groups[gi].params()[i], std::move(it->second.state));
    }
  FragmentAccess::set_seed(o, seed);
  FragmentAccess::set_skipped(o, skipped);
  torch::NoGradGuard no_grad;
  for (const auto& [key, w] : weights) groups[key.first].params()[key.second].copy_(w);
}

void ShardedOptimizer::save(const std::string& prefix) const {
  std::vector<const Fragment*> ptrs;
  std::vector<WeightPiece> weights;
  for (size_t fi = 0; fi < fragments_.size(); ++fi) {
    const Fragment& f = fragments_[fi];
    if (f.state.counters.defined()) ptrs.push_back(&f);
    weights.push_back({static_cast<int64_t>(f.group), static_cast<int64_t>(f.index), f.offset, f.numel,
                       f.param_numel, fragment_params_[fi], ""});
  }
  write_file(fragment_file(prefix, comm_->rank(), comm_->size()), comm_->rank(), comm_->size(),
             FragmentAccess::seed(*optimizer_), skipped_steps(), ptrs, weights);
  comm_->barrier();  // every file is written when save returns on any rank
}

void ShardedOptimizer::load(const std::string& prefix, const optim::LoadOptions& options) {
  uint64_t seed = 0;
  int64_t skipped = 0;
  const LoadRequest request{options.convert_state_format(),
                            "lowbit::distributed::ShardedOptimizer::load(prefix, LoadOptions().convert_state_format(true))"};
  // Every rank checks the files whole before any rank changes anything: one all_reduce of failures.
  std::map<std::pair<int64_t, int64_t>, Whole> wholes;
  std::map<ParamKey, at::Tensor> weights;
  std::string error;
  try {
    std::map<ParamKey, at::ScalarType> kept;  // the shards' dtypes (mixed precision: not the parameters')
    for (const Param& pr : params_)
      kept[{static_cast<int64_t>(pr.group), static_cast<int64_t>(pr.index)}] = buckets_[pr.bucket].dtype;
    wholes = assemble(*optimizer_, prefix, request, &seed, &skipped, &weights, &kept);
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  at::Tensor failed = at::full({1}, error.empty() ? 0 : 1, at::TensorOptions().dtype(at::kInt).device(device_));
  comm_->all_reduce(failed, ReduceOp::Sum);
  const int64_t failures = failed.cpu().item<int64_t>();
  TORCH_CHECK(error.empty(), error, " (rank ", comm_->rank(), "; nothing was loaded)");
  TORCH_CHECK(failures == 0, "ShardedOptimizer::load: ", failures, " other rank(s) could not load ", prefix,
              "; nothing was loaded");
  for (Fragment& f : fragments_) {
    auto it = wholes.find({static_cast<int64_t>(f.group), static_cast<int64_t>(f.index)});
    f.state = it == wholes.end() ? optim::ParamState{} : slice_state(it->second.state, f.offset, f.numel);
  }
  FragmentAccess::set_seed(*optimizer_, seed);
  skipped_ = at::Tensor();
  skipped_loaded_ = skipped;
  // The weights: each rank's own pieces (fully sharded: the shards), and without full sharding the
  // whole parameters (every rank read every file), so the replicas agree without a collective.
  torch::NoGradGuard no_grad;
  for (size_t fi = 0; fi < fragments_.size(); ++fi) {
    const Fragment& f = fragments_[fi];
    auto it = weights.find({static_cast<int64_t>(f.group), static_cast<int64_t>(f.index)});
    if (it != weights.end())
      fragment_params_[fi].copy_(it->second.reshape({-1}).narrow(0, f.offset, f.numel), /*non_blocking=*/false);
  }
  if (!fully_sharded())
    for (const Param& pr : params_) {
      auto it = weights.find({static_cast<int64_t>(pr.group), static_cast<int64_t>(pr.index)});
      if (it != weights.end()) pr.param.copy_(it->second);
    }
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (fully_sharded()) release(b);  // gathered again, from the loaded shards, when next used
  // The low-bit wire's residuals are not in checkpoints (ShardedOptions::update_wire): they start
  // again from zero, as after construction.
  for (Bucket& b : buckets_)
    for (at::Tensor* r : {&b.grad_residual, &b.update_residual})
      if (r->defined()) r->zero_();
}

}  // namespace distributed
}  // namespace lowbit
