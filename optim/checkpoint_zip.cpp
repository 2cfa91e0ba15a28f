// check_zip_archive (checkpoint_zip.h). The layout is PKWARE's APPNOTE 6.3: local
// header + data per record, then the central directory, then (zip64) the zip64 end record and its
// locator, then the end record; all integers little-endian.
#include "checkpoint_zip.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <set>

#include <zlib.h>

namespace lowbit {
namespace optim {

// ---------------------------------------------------------------------------------------------
// The file
// ---------------------------------------------------------------------------------------------

namespace {

// What a file of type `mode` is, for an error naming it.
const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string not_regular(const std::string& path, mode_t mode) {
  const std::string kind = file_type_name(mode);
  return "'" + path + "' is " + kind + (kind == "not a regular file" ? "" : ", not a regular file");
}

}  // namespace

ArchiveFile::ArchiveFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    error_ = "cannot read '" + path + "': " + std::strerror(errno);
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    error_ = not_regular(path, st.st_mode);
    return;
  }
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) {
    error_ = "cannot read '" + path + "': " + std::strerror(errno);
    return;
  }
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    error_ = S_ISREG(st.st_mode) ? "cannot read '" + path + "': " + std::strerror(errno) : not_regular(path, st.st_mode);
    ::close(fd_);
    fd_ = -1;
    return;
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

ArchiveFile::~ArchiveFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t ArchiveFile::read_some(uint64_t at, void* out, size_t n) const {
  if (fd_ < 0 || at >= size_) return 0;
  n = static_cast<size_t>(std::min<uint64_t>(n, size_ - at));
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd_, static_cast<char*>(out) + done, n - done, static_cast<off_t>(at + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

bool ArchiveFile::read(uint64_t at, void* out, size_t n) const {
  if (at > size_ || n > size_ - at) return false;
  return read_some(at, out, n) == n;
}

// ---------------------------------------------------------------------------------------------
// The archive
// ---------------------------------------------------------------------------------------------

namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kZip64EndSig = 0x06064b50, kZip64LocatorSig = 0x07064b50;
constexpr size_t kLocalSize = 30, kCentralSize = 46, kEndSize = 22, kZip64EndSize = 56, kZip64LocatorSize = 20;

uint16_t u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t u32(const unsigned char* p) { return u16(p) | static_cast<uint32_t>(u16(p + 2)) << 16; }
uint64_t u64(const unsigned char* p) { return u32(p) | static_cast<uint64_t>(u32(p + 4)) << 32; }

std::string str(uint64_t v) { return std::to_string(v); }

bool read_into(const ArchiveFile& file, uint64_t at, std::vector<unsigned char>& out, size_t n) {
  out.resize(n);
  return file.read(at, out.data(), n);
}

// The zip64 extended information of a central directory entry (extra field 0x0001): the 64-bit
// values of the fields that hold 0xFFFFFFFF, in APPNOTE's order.
bool read_zip64_extra(const unsigned char* extra, size_t n, uint64_t* usize, uint64_t* csize, uint64_t* offset) {
  for (size_t i = 0; i + 4 <= n;) {
    const uint16_t id = u16(extra + i), len = u16(extra + i + 2);
    if (i + 4 + len > n) return false;
    if (id == 0x0001) {
      size_t at = i + 4;
      for (uint64_t* v : {usize, csize, offset}) {
        if (*v != 0xFFFFFFFFu) continue;
        if (at + 8 > i + 4 + len) return false;
        *v = u64(extra + at);
        at += 8;
      }
      return true;
    }
    i += 4 + len;
  }
  return *usize != 0xFFFFFFFFu && *csize != 0xFFFFFFFFu && *offset != 0xFFFFFFFFu;
}

// A record's bytes, inflated where deflated, handed to a sink piece by piece; never more than the
// record declares. One per pass over an archive: it owns the buffers, sized to the records (up to
// a chunk), since most of a checkpoint's records are small and a pass is made per load.
class RecordBytes {
 public:
  using Sink = std::function<void(const unsigned char*, size_t)>;

  // "" once all `r.size` bytes went to `sink`; otherwise what is wrong with the record.
  std::string stream(const ArchiveFile& file, const ZipRecord& r, const Sink& sink) {
    const std::string what = "record '" + r.name + "'";
    constexpr uint64_t kChunk = uint64_t(1) << 20;
    const size_t in_size = static_cast<size_t>(std::min(kChunk, std::max<uint64_t>(r.stored_size, 1)));
    const size_t out_size = static_cast<size_t>(std::min(kChunk, std::max<uint64_t>(r.size, 4096)));
    if (in_.size() < in_size) in_.resize(in_size);
    if (r.deflated && out_.size() < out_size) out_.resize(out_size);
    uint64_t produced = 0;
    z_stream z{};
    if (r.deflated && inflateInit2(&z, -MAX_WBITS) != Z_OK) return "cannot inflate " + what;
    std::unique_ptr<z_stream, int (*)(z_stream*)> guard(r.deflated ? &z : nullptr, &inflateEnd);
    int zrc = Z_OK;
    for (uint64_t done = 0; done < r.stored_size;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(in_size, r.stored_size - done));
      if (!file.read(r.data_offset + done, in_.data(), n)) return "cannot read " + what;
      done += n;
      if (!r.deflated) {
        sink(in_.data(), n);
        produced += n;
        continue;
      }
      z.next_in = in_.data();
      z.avail_in = static_cast<uInt>(n);
      // Inflate while input is left, or while the last call filled the output (more may be pending).
      do {
        z.next_out = out_.data();
        z.avail_out = static_cast<uInt>(out_size);
        zrc = inflate(&z, Z_NO_FLUSH);
        if (zrc == Z_BUF_ERROR) break;  // no progress possible: it needs the next chunk
        if (zrc != Z_OK && zrc != Z_STREAM_END)
          return what + " is corrupt: its deflated bytes do not inflate (zlib: " + (z.msg ? z.msg : "error") + ")";
        const size_t got = out_size - z.avail_out;
        produced += got;
        if (produced > r.size)  // never inflate past what the record declares
          return what + " is corrupt: it inflates to more than the " + str(r.size) + " bytes it declares";
        sink(out_.data(), got);
      } while (zrc != Z_STREAM_END && (z.avail_in > 0 || z.avail_out == 0));
      if (zrc == Z_STREAM_END && (z.avail_in > 0 || done < r.stored_size))
        return what + " is corrupt: its deflated stream ends before its " + str(r.stored_size) + " stored bytes";
    }
    if (r.deflated && zrc != Z_STREAM_END && r.stored_size > 0)
      return what + " is corrupt: its deflated stream is cut short";
    if (produced != r.size)
      return what + " is corrupt: it holds " + str(produced) + " bytes, the archive declares " + str(r.size);
    return "";
  }

 private:
  std::vector<unsigned char> in_, out_;
};

}  // namespace

std::string check_zip_archive(const std::string& path, std::vector<ZipRecord>* records) {
  const ArchiveFile file(path);
  if (!file.error().empty()) return file.error();
  return check_zip_archive(file, records);
}

std::string check_zip_archive(const ArchiveFile& file, std::vector<ZipRecord>* records) {
  const uint64_t size = file.size();
  if (size < kEndSize) return "it is " + str(size) + " bytes, too short for a zip archive (truncated?)";

  // ---- the end record: the last one whose comment reaches exactly to the end of the file
  const size_t tail = static_cast<size_t>(std::min<uint64_t>(size, kEndSize + 0xFFFF));
  std::vector<unsigned char> buf;
  if (!read_into(file, size - tail, buf, tail)) return "cannot read its last " + str(tail) + " bytes";
  uint64_t end = UINT64_MAX;
  for (size_t i = tail - kEndSize + 1; i-- > 0;) {
    if (u32(&buf[i]) == kEndSig && i + kEndSize + u16(&buf[i + 20]) == tail) {
      end = size - tail + i;
      break;
    }
  }
  if (end == UINT64_MAX) return "it has no zip end record (truncated, or not a zip archive)";
  const unsigned char* e = &buf[end - (size - tail)];
  if (u16(e + 4) != 0 || u16(e + 6) != 0 || u16(e + 8) != u16(e + 10))
    return "its end record describes a multi-disk archive (disk " + str(u16(e + 4)) + ", " + str(u16(e + 8)) + " of " +
           str(u16(e + 10)) + " records here)";
  uint64_t count = u16(e + 10), cd_size = u32(e + 12), cd_offset = u32(e + 16);
  uint64_t cd_limit = end;  // where the central directory must end

  // ---- zip64: the locator just before the end record, and the zip64 end record it points to
  unsigned char loc[kZip64LocatorSize];
  if (end >= kZip64LocatorSize && file.read(end - kZip64LocatorSize, loc, sizeof loc) && u32(loc) == kZip64LocatorSig) {
    const uint64_t z = u64(loc + 8);
    unsigned char r[kZip64EndSize];
    if (u32(loc + 4) != 0 || u32(loc + 16) != 1) return "its zip64 locator describes a multi-disk archive";
    if (z > end - kZip64LocatorSize || end - kZip64LocatorSize - z < kZip64EndSize || !file.read(z, r, sizeof r) ||
        u32(r) != kZip64EndSig)
      return "its zip64 locator points to offset " + str(z) + ", where no zip64 end record is";
    if (u64(r + 4) + 12 != end - kZip64LocatorSize - z)
      return "its zip64 end record declares " + str(u64(r + 4)) + " bytes, not the " +
             str(end - kZip64LocatorSize - z - 12) + " before the locator";
    if (u32(r + 16) != 0 || u32(r + 20) != 0 || u64(r + 24) != u64(r + 32))
      return "its zip64 end record describes a multi-disk archive";
    // The end record's own fields: each the zip64 value, or the marker that defers to it.
    if ((count != 0xFFFF && count != u64(r + 32)) || (cd_size != 0xFFFFFFFFu && cd_size != u64(r + 40)) ||
        (cd_offset != 0xFFFFFFFFu && cd_offset != u64(r + 48)))
      return "its end record and its zip64 end record disagree on the central directory (" + str(count) + " / " +
             str(u64(r + 32)) + " records, " + str(cd_size) + " / " + str(u64(r + 40)) + " bytes at " +
             str(cd_offset) + " / " + str(u64(r + 48)) + ")";
    count = u64(r + 32);
    cd_size = u64(r + 40);
    cd_offset = u64(r + 48);
    cd_limit = z;
  } else if (count == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_offset == 0xFFFFFFFFu) {
    return "its end record defers to a zip64 end record that is not there";
  }

  // ---- the central directory: exactly the bytes before the (zip64) end record
  if (cd_offset > cd_limit || cd_size != cd_limit - cd_offset)
    return "its central directory (" + str(cd_size) + " bytes at offset " + str(cd_offset) +
           ") does not end where the end record starts (offset " + str(cd_limit) + ")";
  if (count == 0) return "it holds no records";
  if (count > cd_size / kCentralSize)
    return "its end record declares " + str(count) + " records, more than a central directory of " + str(cd_size) +
           " bytes holds";
  std::vector<unsigned char> cd;
  if (!read_into(file, cd_offset, cd, static_cast<size_t>(cd_size))) return "cannot read its central directory";

  std::vector<ZipRecord> out;
  std::set<std::string> names;
  size_t pos = 0;
  for (uint64_t k = 0; k < count; ++k) {
    const std::string entry = "central directory entry " + str(k);
    if (cd.size() - pos < kCentralSize || u32(&cd[pos]) != kCentralSig)
      return entry + " (offset " + str(cd_offset + pos) + ") has no central header signature";
    const unsigned char* c = &cd[pos];
    const uint16_t flags = u16(c + 8), method = u16(c + 10), name_len = u16(c + 28), extra_len = u16(c + 30),
                   comment_len = u16(c + 32);
    if (cd.size() - pos - kCentralSize < size_t(name_len) + extra_len + comment_len)
      return entry + " runs past the central directory";
    ZipRecord rec;
    rec.name.assign(reinterpret_cast<const char*>(c + kCentralSize), name_len);
    const std::string what = "record '" + rec.name + "'";
    uint64_t usize = u32(c + 24), csize = u32(c + 20), offset = u32(c + 42);
    if (!read_zip64_extra(c + kCentralSize + name_len, extra_len, &usize, &csize, &offset))
      return what + " has a zip64 size or offset without its zip64 extra field";
    rec.crc32 = u32(c + 16);
    rec.header_offset = offset;
    rec.stored_size = csize;
    rec.size = usize;
    rec.deflated = method == 8;
    pos += kCentralSize + name_len + extra_len + comment_len;
    if (name_len == 0) return entry + " has an empty name";
    if (!names.insert(rec.name).second) return what + " appears twice";
    // What miniz (libtorch's reader) acts on beyond the sizes: encryption and patch flags, and the
    // directory mark (a name ending in '/', or the MS-DOS directory attribute), which makes it read
    // the record as empty. libtorch writes none of them.
    if (flags & 0x61) return what + " is marked encrypted or patched (flags " + str(flags) + ")";
    if (rec.name.back() == '/' || (u32(c + 38) & 0x10))
      return what + " is marked as a directory (external attributes " + str(u32(c + 38)) + ")";
    if (method != 0 && method != 8)
      return what + " is compressed with method " + str(method) + "; libtorch writes stored (0) or deflated (8) records";
    if (method == 0 && usize != csize)
      return what + " is stored with " + str(csize) + " bytes but declares " + str(usize) + " uncompressed";
    if (u16(c + 34) != 0) return what + " starts on disk " + str(u16(c + 34));

    // Its local header, name and data: all before the central directory.
    unsigned char l[kLocalSize];
    if (offset > cd_offset || cd_offset - offset < kLocalSize || !file.read(offset, l, sizeof l) || u32(l) != kLocalSig)
      return what + ": no local header at offset " + str(offset);
    const uint16_t lname_len = u16(l + 26), lextra_len = u16(l + 28);
    rec.data_offset = offset + kLocalSize + lname_len + lextra_len;
    if (rec.data_offset > cd_offset || rec.stored_size > cd_offset - rec.data_offset)
      return what + " declares " + str(rec.stored_size) + " bytes at offset " + str(rec.data_offset) +
             ", past the start of the central directory (offset " + str(cd_offset) + "): a damaged size field";
    std::vector<unsigned char> lname;
    if (!read_into(file, offset + kLocalSize, lname, lname_len) ||
        std::string(reinterpret_cast<const char*>(lname.data()), lname.size()) != rec.name)
      return what + ": its local header names another record";
    if (u16(l + 6) != flags || u16(l + 8) != method)
      return what + ": its local header's flags or method differ from the central directory's";
    if (!(flags & 0x8)) {  // no data descriptor: the local header repeats CRC and sizes (or defers to zip64)
      const uint32_t lcrc = u32(l + 14), lcsize = u32(l + 18), lusize = u32(l + 22);
      const bool deferred = lcsize == 0xFFFFFFFFu || lusize == 0xFFFFFFFFu;
      if (lcrc != rec.crc32 || (!deferred && (lcsize != csize || lusize != usize)))
        return what + ": its local header's CRC-32 or sizes differ from the central directory's";
    }
    out.push_back(std::move(rec));
  }
  if (pos != cd.size()) return "its central directory has " + str(cd.size() - pos) + " bytes after its last entry";

  // ---- records apart from each other
  std::vector<const ZipRecord*> by_offset;
  for (const auto& r : out) by_offset.push_back(&r);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const ZipRecord* a, const ZipRecord* b) { return a->header_offset < b->header_offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipRecord& a = *by_offset[i - 1];
    if (by_offset[i]->header_offset < a.data_offset + a.stored_size)
      return "records '" + a.name + "' and '" + by_offset[i]->name + "' overlap";
  }

  // ---- every record's bytes (inflated where deflated) against its size and CRC-32
  RecordBytes bytes;
  for (const auto& r : out) {
    uLong crc = crc32(0, nullptr, 0);
    const std::string error =
        bytes.stream(file, r, [&](const unsigned char* p, size_t n) { crc = crc32_z(crc, p, n); });
    if (!error.empty()) return error;
    if (crc != r.crc32) {
      char got[16], want[16];
      std::snprintf(got, sizeof got, "%08lx", static_cast<unsigned long>(crc));
      std::snprintf(want, sizeof want, "%08x", r.crc32);
      return "record '" + r.name + "' is corrupt: its CRC-32 is " + got + ", the archive recorded " + want;
    }
  }
  if (records) *records = std::move(out);
  return "";
}

std::string read_zip_record(const ArchiveFile& file, const ZipRecord& r, std::string* out) {
  out->clear();
  out->reserve(static_cast<size_t>(r.size));
  RecordBytes bytes;
  return bytes.stream(file, r, [&](const unsigned char* p, size_t n) { out->append(reinterpret_cast<const char*>(p), n); });
}

}  // namespace optim
}  // namespace lowbit
