// read_checkpoint, check_checkpoint_file and the version-2 digests (checkpoint_reader.h).
#include "checkpoint_reader.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "../tensors/qtensor.h"
#include "../tensors/quant_format.h"

#include "checkpoint_zip.h"
#include "state_format.h"

namespace lowbit {
namespace optim {

// ---------------------------------------------------------------------------------------------
// Digests
// ---------------------------------------------------------------------------------------------

namespace {

constexpr uint64_t kDigestSeed = 0xcbf29ce484222325ull;  // FNV-1a's offset basis
constexpr uint64_t kDigestPrime = 0x100000001b3ull;     // FNV-1a's 64-bit prime (odd: a bijection)

inline uint64_t digest_mix(uint64_t h, uint64_t w) { return (h ^ w) * kDigestPrime; }

// FNV-1a style over 8-byte little-endian words (then the tail bytes, then the length), finished
// by a 64-bit avalanche. Each step h = (h ^ w) * P is a bijection of h for a fixed word w and of
// w for a fixed h, so any change confined to one 8-byte word (every single bit flip) always
// changes the digest. `seed` chains digests: digest_bytes(b, n, digest_bytes(a, m)).
uint64_t digest_bytes(const void* data, size_t n, uint64_t seed = kDigestSeed) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);  // unaligned-safe; checkpoints are written and read little-endian
    h = digest_mix(h, w);
  }
  for (; i < n; ++i) h = digest_mix(h, p[i]);
  h = digest_mix(h, static_cast<uint64_t>(n));
  // Avalanche (the finalizer of MurmurHash3's fmix64) so that nearby inputs spread over all bits.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

int64_t digest_as_int(uint64_t h) {
  int64_t out;
  std::memcpy(&out, &h, sizeof out);
  return out;
}

}  // namespace

int64_t tensor_digest(const std::string& key, const at::Tensor& t) {
  const at::Tensor c = t.detach().cpu().contiguous();
  const int64_t dtype = static_cast<int64_t>(c.scalar_type());
  uint64_t h = digest_bytes(key.data(), key.size());
  h = digest_bytes(&dtype, sizeof dtype, h);
  h = digest_bytes(c.sizes().data(), c.sizes().size() * sizeof(int64_t), h);
  return digest_as_int(digest_bytes(c.data_ptr(), c.nbytes(), h));
}

int64_t header_digest(const std::map<std::string, c10::IValue>& entries) {
  uint64_t h = kDigestSeed;
  // Each value after a one-byte tag of its type.
  const auto tagged = [&h](char tag, const void* data, size_t n) {
    h = digest_bytes(&tag, 1, h);
    h = digest_bytes(data, n, h);
  };
  for (const auto& [key, v] : entries) {
    h = digest_bytes(key.data(), key.size(), h);
    if (v.isInt()) {
      const int64_t x = v.toInt();
      tagged('i', &x, sizeof x);
    } else if (v.isDouble()) {
      const double x = v.toDouble();
      tagged('d', &x, sizeof x);
    } else {
      TORCH_CHECK(v.isString(), "lowbit checkpoint: entry '", key, "' has an unexpected type ", v.tagKind());
      const std::string& s = v.toStringRef();
      tagged('s', s.data(), s.size());
    }
  }
  return digest_as_int(h);
}

// ---------------------------------------------------------------------------------------------
// Tensor extents
// ---------------------------------------------------------------------------------------------

namespace {

// The bytes of its storage that `t` reaches: (offset + sum of (size - 1) * stride + 1) * itemsize,
// 0 without elements; -1 if a size, stride or the offset is negative or the sum overflows.
int64_t extent_bytes(const at::Tensor& t) {
  const int64_t offset = t.storage_offset();
  if (offset < 0) return -1;
  int64_t last = offset;  // the last element's index in the storage
  bool empty = false;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.sizes()[d], stride = t.strides()[d];
    if (size < 0 || stride < 0) return -1;
    if (size == 0) empty = true;
    int64_t reach = 0;
    if (size > 0 && (__builtin_mul_overflow(size - 1, stride, &reach) || __builtin_add_overflow(last, reach, &last)))
      return -1;
  }
  if (empty) return 0;
  int64_t bytes = 0;
  if (__builtin_add_overflow(last, int64_t(1), &last) || __builtin_mul_overflow(last, t.element_size(), &bytes))
    return -1;
  return bytes;
}

}  // namespace

void check_tensor_extent(const std::string& who, const std::string& key, const at::Tensor& t) {
  TORCH_CHECK(t.layout() == at::kStrided, who, ": checkpoint tensor '", key, "' has layout ", t.layout(),
              "; checkpoints hold strided tensors only");
  const int64_t need = extent_bytes(t);
  TORCH_CHECK(need >= 0, who, ": checkpoint tensor '", key, "' has a negative or overflowing size, stride or storage ",
              "offset (sizes ", t.sizes(), ", strides ", t.strides(), ", storage offset ", t.storage_offset(), ")");
  const int64_t have = static_cast<int64_t>(t.storage().nbytes());
  TORCH_CHECK(need <= have, who, ": checkpoint tensor '", key, "' needs ", need, " bytes (sizes ", t.sizes(),
              ", strides ", t.strides(), ", storage offset ", t.storage_offset(), ") but its storage holds ", have,
              " bytes");
}

// ---------------------------------------------------------------------------------------------
// The file
// ---------------------------------------------------------------------------------------------

namespace {

// The layout libtorch's reader (torch::jit::load) takes for granted: every record looked up
// under the folder of the first one; its version, constants.pkl and data.pkl there. A torch.save
// file from Python is a zip archive too, of pickled Python objects without constants.pkl, and
// libtorch's error for it ("failed locating file constants.pkl ... internal miniz error") says
// nothing of what it is. And tensors' records stored as they are written, never deflated: miniz
// reads a stored record straight into the buffer a storage keeps, which is how
// load_checkpoint_archive knows each storage's bytes (RecordReads).
void check_archive_layout(const std::string& path, const std::vector<ZipRecord>& records) {
  const std::string& first = records.at(0).name;
  const size_t slash = first.find('/');
  TORCH_CHECK(slash != std::string::npos && slash > 0, "lowbit checkpoint: '", path,
              "' is a zip archive, but not one torch::save writes: its first record '", first, "' is in no folder");
  const std::string folder = first.substr(0, slash + 1);
  std::set<std::string> names;
  for (const ZipRecord& r : records) names.insert(r.name);
  for (const char* entry : {"version", "constants.pkl", "data.pkl"})
    TORCH_CHECK(names.count(folder + entry), "lowbit checkpoint: '", path,
                "' is a zip archive without a checkpoint's entries (no '", folder, entry,
                "'): a torch.save file from Python? lowbit reads the checkpoints LowbitOptimizer::save "
                "(torch::save) and ShardedOptimizer::save write");
  const std::string data = ascii_lower(folder) + "data/";  // miniz looks names up regardless of case
  for (const ZipRecord& r : records)
    TORCH_CHECK(!r.deflated || ascii_lower(r.name).compare(0, data.size(), data) != 0, "lowbit checkpoint: '", path,
                "' is damaged: tensor record '", r.name, "' is deflated; libtorch stores tensors' records as they are");
}

// What libtorch would run or read while it loads an archive, before any check of ours could see
// a tensor: a TorchScript class's __setstate__ (run on the unpickled state), a custom class's
// (torch.classes: C++ code on its state), and the pickle's quantized and sparse tensors (per-channel
// scales are converted while unpickling, reading every byte their storage claims). lowbit's
// writers write none of them. The jit unpickler resolves a class only from a GLOBAL opcode, whose
// names are plain text in the pickle, and a method only by its name in the code: each is refused
// by its name in the records' bytes.
void check_archive_code(const std::string& path, const ArchiveFile& file, const std::vector<ZipRecord>& records) {
  const auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const ZipRecord& r : records) {
    const bool pickle = ends_with(r.name, ".pkl"), code = ends_with(r.name, ".py");
    if (!pickle && !code) continue;
    std::string bytes;
    const std::string error = read_zip_record(file, r, &bytes);
    TORCH_CHECK(error.empty(), "lowbit checkpoint: '", path, "' is damaged: ", error);
    const std::vector<std::string> names = code ? std::vector<std::string>{"__setstate__"}
                                                : std::vector<std::string>{"_rebuild_qtensor", "_rebuild_sparse_tensor",
                                                                           "torch.classes"};
    for (const std::string& name : names)
      TORCH_CHECK(bytes.find(name) == std::string::npos, "lowbit checkpoint: '", path, "' is not a checkpoint lowbit ",
                  "writes: record '", r.name, "' names ", name, ", which libtorch would run or read while loading");
  }
}

// Which record libtorch's reader read into which buffer. PyTorchStreamReader::getRecord allocates
// a buffer of the size the central directory gives a record and miniz reads a stored record
// straight into it, through the read function given to InputArchive::load_from; the unpickler then
// makes a storage of that buffer with the size the pickle claims (numel * itemsize), unchecked.
// A storage claiming more than its record holds reaches past its buffer.
class RecordReads {
 public:
  explicit RecordReads(const std::vector<ZipRecord>& records) {
    for (const ZipRecord& r : records)
      if (!r.deflated && r.size > 0) stored_[r.data_offset] = r.size;
  }

  size_t read(const ArchiveFile& file, uint64_t pos, void* buf, size_t n) {
    const size_t got = file.read_some(pos, buf, n);
    const auto it = stored_.find(pos);
    if (got == n && it != stored_.end() && it->second == n) buffers_[buf] = n;
    return got;
  }

  // The bytes of the record read whole into the buffer at `p`, or -1 if none was.
  int64_t record_bytes(const void* p) const {
    const auto it = buffers_.find(p);
    return it == buffers_.end() ? -1 : static_cast<int64_t>(it->second);
  }

 private:
  std::map<uint64_t, uint64_t> stored_;                   // data offset -> bytes, of stored records
  std::unordered_map<const void*, uint64_t> buffers_;     // buffer -> bytes of the record read into it
};

// Calls f(key, tensor) for every tensor `a` holds, at any depth (libtorch's optimizer checkpoints
// nest archives): keys are paths ("state/0/exp_avg"). Iterative, so that deep nesting in a pickle
// cannot exhaust the stack.
void for_each_tensor(torch::serialize::InputArchive& a,
                     const std::function<void(const std::string&, const at::Tensor&)>& f) {
  std::vector<std::pair<c10::IValue, std::string>> todo;
  for (const std::string& key : a.keys()) {
    c10::IValue v;
    if (a.try_read(key, v)) todo.emplace_back(std::move(v), key);
  }
  std::unordered_set<const void*> seen;  // each container once (a pickle may share or nest them)
  while (!todo.empty()) {
    const auto [v, key] = std::move(todo.back());
    todo.pop_back();
    if (v.isTensor()) {
      f(key, v.toTensor());
      continue;
    }
    if (!v.isPtrType() || !seen.insert(v.internalToPointer()).second) continue;
    if (v.isObject()) {
      const auto obj = v.toObject();
      const auto type = obj->type();
      for (size_t i = 0; i < obj->slots().size(); ++i)
        todo.emplace_back(obj->getSlot(i), key + "/" + (i < type->numAttributes() ? type->getAttributeName(i)
                                                                                   : std::to_string(i)));
    } else if (v.isTuple()) {
      const auto& elements = v.toTupleRef().elements();
      for (size_t i = 0; i < elements.size(); ++i) todo.emplace_back(elements[i], key + "/" + std::to_string(i));
    } else if (v.isList()) {
      const auto elements = v.toListRef();
      for (size_t i = 0; i < elements.size(); ++i) todo.emplace_back(elements[i], key + "/" + std::to_string(i));
    } else if (v.isGenericDict()) {
      size_t i = 0;
      for (const auto& e : v.toGenericDict()) {
        const std::string k = key + "/" + std::to_string(i++);
        todo.emplace_back(e.key(), k + " (key)");
        todo.emplace_back(e.value(), k);
      }
    }
  }
}

// Every tensor of `a` inside its storage (check_tensor_extent), and its storage inside the record
// libtorch read it from: a pickle claiming more than its record holds (a truncated record, an
// edited size) is refused here, before anything reads a tensor's bytes.
void check_archive_tensors(const std::string& who, torch::serialize::InputArchive& a, const RecordReads& reads) {
  for_each_tensor(a, [&](const std::string& key, const at::Tensor& t) {
    check_tensor_extent(who, key, t);
    const int64_t claim = static_cast<int64_t>(t.storage().nbytes());
    if (claim == 0) return;
    const void* bytes = t.storage().data();
    const int64_t have = bytes ? reads.record_bytes(bytes) : 0;  // no buffer: an empty record
    TORCH_CHECK(have >= 0, who, ": checkpoint tensor '", key, "' needs ", claim,
                " bytes, but its storage was not read from a record of the file");
    TORCH_CHECK(claim <= have, who, ": checkpoint tensor '", key, "' needs ", claim,
                " bytes, but its record in the file holds ", have,
                " bytes (data.pkl claims more than the record has: a truncated record or an edited size)");
  });
}

// `file` (opened from `path`) checked as check_checkpoint_file says; returns its records.
std::vector<ZipRecord> open_checked(const std::string& path, const ArchiveFile& file) {
  TORCH_CHECK(file.error().empty(), "lowbit checkpoint: ", file.error());
  std::vector<ZipRecord> records;
  // Our own reading of the zip structure and every record's CRC-32 (checkpoint_zip.h): libtorch's
  // reader checks neither, and its parsers must only ever see the bytes a writer wrote.
  const std::string error = check_zip_archive(file, &records);
  TORCH_CHECK(error.empty(), "lowbit checkpoint: '", path, "' is damaged: ", error);
  check_archive_layout(path, records);
  check_archive_code(path, file, records);
  return records;
}

}  // namespace

void check_checkpoint_file(const std::string& path) {
  const ArchiveFile file(path);
  open_checked(path, file);
}

void load_checkpoint_archive(const std::string& path, torch::serialize::InputArchive& archive) {
  // Shared with the read function: libtorch need not drop its reader before load_from returns.
  const auto file = std::make_shared<const ArchiveFile>(path);
  const auto reads = std::make_shared<RecordReads>(open_checked(path, *file));
  try {
    // On the cpu, whatever device the pickle names: the unpickler copies a storage to the device it
    // names while loading (reading all the bytes it claims), before any check of ours could run.
    archive.load_from([file, reads](uint64_t pos, void* buf, size_t n) { return reads->read(*file, pos, buf, n); },
                      [file] { return static_cast<size_t>(file->size()); }, c10::Device(c10::kCPU));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "lowbit checkpoint: '", path, "' is damaged: libtorch cannot read it (",
                e.what_without_backtrace(), ")");
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "lowbit checkpoint: '", path, "' is damaged: libtorch cannot read it (", e.what(), ")");
  }
  check_archive_tensors("lowbit checkpoint: '" + path + "'", archive, *reads);
}

// ---------------------------------------------------------------------------------------------
// Checks of stored state, shared with the fragment reader (distributed/sharded_checkpoint.cpp)
// ---------------------------------------------------------------------------------------------

void check_stored_tensor(const std::string& who, const std::string& key, const at::Tensor& t, at::ScalarType dtype) {
  TORCH_CHECK(t.defined(), who, ": checkpoint tensor '", key, "' is undefined");
  check_tensor_extent(who, key, t);  // first: the checks below and the digest read the tensor's bytes
  TORCH_CHECK(t.scalar_type() == dtype, who, ": checkpoint tensor '", key, "' has dtype ", t.scalar_type(),
              ", expected ", dtype);
  TORCH_CHECK(t.device().is_cpu(), who, ": checkpoint tensor '", key, "' is on ", t.device(), ", expected cpu");
  // State is written flat; another shape of the same numel is not what any writer produced.
  TORCH_CHECK(t.dim() == 1, who, ": checkpoint tensor '", key, "' has shape ", t.sizes(), ", expected 1-D");
}

void check_tensor_digest(const std::string& who, const std::string& key, const at::Tensor& t, int64_t recorded) {
  const int64_t got = tensor_digest(key, t);
  TORCH_CHECK(got == recorded, who, ": checkpoint tensor '", key, "' is corrupt: its digest is ", got,
              ", the checkpoint recorded ", recorded);
}

void check_quant_block_size(const std::string& who, const std::string& key, QuantFormat format, int64_t block_size) {
  // resolve_block_size's own error says which sizes the format takes; the entry is named here.
  int64_t resolved = -1;
  std::string why;
  try {
    resolved = resolve_block_size(format, block_size, "block size");
  } catch (const c10::Error& e) {
    why = e.what_without_backtrace();
  }
  TORCH_CHECK(block_size >= 1 && resolved == block_size, who, ": checkpoint entry '", key, "' is ", block_size,
              ", not a block size of ", format_name(format), why.empty() ? "" : " (" + why + ")");
}

void check_block_scales(const std::string& who, const std::string& key, const at::Tensor& absmax) {
  TORCH_CHECK(absmax.numel() == 0 || (absmax.isfinite().all().item<bool>() && absmax.min().item<float>() >= 0), who,
              ": checkpoint tensor '", key, "' holds a negative or non-finite block scale");
}

// Codes no writer produces: those whose codebook value is not finite (float8's Inf and NaN patterns;
// the encoders saturate). A checkpoint holding one is refused before anything is assigned: for
// example an FP8 second moment relabelled from E4M3 to E5M2 (its other allowed format), where
// E4M3's largest codes 0x7C-0x7E, the ones every block's absmax encodes to, are Inf and NaN.
void check_codes_finite(const std::string& who, const std::string& key, const at::Tensor& codes, QuantFormat format) {
  const at::Tensor cb = codebook(format).to(at::kFloat).cpu().contiguous();
  std::vector<uint8_t> bad;
  for (int64_t c = 0; c < cb.numel(); ++c)
    if (!std::isfinite(cb.data_ptr<float>()[c])) bad.push_back(static_cast<uint8_t>(c));
  if (bad.empty()) return;
  TORCH_CHECK(cb.numel() == 256, who, ": format ", format_name(format), " has non-finite codes in a packed codebook");
  const at::Tensor bad_codes = at::tensor(at::ArrayRef<uint8_t>(bad)).to(codes.device());
  const at::Tensor flat = codes.reshape(-1);
  constexpr int64_t kChunk = int64_t(1) << 24;  // bounds the temporaries on large slots
  for (int64_t i = 0; i < flat.numel(); i += kChunk) {
    const at::Tensor hit = at::isin(flat.narrow(0, i, std::min(kChunk, flat.numel() - i)), bad_codes);
    if (!hit.any().item<bool>()) continue;
    const int64_t at_index = i + hit.nonzero()[0][0].item<int64_t>();
    TORCH_CHECK(false, who, ": checkpoint tensor '", key, "' holds code ", int(flat[at_index].item<uint8_t>()),
                " at element ", at_index, ", which is not a finite value of format ", format_name(format));
  }
}

// ---------------------------------------------------------------------------------------------
// The entries
// ---------------------------------------------------------------------------------------------

namespace {

class Reader {
 public:
  Reader(torch::serialize::InputArchive& a, std::string who) : a_(a), who_(std::move(who)) {}

  int64_t version = 0;

  int64_t get_int(const std::string& key) { return get(key, &c10::IValue::isInt, "an integer").toInt(); }
  int64_t get_int(const std::string& key, int64_t lo, int64_t hi) {
    const int64_t x = get_int(key);
    TORCH_CHECK(x >= lo && x <= hi, who_, ": checkpoint entry '", key, "' is ", x, ", expected ", lo, "..", hi);
    return x;
  }
  double get_double(const std::string& key) { return get(key, &c10::IValue::isDouble, "a number").toDouble(); }
  std::string get_string(const std::string& key) { return get(key, &c10::IValue::isString, "a string").toStringRef(); }
  // A tensor of `dtype`; version 2 also checks its digest.
  at::Tensor get_tensor(const std::string& key, at::ScalarType dtype) {
    at::Tensor t;
    TORCH_CHECK(a_.try_read(key, t), who_, ": checkpoint tensor '", key, "' is missing");
    check_stored_tensor(who_, key, t, dtype);
    if (version >= kCheckpointVersionDigests) check_tensor_digest(who_, key, t, get_int(key + "/digest"));
    return t;
  }

  // Version 2: the header digest over every non-tensor entry.
  void check_header_digest() {
    std::map<std::string, c10::IValue> entries;
    for (const std::string& key : a_.keys()) {
      if (key == "lowbit/header_digest") continue;
      c10::IValue v;
      TORCH_CHECK(a_.try_read(key, v), who_, ": checkpoint entry '", key, "' cannot be read");
      if (v.isTensor()) continue;  // covered by its own digest, an integer entry
      entries.emplace(key, v);
    }
    const int64_t want = get_int("lowbit/header_digest");
    const int64_t got = header_digest(entries);
    TORCH_CHECK(got == want, who_, ": checkpoint header is corrupt: its digest is ", got,
                ", the checkpoint recorded ", want);
  }

  const std::string& who() const { return who_; }

 private:
  // The entry `key`, which must be `what` (is_kind).
  c10::IValue get(const std::string& key, bool (c10::IValue::*is_kind)() const, const char* what) {
    c10::IValue v;
    TORCH_CHECK(a_.try_read(key, v), who_, ": checkpoint entry '", key, "' is missing");
    TORCH_CHECK((v.*is_kind)(), who_, ": checkpoint entry '", key, "' is not ", what, " (", v.tagKind(), ")");
    return v;
  }

  torch::serialize::InputArchive& a_;
  std::string who_;
};

constexpr int64_t kMaxSlots = 16;

CheckpointSlot read_slot(Reader& r, const std::string& sk, int64_t numel, int64_t block_size) {
  CheckpointSlot s;
  s.storage = r.get_int(sk + "/storage", -1, kMaxStorageId);
  if (s.storage < 0) return s;
  if (is_correction_storage(s.storage)) {
    s.values = r.get_tensor(sk + "/values", s.storage == kStorageInt16Correction ? at::kShort : at::kChar);
    TORCH_CHECK(s.values.numel() == numel, r.who(), ": checkpoint tensor '", sk, "/values' has ", s.values.numel(),
                " values, expected ", numel);
    return s;
  }
  const StateFormat storage = state_format_of_storage(s.storage);
  if (is_quantized(storage)) {
    s.qformat = r.get_int(sk + "/qformat", 0, kNumQuantFormats - 1);
    s.codes = r.get_tensor(sk + "/codes", at::kByte);
    s.absmax = r.get_tensor(sk + "/absmax", at::kFloat);
    // The QTensor constructor checks that codes and absmax fit the shape and block size.
    s.quantized = QTensor(s.codes, s.absmax, {numel}, static_cast<QuantFormat>(s.qformat), block_size);
    check_block_scales(r.who(), sk + "/absmax", s.absmax);
    check_codes_finite(r.who(), sk + "/codes", s.codes, static_cast<QuantFormat>(s.qformat));
  } else {
    s.values = r.get_tensor(sk + "/values", storage == StateFormat::BF16 ? at::kBFloat16 : at::kFloat);
    TORCH_CHECK(s.values.numel() == numel, r.who(), ": checkpoint tensor '", sk, "/values' has ", s.values.numel(),
                " values, expected ", numel);
  }
  return s;
}

}  // namespace

CheckpointContents read_checkpoint(torch::serialize::InputArchive& a, const std::string& who) {
  Reader r(a, who);
  c10::IValue magic;
  TORCH_CHECK(a.try_read("lowbit/magic", magic) && magic.isInt() && magic.toInt() == kCheckpointMagic, who,
              ": not a lowbit optimizer checkpoint (no lowbit magic number)");
  CheckpointContents c;
  c.version = r.get_int("lowbit/version");
  TORCH_CHECK(c.version == 1 || c.version == kCheckpointVersionDigests, who, ": checkpoint format version ", c.version,
              " is not supported (this build reads versions 1 and ", kCheckpointVersionDigests, ")");
  r.version = c.version;
  // Version 2: the header first, so that no count or size below is trusted before its digest.
  if (c.version >= kCheckpointVersionDigests) r.check_header_digest();
  c.optimizer = r.get_string("lowbit/optimizer");
  c.seed = r.get_int("lowbit/seed");
  c.skipped_steps = r.get_int("lowbit/skipped_steps", 0, kMaxCheckpointCount);
  const int64_t groups = r.get_int("lowbit/groups", 0, kMaxCheckpointCount);
  for (int64_t gi = 0; gi < groups; ++gi) {
    const std::string gk = "group/" + std::to_string(gi);
    CheckpointGroup g;
    g.lr = r.get_double(gk + "/lr");
    TORCH_CHECK(std::isfinite(g.lr) && g.lr >= 0, who, ": checkpoint entry '", gk, "/lr' is ", g.lr,
                ", expected a finite value >= 0");
    const int64_t n = r.get_int(gk + "/params", 0, kMaxCheckpointCount);
    for (int64_t i = 0; i < n; ++i) {
      const std::string k = "param/" + std::to_string(gi) + "/" + std::to_string(i);
      CheckpointParam p;
      p.numel = r.get_int(k + "/numel", 0, kMaxCheckpointCount);
      p.offset = r.get_int(k + "/offset", 0, 0);  // fragments of sharded parameters: not in this format yet
      p.has_state = r.get_int(k + "/has_state", 0, 1) == 1;
      if (p.has_state) {
        p.step = r.get_int(k + "/step", 0, kMaxCheckpointCount);
        p.format = r.get_int(k + "/format", 0, kNumStateFormats - 1);
        p.block_size = r.get_int(k + "/block_size", 1, kMaxCheckpointCount);
        if (is_quantized(static_cast<StateFormat>(p.format))) {
          // A valid block size of the format (a power of two in range), as written.
          check_quant_block_size(who, k + "/block_size", quant_format_for(static_cast<StateFormat>(p.format), true),
                                 p.block_size);
        }
        const int64_t nslots = r.get_int(k + "/slots", 0, kMaxSlots);
        for (int64_t s = 0; s < nslots; ++s)
          p.slots.push_back(read_slot(r, k + "/slot/" + std::to_string(s), p.numel, p.block_size));
      }
      g.params.push_back(std::move(p));
    }
    c.groups.push_back(std::move(g));
  }
  return c;
}

}  // namespace optim
}  // namespace lowbit
