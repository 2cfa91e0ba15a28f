// Maps a granularity onto the layout every fake-quant op takes: contiguous groups of group_size
// elements in logical order. Only PerChannel with an axis other than the first moves a dimension.
#pragma once

#include <string>

#include "fake_quant_config.h"

namespace lowbit {
namespace qat {

struct GroupLayout {
  at::Tensor grouped;      // x, or x.movedim(axis, 0): its logical order is the groups' order
  int64_t group_size = 1;
  int64_t ngroups = 0;
  int64_t moved_axis = 0;  // 0: nothing moved
};

// Checks that `config` fits x's shape (messages name `who` and the values).
GroupLayout to_groups(const at::Tensor& x, const FakeQuantConfig& config, const std::string& who);
// y shaped like layout.grouped back to x's layout.
at::Tensor from_groups(const at::Tensor& y, const GroupLayout& layout);

}  // namespace qat
}  // namespace lowbit
