// The zip archive of a checkpoint, checked by us before libtorch parses any of it: its structure
// (end record, central directory, local headers, every record inside the file and apart from the
// others) and every record's CRC-32. libtorch's reader (miniz, built without CRC checks) trusts
// all of these, and its unpickler and TorchScript importer misbehave on damaged records (heap
// corruption, README "Reliability"): what reaches them must be what a writer wrote. Torch-free
// (zlib inflates and sums).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lowbit {
namespace optim {

struct ZipRecord {
  std::string name;
  uint64_t header_offset = 0;  // its local header
  uint64_t data_offset = 0;    // its bytes as stored
  uint64_t stored_size = 0;    // bytes in the file (libtorch deflates TorchScript code records)
  uint64_t size = 0;           // bytes once inflated (= stored_size for stored records)
  bool deflated = false;
  uint32_t crc32 = 0;          // of the inflated bytes, as recorded in the central directory
};

// "" if `path` is a well-formed zip archive whose records (stored, or deflated) all inflate to
// their declared sizes and match their CRC-32s; otherwise what is wrong, naming the record or the
// field and its value. `records` (may be null) gets the records in central-directory order.
std::string check_zip_archive(const std::string& path, std::vector<ZipRecord>* records = nullptr);

}  // namespace optim
}  // namespace lowbit
