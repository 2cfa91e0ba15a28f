// Checkpoint files as a map of entries, for tests and the fuzzer: read, edit, write back (with
// version 2's digests recomputed when asked, so that the loader's other checks are reached).
#pragma once

#include <torch/serialize.h>

#include <fstream>
#include <map>
#include <string>

#include <lowbit/optim/checkpoint_reader.h>
#include <lowbit/optim/checkpoint_zip.h>

namespace lowbit_test {

using Entries = std::map<std::string, c10::IValue>;

inline Entries read_entries(const std::string& path) {
  torch::serialize::InputArchive a;
  a.load_from(path);
  Entries e;
  for (const std::string& k : a.keys()) {
    c10::IValue v;
    a.try_read(k, v);
    e.emplace(k, v);
  }
  return e;
}

// Recomputes every tensor's digest entry (unless `header_only`) and the header digest.
inline void resign(Entries& e, bool header_only = false) {
  std::map<std::string, c10::IValue> header;
  for (auto& [k, v] : e)
    if (v.isTensor() && !header_only) e[k + "/digest"] = c10::IValue(lowbit::optim::tensor_digest(k, v.toTensor()));
  for (const auto& [k, v] : e)
    if (!v.isTensor() && k != "lowbit/header_digest") header.emplace(k, v);
  e["lowbit/header_digest"] = c10::IValue(lowbit::optim::header_digest(header));
}

inline void write_entries(const Entries& e, const std::string& path) {
  torch::serialize::OutputArchive a;
  for (const auto& [k, v] : e) {
    if (v.isTensor())
      a.write(k, v.toTensor());
    else
      a.write(k, v);
  }
  a.save_to(path);
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_file(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// [offset, offset + stored size) of each zip record's bytes in the file, by record name without
// the archive's folder ("data.pkl", "data/0", "code/__torch__.py"). The stored size, not
// PyTorchStreamReader::getRecordSize: libtorch deflates code records, and their inflated size
// reaches past them (past the end of the file for the last one).
inline std::map<std::string, std::pair<size_t, size_t>> record_spans(const std::string& path) {
  std::vector<lowbit::optim::ZipRecord> records;
  const std::string error = lowbit::optim::check_zip_archive(path, &records);
  TORCH_CHECK(error.empty(), "record_spans: ", path, ": ", error);
  std::map<std::string, std::pair<size_t, size_t>> out;
  for (const auto& r : records) {
    const size_t slash = r.name.find('/');
    out[slash == std::string::npos ? r.name : r.name.substr(slash + 1)] = {r.data_offset, r.stored_size};
  }
  return out;
}

}  // namespace lowbit_test
