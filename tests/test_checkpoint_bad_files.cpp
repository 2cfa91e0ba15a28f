// Checkpoint files that are not what they seem, each refused by load_checkpoint and `lowbit
// inspect` with an error naming the file and what is wrong, the optimizer left bit-identical:
// tensor records shorter than data.pkl claims (in a zip re-sealed so that its checks pass), paths
// that are not regular files (a FIFO must not block), and a torch.save file from Python.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "checkpoint_edit.h"
#include "fuzz/fuzz_common.h"
#include "fuzz/pickle_claims.h"
#include "fuzz/zip_rewrite.h"
#include "test_util.h"

using lowbit::StateFormat;
namespace lo = lowbit::optim;
namespace lt = lowbit_test;

namespace {

// A folder of this test's own, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/lowbit_bad_files_XXXXXX";
    path_ = mkdtemp(name) ? name : "";
  }
  ~TempDir() {
    if (!path_.empty()) lowbit_fuzz::remove_tree(path_);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Adam with fp32 state on parameters of 4608 and 70 elements, after `steps` steps: its state is
// four tensors, param/0/<i>/slot/<s>/values, the second parameter's of 280 bytes each.
struct Trained {
  std::vector<at::Tensor> params;
  std::unique_ptr<lo::Adam> opt;
  explicit Trained(int steps, uint64_t seed) {
    at::manual_seed(seed);
    params = {at::randn({4608}), at::randn({70})};
    opt = std::make_unique<lo::Adam>(params, lo::AdamOptions(1e-2).state_format(StateFormat::FP32));
    for (int s = 0; s < steps; ++s) lowbit_fuzz::step(*opt, params, {at::randn({4608}), at::randn({70})});
  }
  std::vector<at::Tensor> snapshot() const { return lowbit_fuzz::snapshot(*opt, params); }
};

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// `lowbit inspect path`: its exit status (124 if it ran 20 s: a FIFO it blocks on) and its stderr.
std::pair<int, std::string> inspect_cli(const std::string& path, const TempDir& dir) {
  const std::string err = dir.file("inspect.err");
  const int rc = std::system(("timeout 20 " + std::string(LOWBIT_CLI_PATH) + " inspect '" + path + "' >/dev/null 2>'" +
                              err + "'").c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, lt::read_file(err)};
}

// A load of `path` into `victim` is refused with an error holding each of `want`, and leaves it
// bit-identical; `lowbit inspect` refuses it with the same error.
void expect_refused(Trained& victim, const std::string& path, const std::vector<std::string>& want, const TempDir& dir) {
  const auto before = victim.snapshot();
  const std::string err = lt::error_of([&] { lo::load_checkpoint(*victim.opt, path); });
  ASSERT_FALSE(err.empty()) << path << " loaded";
  for (const std::string& w : want) EXPECT_NE(err.find(w), std::string::npos) << "want '" << w << "' in: " << err;
  EXPECT_TRUE(lowbit_fuzz::same_bits(before, victim.snapshot())) << "a refused load changed the optimizer";
  const auto [rc, text] = inspect_cli(path, dir);
  EXPECT_EQ(rc, 1) << text;
  for (const std::string& w : want) EXPECT_NE(text.find(w), std::string::npos) << "want '" << w << "' in: " << text;
}

}  // namespace

// A tensor record shorter than data.pkl claims for it, the zip's sizes, offsets and CRC-32s
// recomputed so that the zip checks pass: before, libtorch made a storage of the claimed size over
// the record's buffer, and the digest read past it (a 64 MB claim: a crash). Now each tensor's
// storage is checked against the record libtorch read it from, and its sizes, strides and offset
// against its storage, before anything reads it.
TEST(CheckpointBadFiles, TensorRecordsShorterThanDataPklClaimsAreRefused) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  Trained original(2, 1);
  const std::string good = dir.file("good.pt");
  torch::save(*original.opt, good);
  const std::vector<lt::ZipEntry> entries = lt::zip_entries(lt::read_file(good));
  std::vector<lt::ZipEntry> probe = entries;
  const lt::ZipEntry* pkl = lt::find_entry_in_folder(probe, "data.pkl");
  ASSERT_NE(pkl, nullptr);
  const std::vector<lt::TensorClaims> claims = lt::tensor_claims(pkl->bytes);
  ASSERT_EQ(claims.size(), 4u) << "four state tensors";
  // The first tensor of the 70-element parameter: a record of 280 bytes.
  size_t k = 0;
  while (k < claims.size() && lt::find_entry_in_folder(probe, "data/" + claims[k].key)->bytes.size() != 280) ++k;
  ASSERT_LT(k, claims.size());
  const lt::TensorClaims& t = claims[k];
  ASSERT_EQ(t.numel.value, 70);
  ASSERT_EQ(t.sizes.size(), 1u);
  ASSERT_EQ(t.sizes[0].value, 70);
  ASSERT_EQ(t.strides[0].value, 1);
  ASSERT_EQ(t.offset.value, 0);

  using Edit = std::function<void(std::string& pickle, std::string& record)>;
  struct Case {
    const char* name;
    Edit edit;
    std::string want;
    bool also_torch_load;  // refused by the checks of the tensor alone (torch::load skips the file's)
  };
  const int64_t kLarge = int64_t(1) << 24;  // 64 MB of floats
  const std::vector<Case> cases = {
      {"a 64 MB claim over a 280-byte record",
       [&](std::string& p, std::string&) {
         p = lt::set_pickle_int(p, t.sizes[0], kLarge);  // from the end: the size follows the element count
         p = lt::set_pickle_int(p, t.numel, kLarge);
       },
       "needs 67108864 bytes, but its record in the file holds 280 bytes", false},
      {"the record cut short", [](std::string&, std::string& r) { r.resize(276); },
       "needs 280 bytes, but its record in the file holds 276 bytes", false},
      {"the storage claims one element more", [&](std::string& p, std::string&) { p = lt::set_pickle_int(p, t.numel, 71); },
       "needs 284 bytes, but its record in the file holds 280 bytes", false},
      {"a size past the storage", [&](std::string& p, std::string&) { p = lt::set_pickle_int(p, t.sizes[0], 71); },
       "needs 284 bytes (sizes [71], strides [1], storage offset 0) but its storage holds 280 bytes", true},
      {"the offset past the storage", [&](std::string& p, std::string&) { p = lt::set_pickle_int(p, t.offset, 1); },
       "needs 284 bytes (sizes [70], strides [1], storage offset 1) but its storage holds 280 bytes", true},
      {"a stride past the storage", [&](std::string& p, std::string&) { p = lt::set_pickle_int(p, t.strides[0], 2); },
       "needs 556 bytes (sizes [70], strides [2], storage offset 0) but its storage holds 280 bytes", true},
      {"a size whose bytes overflow",
       [&](std::string& p, std::string&) { p = lt::set_pickle_int(p, t.sizes[0], int64_t(1) << 62); },
       "has a negative or overflowing size, stride or storage offset", true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<lt::ZipEntry> e = entries;
    lt::ZipEntry* p = lt::find_entry_in_folder(e, "data.pkl");
    lt::ZipEntry* record = lt::find_entry_in_folder(e, "data/" + t.key);
    c.edit(p->bytes, record->bytes);
    const std::string bad = dir.file("bad.pt");
    lt::write_file(bad, lt::zip_archive(e));
    EXPECT_NO_THROW(lo::check_checkpoint_file(bad)) << "the zip itself is sound: the tensor's claims are not";
    Trained victim(3, 2);
    expect_refused(victim, bad, {c.want, "lowbit checkpoint: '" + bad + "'", "checkpoint tensor 'param/0/1/slot/"}, dir);
    if (c.also_torch_load) {
      const auto before = victim.snapshot();
      const std::string err = lt::error_of([&] { torch::load(*victim.opt, bad); });
      EXPECT_NE(err.find(c.want), std::string::npos) << "torch::load: " << err;
      EXPECT_TRUE(lowbit_fuzz::same_bits(before, victim.snapshot()));
    }
  }
  // The same archive re-sealed without an edit loads as the original does: the refusals above are
  // the edits'.
  Trained resealed(3, 2), plain(3, 2);
  lt::write_file(dir.file("resealed.pt"), lt::zip_archive(entries));
  EXPECT_NO_THROW(lo::load_checkpoint(*resealed.opt, dir.file("resealed.pt")));
  lo::load_checkpoint(*plain.opt, good);
  EXPECT_TRUE(lowbit_fuzz::same_bits(resealed.snapshot(), plain.snapshot()));
}

// A path that is not a regular file is refused before it is opened: opening a FIFO blocks until a
// writer comes (`lowbit inspect` on one hung in fopen).
TEST(CheckpointBadFiles, PathsThatAreNotRegularFilesAreRefused) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string fifo = dir.file("checkpoint.fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  {
    // First through the CLI with a time limit, so that a reader that blocks fails the test.
    const auto [rc, text] = inspect_cli(fifo, dir);
    ASSERT_NE(rc, 124) << "lowbit inspect blocked on a FIFO";
    EXPECT_EQ(rc, 1) << text;
    EXPECT_NE(text.find("'" + fifo + "' is a FIFO (named pipe), not a regular file"), std::string::npos) << text;
  }
  Trained victim(2, 3);
  const struct {
    std::string path, want;
  } cases[] = {
      {fifo, "'" + fifo + "' is a FIFO (named pipe), not a regular file"},
      {dir.path(), "'" + dir.path() + "' is a directory, not a regular file"},
      {"/dev/null", "'/dev/null' is a character device, not a regular file"},
      {dir.file("missing.pt"), "cannot read '" + dir.file("missing.pt") + "': No such file or directory"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.path);
    const std::string err = lt::error_of([&] { lo::check_checkpoint_file(c.path); });
    EXPECT_NE(err.find("lowbit checkpoint: " + c.want), std::string::npos) << err;
    const auto before = victim.snapshot();
    const std::string load_err = lt::error_of([&] { lo::load_checkpoint(*victim.opt, c.path); });
    EXPECT_NE(load_err.find(c.want), std::string::npos) << load_err;
    EXPECT_TRUE(lowbit_fuzz::same_bits(before, victim.snapshot()));
  }
}

// What Python's torch.save({'a': torch.ones(3)}, f) writes (torch 2.11), record for record: a zip
// of pickled Python objects, its records with data descriptors, and no constants.pkl or code/, so
// no TorchScript archive. libtorch's reader fails on it with "failed locating file constants.pkl
// ... This is an internal miniz error"; lowbit says what the file is.
TEST(CheckpointBadFiles, ATorchSaveFileFromPythonIsNamedAsSuch) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  // data.pkl as Python's pickler (protocol 2) wrote it: {'a': tensor of storage '0', 3 floats}.
  const std::string pickle = from_hex(
      "80027d7100580100000061710163746f7263682e5f7574696c730a5f72656275696c645f74656e736f725f76320a7102"
      "2828580700000073746f72616765710363746f7263680a466c6f617453746f726167650a710458010000003071055803"
      "00000063707571064b03747107514b004b038571084b018571098963636f6c6c656374696f6e730a4f72646572656444"
      "6963740a710a2952710b74710c52710d732e");
  ASSERT_EQ(pickle.size(), 162u);
  const std::string ones("\x00\x00\x80?\x00\x00\x80?\x00\x00\x80?", 12);
  const std::vector<lt::ZipEntry> records = {
      {"py/data.pkl", pickle},
      {"py/.format_version", "1"},
      {"py/.storage_alignment", "64"},
      {"py/byteorder", "little"},
      {"py/data/0", ones},
      {"py/version", "3\n"},
      {"py/.data/serialization_id", "1572819951185464302605161138351198565941"},
  };
  const std::string path = dir.file("py.pt");
  lt::write_file(path, lt::zip_archive(records, /*data_descriptors=*/true));
  ASSERT_EQ(lowbit::optim::check_zip_archive(path), "") << "a well-formed zip archive";
  // What libtorch says of it.
  const std::string theirs = lt::error_of([&] {
    torch::serialize::InputArchive a;
    a.load_from(path);
  });
  EXPECT_NE(theirs.find("constants.pkl"), std::string::npos) << theirs;
  Trained victim(2, 4);
  expect_refused(victim, path,
                 {"lowbit checkpoint: '" + path + "' is a zip archive without a checkpoint's entries (no 'py/constants.pkl')",
                  "a torch.save file from Python?", "LowbitOptimizer::save"},
                 dir);
}

// What libtorch would run or read while it loads, before any check of lowbit's could see a
// tensor, is refused by name before libtorch parses the file: a __setstate__ in the TorchScript
// code (run on the unpickled state), a quantized or sparse tensor in data.pkl (per-channel scales
// are converted while unpickling), a custom class. lowbit's writers write none of them.
TEST(CheckpointBadFiles, WhatLibtorchWouldRunWhileLoadingIsRefused) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  Trained original(2, 5);
  const std::string good = dir.file("good.pt");
  torch::save(*original.opt, good);
  // Every record as stored, the code inflated (read_zip_record) so that it can be edited.
  std::vector<lowbit::optim::ZipRecord> records;
  ASSERT_EQ(lowbit::optim::check_zip_archive(good, &records), "");
  const lowbit::optim::ArchiveFile file(good);
  std::vector<lt::ZipEntry> entries;
  for (const auto& r : records) {
    std::string bytes;
    ASSERT_EQ(lowbit::optim::read_zip_record(file, r, &bytes), "");
    entries.push_back({r.name, bytes});
  }
  const auto edited = [&](const std::string& suffix, const std::string& from, const std::string& to) {
    std::vector<lt::ZipEntry> e = entries;
    lt::ZipEntry* r = lt::find_entry_in_folder(e, suffix);
    const size_t at = r ? r->bytes.find(from) : std::string::npos;
    if (at != std::string::npos) r->bytes.replace(at, from.size(), to);
    return at == std::string::npos ? std::string() : lt::zip_archive(e);
  };
  // Inflated and stored again, unedited, it loads: what is refused below is each edit.
  lt::write_file(dir.file("stored.pt"), lt::zip_archive(entries));
  Trained plain(3, 6);
  EXPECT_NO_THROW(lo::load_checkpoint(*plain.opt, dir.file("stored.pt")));
  const struct {
    const char* name;
    std::string bytes, want;
  } cases[] = {
      {"__setstate__", edited("code/__torch__.py", "class ", "# def __setstate__(self, state)\nclass "),
       "record 'good/code/__torch__.py' names __setstate__, which libtorch would run or read while loading"},
      {"quantized tensor", edited("data.pkl", "_rebuild_tensor_v2", "_rebuild_qtensor"),
       "record 'good/data.pkl' names _rebuild_qtensor"},
      {"sparse tensor", edited("data.pkl", "_rebuild_tensor_v2", "_rebuild_sparse_tensor"),
       "record 'good/data.pkl' names _rebuild_sparse_tensor"},
      {"custom class", edited("data.pkl", "__torch__", "__torch__.torch.classes"),
       "record 'good/data.pkl' names torch.classes"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(c.bytes.empty()) << "the edit found nothing to change";
    const std::string bad = dir.file("bad.pt");
    lt::write_file(bad, c.bytes);
    Trained victim(3, 6);
    expect_refused(victim, bad, {c.want, "lowbit checkpoint: '" + bad + "' is not a checkpoint lowbit writes"}, dir);
  }
}
