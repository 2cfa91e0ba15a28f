// A checked call (optim_ops.h: StepCall) as the kernels' launches (kernels/common/step_launch.h),
// for every backend's binding: the records check_step_call made, grouped by parameter dtype.
#include "blockwise_ops.h"
#include "optim_ops.h"

namespace lowbit {
namespace ops {

void make_launches(const StepCall& c, bool copy_strided, StepLaunches* out) {
  StepLaunches& l = *out;
  std::vector<at::ScalarType> dtypes;
  for (size_t i = 0; i < c.params.size(); ++i) {
    const StepParam& p = c.params[i];
    if (!p.param_contiguous && !copy_strided) {
      l.strided.push_back(i);
      continue;
    }
    size_t d = 0;
    while (d < dtypes.size() && dtypes[d] != p.param_type) ++d;
    if (d == dtypes.size()) {
      dtypes.push_back(p.param_type);
      l.index.emplace_back();
      l.refs.emplace_back();
    }
    kernels::StepParamRef r = c.refs[i];
    const int64_t numel = r.numel;
    const auto copy = [&](const at::Tensor& t) {
      l.copies.push_back(t.contiguous());
      return l.copies.back().data_ptr();
    };
    if (!p.param_contiguous && numel > 0) r.param = copy(*p.param);
    if (!r.grad && numel > 0 && !p.grad->is_meta()) r.grad = copy(*p.grad);
    r.aligned = kernels::aligned16(r) ? 1 : 0;
    l.index[d].push_back(i);
    l.refs[d].push_back(r);
  }
  for (size_t d = 0; d < dtypes.size(); ++d) {
    kernels::StepLaunch s;
    s.config = c.config;
    for (int k = 0; k < kernels::kMaxSlots; ++k) s.slots[k] = c.slots[k];
    s.num_slots = c.num_slots;
    s.block_size = c.block_size;
    s.param_type = elem_type(dtypes[d]);
    s.lr = c.lr.const_data_ptr();
    s.lr_is_double = c.lr.scalar_type() == at::kDouble;
    s.found_inf = c.found_inf ? c.found_inf->const_data_ptr<float>() : nullptr;
    s.grad_sumsq = c.grad_sumsq ? c.grad_sumsq->const_data_ptr<double>() : nullptr;
    s.max_grad_norm = c.max_grad_norm;
    s.grad_scale = c.grad_scale ? c.grad_scale->const_data_ptr<float>() : nullptr;
    s.seed = c.seed;
    s.stochastic_round = c.stochastic_round;
    s.params = l.refs[d].data();
    s.n = static_cast<int64_t>(l.refs[d].size());
    s.scalar_loop = c.scalar_loop;
    l.launches.push_back(s);
  }
}

}  // namespace ops
}  // namespace lowbit
