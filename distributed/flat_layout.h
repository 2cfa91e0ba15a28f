// Where each parameter lives in a flat per-(device, dtype) buffer and which range each rank owns.
// Every parameter starts on a multiple of its alignment (256 elements, or its state's block size
// when that is larger: a whole number of quantization blocks); the buffer is cut into world_size equal
// chunks whose size is a multiple of every alignment, so a rank's range starts a block of every
// parameter it cuts. Pure arithmetic: unit-tested without any communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace lowbit {
namespace distributed {

constexpr int64_t kParamAlignment = 256;

struct FlatEntry {
  int64_t numel = 0;
  int64_t block_size = 0;  // the state's block (0: none); the start aligns to lcm(256, block_size)
};

struct FlatLayout {
  std::vector<int64_t> offsets;  // start of each entry in the flat buffer
  int world_size = 1;
  int64_t chunk = 0;             // elements each rank owns
  int64_t total = 0;             // world_size * chunk (>= the last entry's end)
  // The part of entry i that rank r owns, as [begin, end) within the entry (begin == end: none).
  std::pair<int64_t, int64_t> owned(size_t i, int rank, int64_t numel) const;
};

FlatLayout plan_flat_layout(const std::vector<FlatEntry>& entries, int world_size);

}  // namespace distributed
}  // namespace lowbit
