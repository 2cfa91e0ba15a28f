// Checkpoint files as a map of entries, for tests and the fuzzer: read, edit, write back (with
// version 2's digests recomputed when asked, so that the loader's other checks are reached).
#pragma once

#include <caffe2/serialize/inline_container.h>
#include <torch/serialize.h>

#include <fstream>
#include <map>
#include <string>

#include <lowbit/optim/checkpoint_reader.h>

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

// [offset, offset + size) of each zip record's data in the file, by record name.
inline std::map<std::string, std::pair<size_t, size_t>> record_spans(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader r(path);
  std::map<std::string, std::pair<size_t, size_t>> out;
  for (const auto& n : r.getAllRecords()) out[n] = {r.getRecordOffset(n), r.getRecordSize(n)};
  return out;
}

}  // namespace lowbit_test
