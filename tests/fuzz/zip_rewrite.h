// Zip archives taken apart into their records and written back, for the tests and the fuzzer: a
// record's bytes replaced (a tensor record cut short, a pickle edited) with every size, offset and
// CRC-32 recomputed, so that the zip checks pass and the loaders' checks behind them are reached;
// and with data descriptors, as Python's torch.save writes its records.
#pragma once

#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include <lowbit/optim/checkpoint_zip.h>

#include "../checkpoint_edit.h"

namespace lowbit_test {

struct ZipEntry {
  std::string name;
  std::string bytes;      // as stored: a deflated record's deflated bytes
  bool deflated = false;  // kept deflated, with its CRC-32 and size
  uint32_t crc32 = 0;     // of the inflated bytes (recomputed for stored records)
  uint64_t size = 0;      // inflated (likewise)
};

// CRC-32 (the zip polynomial, reflected), bit by bit from a table built once.
inline uint32_t crc32_of(const std::string& bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (const char ch : bytes) c = table[(c ^ static_cast<uint8_t>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// The records of a well-formed archive (its bytes), in central-directory order; read by lowbit's
// own zip reader (through a file of this process's own).
inline std::vector<ZipEntry> zip_entries(const std::string& file) {
  const std::string tmp = "/tmp/lowbit_zip_entries_" + std::to_string(getpid());
  write_file(tmp, file);
  std::vector<lowbit::optim::ZipRecord> records;
  const std::string error = lowbit::optim::check_zip_archive(tmp, &records);
  std::remove(tmp.c_str());
  if (!error.empty()) throw std::runtime_error("zip_entries: " + error);
  std::vector<ZipEntry> out;
  for (const auto& r : records)
    out.push_back({r.name, file.substr(r.data_offset, r.stored_size), r.deflated, r.crc32, r.size});
  return out;
}

namespace zip_detail {
inline void put16(std::string& s, uint32_t v) {
  s += static_cast<char>(v & 0xFF);
  s += static_cast<char>((v >> 8) & 0xFF);
}
inline void put32(std::string& s, uint32_t v) {
  put16(s, v & 0xFFFF);
  put16(s, v >> 16);
}
}  // namespace zip_detail

// `entries` as a zip archive laid out as libtorch lays one out: each record's bytes start on a
// multiple of 64 (padding in an extra field "FB", as PyTorchStreamWriter writes it); stored
// records get their CRC-32 and size from their bytes. With `data_descriptors`, as Python's
// torch.save writes: flags 0x0808, the local header's CRC-32 and sizes zero, a data descriptor
// after the bytes. No zip64 records: for archives under 4 GiB.
inline std::string zip_archive(std::vector<ZipEntry> entries, bool data_descriptors = false) {
  using zip_detail::put16;
  using zip_detail::put32;
  const uint32_t flags = data_descriptors ? 0x0808 : 0;
  std::string out;
  std::vector<uint32_t> offsets;
  for (ZipEntry& e : entries) {
    if (!e.deflated) {
      e.crc32 = crc32_of(e.bytes);
      e.size = e.bytes.size();
    }
    offsets.push_back(static_cast<uint32_t>(out.size()));
    const size_t header = 30 + e.name.size() + 4;
    const size_t pad = (64 - (out.size() + header) % 64) % 64;
    put32(out, 0x04034b50);
    put16(out, 20);  // version needed: 2.0
    put16(out, flags);
    put16(out, e.deflated ? 8 : 0);
    put16(out, 0);  // time
    put16(out, 0x21);  // date: 1980-01-01
    put32(out, data_descriptors ? 0 : e.crc32);
    put32(out, data_descriptors ? 0 : static_cast<uint32_t>(e.bytes.size()));
    put32(out, data_descriptors ? 0 : static_cast<uint32_t>(e.size));
    put16(out, static_cast<uint32_t>(e.name.size()));
    put16(out, static_cast<uint32_t>(4 + pad));
    out += e.name;
    out += "FB";
    put16(out, static_cast<uint32_t>(pad));
    out.append(pad, 'Z');
    out += e.bytes;
    if (data_descriptors) {
      put32(out, 0x08074b50);
      put32(out, e.crc32);
      put32(out, static_cast<uint32_t>(e.bytes.size()));
      put32(out, static_cast<uint32_t>(e.size));
    }
  }
  const uint32_t cd_offset = static_cast<uint32_t>(out.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const ZipEntry& e = entries[i];
    put32(out, 0x02014b50);
    put16(out, 0x031E);  // made by: unix, 3.0
    put16(out, 20);
    put16(out, flags);
    put16(out, e.deflated ? 8 : 0);
    put16(out, 0);
    put16(out, 0x21);
    put32(out, e.crc32);
    put32(out, static_cast<uint32_t>(e.bytes.size()));
    put32(out, static_cast<uint32_t>(e.size));
    put16(out, static_cast<uint32_t>(e.name.size()));
    put16(out, 0);  // extra
    put16(out, 0);  // comment
    put16(out, 0);  // disk
    put16(out, 0);  // internal attributes
    put32(out, 0);  // external attributes
    put32(out, offsets[i]);
    out += e.name;
  }
  const uint32_t cd_size = static_cast<uint32_t>(out.size()) - cd_offset;
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint32_t>(entries.size()));
  put16(out, static_cast<uint32_t>(entries.size()));
  put32(out, cd_size);
  put32(out, cd_offset);
  put16(out, 0);
  return out;
}

// The entry named `name` (exactly), or null.
inline ZipEntry* find_entry(std::vector<ZipEntry>& entries, const std::string& name) {
  for (ZipEntry& e : entries)
    if (e.name == name) return &e;
  return nullptr;
}

// The entry whose name ends with `/suffix` (the archive's folder is the file's name), or null.
inline ZipEntry* find_entry_in_folder(std::vector<ZipEntry>& entries, const std::string& suffix) {
  for (ZipEntry& e : entries) {
    const size_t slash = e.name.find('/');
    if (slash != std::string::npos && e.name.compare(slash + 1, std::string::npos, suffix) == 0) return &e;
  }
  return nullptr;
}

}  // namespace lowbit_test
