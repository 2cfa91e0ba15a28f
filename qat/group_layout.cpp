// Granularity -> (grouped view, group size): see group_layout.h.
#include "group_layout.h"

namespace lowbit {
namespace qat {

GroupLayout to_groups(const at::Tensor& x, const FakeQuantConfig& c, const std::string& who) {
  GroupLayout l;
  l.grouped = x;
  const int64_t n = x.numel();
  switch (c.granularity()) {
    case Granularity::PerTensor:
      l.group_size = std::max<int64_t>(n, 1);
      break;
    case Granularity::PerToken:
      TORCH_CHECK(x.dim() >= 1, who, ": per-token fake quantization needs at least one dimension, got a scalar");
      l.group_size = std::max<int64_t>(x.size(-1), 1);
      break;
    case Granularity::PerGroup:
      TORCH_CHECK(x.dim() >= 1, who, ": per-group fake quantization needs at least one dimension, got a scalar");
      TORCH_CHECK(x.size(-1) % c.group_size() == 0, who, ": group_size ", c.group_size(),
                  " does not divide the last dimension ", x.size(-1), " (shape ", x.sizes(), ")");
      l.group_size = c.group_size();
      break;
    case Granularity::PerChannel: {
      TORCH_CHECK(x.dim() >= 1, who, ": per-channel fake quantization needs at least one dimension, got a scalar");
      TORCH_CHECK(c.axis() >= -x.dim() && c.axis() < x.dim(), who, ": axis ", c.axis(), " is out of range for shape ",
                  x.sizes());
      const int64_t axis = c.axis() < 0 ? c.axis() + x.dim() : c.axis();
      if (axis != 0) {
        l.grouped = x.movedim(axis, 0);
        l.moved_axis = axis;
      }
      l.group_size = x.size(axis) == 0 ? 1 : std::max<int64_t>(n / x.size(axis), 1);
      break;
    }
  }
  l.ngroups = n / l.group_size;
  return l;
}

at::Tensor from_groups(const at::Tensor& y, const GroupLayout& l) {
  return l.moved_axis == 0 ? y : y.movedim(0, l.moved_axis);
}

}  // namespace qat
}  // namespace lowbit
