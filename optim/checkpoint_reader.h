// Reading a lowbit optimizer checkpoint: every entry read and checked (version, format ids, block
// sizes, tensor dtypes and sizes, version 2's digests) into plain structs before anything is
// assigned. Shared by LowbitOptimizer::load and `lowbit inspect`.
#pragma once

#include <torch/serialize/input-archive.h>

#include <map>
#include <string>
#include <vector>

#include "../tensors/qtensor.h"

#include "state_format.h"

namespace lowbit {
namespace optim {

constexpr int64_t kCheckpointMagic = 0x6C6F7762697401;  // "lowbit" + 1
constexpr int64_t kCheckpointVersionDigests = 2;       // first version with digests
constexpr int64_t kMaxCheckpointCount = int64_t(1) << 40;  // above any real count of groups, parameters, steps

// Storage ids of a master-weight correction (the last slot; kernels/common/master_weight.h).
constexpr int64_t kStorageInt16Correction = 5, kStorageInt8Correction = 6;
inline bool is_correction_storage(int64_t id) { return id == kStorageInt16Correction || id == kStorageInt8Correction; }

// The storage id of a slot held in a state format's family: FP32..FP8 their StateFormat id (0..4);
// the formats added after the corrections took 5 and 6 go on from 7 (C8 = 7). One mapping for the
// writer, the reader and `lowbit inspect`.
inline int64_t storage_id_of(StateFormat f) {
  const int64_t id = static_cast<int64_t>(f);
  return id < kStorageInt16Correction ? id : id + 2;
}
constexpr int64_t kMaxStorageId = kNumStateFormats - 1 + 2;
// The state format of a storage id in [0, kMaxStorageId] that is not a correction.
inline StateFormat state_format_of_storage(int64_t id) {
  return static_cast<StateFormat>(id < kStorageInt16Correction ? id : id - 2);
}

// One state slot as stored: storage -1 (unused), a state format's storage id (FP32, BF16: `values`;
// Q8, Q4, FP8, C8: `codes` + `absmax` in QuantFormat `qformat`), or a correction id (`values`,
// int16 / int8).
struct CheckpointSlot {
  int64_t storage = -1;
  int64_t qformat = -1;
  at::Tensor values, codes, absmax;
  QTensor quantized;  // codes + absmax, checked to fit numel and the block size
};

struct CheckpointParam {
  int64_t numel = 0;
  int64_t offset = 0;
  bool has_state = false;
  int64_t step = 0;
  int64_t format = 0;  // StateFormat id
  int64_t block_size = 0;
  std::vector<CheckpointSlot> slots;
};

struct CheckpointGroup {
  double lr = 0;
  std::vector<CheckpointParam> params;
};

struct CheckpointContents {
  int64_t version = 0;
  std::string optimizer;
  int64_t seed = 0;
  int64_t skipped_steps = 0;
  std::vector<CheckpointGroup> groups;
};

// Reads and checks everything a checkpoint says about itself; throws c10::Error naming the entry
// and the bad value. `who` prefixes messages (the optimizer's name, or the file).
CheckpointContents read_checkpoint(torch::serialize::InputArchive& archive, const std::string& who);

// Before libtorch reads a file: a regular file (a FIFO, directory or device is refused before
// anything opens it: checkpoint_zip.h's ArchiveFile), a well-formed zip archive (end record,
// central directory, local headers, records inside the file and apart) whose every record matches
// its CRC-32 (checkpoint_zip.h), and an archive of the layout torch::save writes (a folder holding
// version, constants.pkl and data.pkl: a torch.save file from Python is named as such), its
// tensors' records stored, and nothing in it that libtorch would run or read while loading (a
// __setstate__, a custom class, a quantized or sparse tensor). libtorch checks none of it; a
// damaged size field would make it allocate what the field says, and a damaged pickle corrupts
// its heap.
void check_checkpoint_file(const std::string& path);

// check_checkpoint_file, then libtorch's reader on the same open file (tensors mapped to the cpu),
// then every tensor the archive holds against the record libtorch read its storage from: the
// pickle sets a storage's size and a tensor's sizes, strides and offset, and libtorch checks
// none of them against the record's bytes, so a storage can reach past the buffer that holds
// them. Whatever libtorch throws on a damaged file (it raises std::out_of_range and the like from
// its parsers) becomes a c10::Error naming the file.
void load_checkpoint_archive(const std::string& path, torch::serialize::InputArchive& archive);

// Digests (format version 2). A tensor's: its entry's key (so that tensors swapped with their
// digests are caught), dtype, sizes and bytes. The header's: every non-tensor entry (key and
// value, in key order) but the header digest itself.
int64_t tensor_digest(const std::string& key, const at::Tensor& t);
int64_t header_digest(const std::map<std::string, c10::IValue>& entries);

// Checks of one stored state tensor, shared by read_checkpoint and the fragment reader
// (distributed/sharded_checkpoint.cpp); each throws c10::Error naming `who`, the entry `key` and
// the bad value.
// A defined, flat (1-D), strided cpu tensor of `dtype`: how every writer stores state; first of
// all, the bytes its sizes, strides and storage offset reach lie inside its storage
// (check_tensor_extent), so that no check after it reads past the storage.
void check_stored_tensor(const std::string& who, const std::string& key, const at::Tensor& t, at::ScalarType dtype);
// A strided tensor whose sizes, strides and storage offset are >= 0 and reach no byte past its
// storage's size.
void check_tensor_extent(const std::string& who, const std::string& key, const at::Tensor& t);
// tensor_digest(key, t) is the digest the file recorded for it.
void check_tensor_digest(const std::string& who, const std::string& key, const at::Tensor& t, int64_t recorded);
// A block size `format` accepts as it is (a power of two in its range), as every writer stores it.
void check_quant_block_size(const std::string& who, const std::string& key, QuantFormat format, int64_t block_size);
// Block scales (absmax) finite and >= 0, as the quantizer writes them.
void check_block_scales(const std::string& who, const std::string& key, const at::Tensor& absmax);
// Codes whose value in `format` is finite (the encoders never write float8's Inf / NaN codes).
void check_codes_finite(const std::string& who, const std::string& key, const at::Tensor& codes, QuantFormat format);

}  // namespace optim
}  // namespace lowbit
