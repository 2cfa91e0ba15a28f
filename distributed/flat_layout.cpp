// plan_flat_layout: offsets, padding and the equal, block-aligned chunks of the ranks.
#include "flat_layout.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

namespace lowbit {
namespace distributed {

FlatLayout plan_flat_layout(const std::vector<FlatEntry>& entries, int world_size) {
  TORCH_CHECK(world_size >= 1, "plan_flat_layout: world_size must be >= 1, got ", world_size);
  FlatLayout l;
  l.world_size = world_size;
  int64_t end = 0, chunk_align = kParamAlignment;
  for (size_t i = 0; i < entries.size(); ++i) {
    const FlatEntry& e = entries[i];
    TORCH_CHECK(e.numel >= 0 && e.block_size >= 0, "plan_flat_layout: entry ", i, " has numel ", e.numel,
                " and block_size ", e.block_size);
    const int64_t align = e.block_size > 0 ? std::lcm(kParamAlignment, e.block_size) : kParamAlignment;
    chunk_align = std::lcm(chunk_align, align);
    const int64_t start = (end + align - 1) / align * align;
    l.offsets.push_back(start);
    end = start + e.numel;
  }
  const int64_t per_rank = (end + world_size - 1) / world_size;
  l.chunk = (per_rank + chunk_align - 1) / chunk_align * chunk_align;
  l.total = l.chunk * world_size;
  return l;
}

std::pair<int64_t, int64_t> FlatLayout::owned(size_t i, int rank, int64_t numel) const {
  const int64_t lo = static_cast<int64_t>(rank) * chunk, hi = lo + chunk;
  const int64_t b = std::max(lo, offsets[i]), e = std::min(hi, offsets[i] + numel);
  if (b >= e) return {0, 0};
  return {b - offsets[i], e - offsets[i]};
}

}  // namespace distributed
}  // namespace lowbit
