// plan_flat_layout: aligned starts, equal block-aligned chunks, owned ranges that tile each parameter.
#include "dist_util.h"

namespace lowbit_test {
namespace {

TEST(FlatLayout, AlignedStartsAndChunksThatTileEveryParameter) {
  const std::vector<ld::FlatEntry> entries = {{5000, 256}, {6400, 128}, {300, 1024}, {7, 1024}, {12291, 2048}, {1, 0}};
  for (int world = 1; world <= 5; ++world) {
    const ld::FlatLayout l = ld::plan_flat_layout(entries, world);
    EXPECT_EQ(l.total, l.chunk * world);
    EXPECT_EQ(l.chunk % 2048, 0) << "chunks must be whole blocks of the largest block size";
    int64_t end = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const int64_t align = std::max<int64_t>(256, entries[i].block_size);
      EXPECT_EQ(l.offsets[i] % align, 0) << "entry " << i;
      EXPECT_GE(l.offsets[i], end) << "entries overlap";
      end = l.offsets[i] + entries[i].numel;
      // The owned ranges of all ranks tile the entry, each starting on a block of it.
      int64_t covered = 0;
      for (int r = 0; r < world; ++r) {
        const auto o = l.owned(i, r, entries[i].numel);
        if (o.first == o.second) continue;
        EXPECT_EQ(o.first, covered) << "entry " << i << " rank " << r;
        if (entries[i].block_size > 0) EXPECT_EQ(o.first % entries[i].block_size, 0);
        covered = o.second;
      }
      EXPECT_EQ(covered, entries[i].numel) << "entry " << i << " world " << world;
    }
    EXPECT_GE(l.total, end);
    EXPECT_LT(l.total - end, world * 2048 + 2048) << "padding beyond alignment";
  }
}

TEST(FlatLayout, BadArgumentsAreNamed) {
  EXPECT_THROW(ld::plan_flat_layout({{10, 0}}, 0), c10::Error);
  try {
    ld::plan_flat_layout({{-1, 0}}, 2);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("entry 0 has numel -1"), std::string::npos);
  }
}

}  // namespace
}  // namespace lowbit_test
