// The zip archive of a checkpoint, checked by us before libtorch parses any of it: its structure
// (end record, central directory, local headers, every record inside the file and apart from the
// others) and every record's CRC-32. libtorch's reader (miniz, built without CRC checks) trusts
// all of these, and its unpickler and TorchScript importer misbehave on damaged records (heap
// corruption, README "Reliability"): what reaches them must be what a writer wrote. Torch-free
// (zlib inflates and sums).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lowbit {
namespace optim {

// A file opened for reading by offset, and only if it is a regular file: its type is looked up
// (stat) before it is opened, since opening a FIFO blocks until a writer comes, and a directory or
// a device is no checkpoint; then it is opened without blocking and looked up again (fstat), in
// case the path changed in between. Every reader reads the file through one of these, so what was
// checked is what libtorch reads.
class ArchiveFile {
 public:
  explicit ArchiveFile(const std::string& path);
  ~ArchiveFile();
  ArchiveFile(const ArchiveFile&) = delete;
  ArchiveFile& operator=(const ArchiveFile&) = delete;

  // "" once open; otherwise why not, naming the path ("'x' is a FIFO (named pipe), not a regular
  // file", "cannot read 'x': No such file or directory").
  const std::string& error() const { return error_; }
  uint64_t size() const { return size_; }
  // Bytes [at, at + n), all inside the file.
  bool read(uint64_t at, void* out, size_t n) const;
  // As many of bytes [at, at + n) as the file has (libtorch's reader asks for what it needs).
  size_t read_some(uint64_t at, void* out, size_t n) const;

 private:
  int fd_ = -1;
  std::string error_;
  uint64_t size_ = 0;
};

struct ZipRecord {
  std::string name;
  uint64_t header_offset = 0;  // its local header
  uint64_t data_offset = 0;    // its bytes as stored
  uint64_t stored_size = 0;    // bytes in the file (libtorch deflates TorchScript code records)
  uint64_t size = 0;           // bytes once inflated (= stored_size for stored records)
  bool deflated = false;
  uint32_t crc32 = 0;          // of the inflated bytes, as recorded in the central directory
};

// "" if `file` is a well-formed zip archive whose records (stored, or deflated) all inflate to
// their declared sizes and match their CRC-32s; otherwise what is wrong, naming the record or the
// field and its value. `records` (may be null) gets the records in central-directory order.
std::string check_zip_archive(const ArchiveFile& file, std::vector<ZipRecord>* records = nullptr);
// The same for the file at `path` (or why it cannot be opened: ArchiveFile::error).
std::string check_zip_archive(const std::string& path, std::vector<ZipRecord>* records = nullptr);

// The bytes of record `r` of `file` (inflated where deflated) into `out`; "" or what went wrong.
// For records check_zip_archive has passed.
std::string read_zip_record(const ArchiveFile& file, const ZipRecord& r, std::string* out);

}  // namespace optim
}  // namespace lowbit
