// FakeQuantizer: lays the tensor out in groups, finds its qparams (dynamic, observed or learned),
// and calls the fused fake-quant ops through qat/fake_quant_autograd.
#include "fake_quantizer.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>

#include "fake_quant_autograd.h"
#include "group_layout.h"

namespace lowbit {
namespace qat {
namespace {

using T2 = std::tuple<at::Tensor, at::Tensor>;
using T4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

T2 qparams_from_minmax(const at::Tensor& mn, const at::Tensor& mx, const FakeQuantConfig& c) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_qparams", "")
                       .typed<T2(const at::Tensor&, const at::Tensor&, int64_t, bool, bool, double)>();
  return op.call(mn, mx, c.bits(), c.is_signed(), c.symmetric(), c.eps());
}

T2 dynamic_qparams(const at::Tensor& grouped, int64_t group_size, const FakeQuantConfig& c) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_dynamic", "")
                       .typed<T4(const at::Tensor&, int64_t, int64_t, bool, bool, double)>();
  auto [y, mask, s, z] = op.call(grouped.detach(), group_size, c.bits(), c.is_signed(), c.symmetric(), c.eps());
  return {s, z};
}

}  // namespace

FakeQuantizerImpl::FakeQuantizerImpl(FakeQuantConfig config, std::string who)
    : config_(std::move(config)), who_(std::move(who)) {
  config_.validate(who_);
}

void FakeQuantizerImpl::set_start_step(int64_t steps) {
  TORCH_CHECK(steps >= 0, who_, ": start_step must be >= 0, got ", steps);
  start_step_ = steps;
}

bool FakeQuantizerImpl::active() const {
  return enabled_ && (start_step_ == 0 || steps_ + (is_training() ? 1 : 0) > start_step_);
}

void FakeQuantizerImpl::observe(const at::Tensor& grouped, int64_t group_size) {
  torch::NoGradGuard no_grad;
  const at::Tensor g = grouped.detach().reshape({-1, group_size}).to(at::kFloat);
  const at::Tensor mn = g.amin(1), mx = g.amax(1);
  if (!running_min.defined()) {
    running_min = register_buffer("running_min", mn.clone());
    running_max = register_buffer("running_max", mx.clone());
    return;
  }
  TORCH_CHECK(running_min.numel() == mn.numel(), who_, ": observed ", running_min.numel(), " groups before, now ",
              mn.numel(), " (static qparams need a fixed number of groups)");
  if (config_.qparams() == QParamsMode::MinMax) {
    running_min.copy_(at::minimum(running_min, mn));
    running_max.copy_(at::maximum(running_max, mx));
  } else {  // torch.ao MovingAverageMinMaxObserver: x_run += c * (x_cur - x_run)
    running_min.add_(mn - running_min, config_.averaging_constant());
    running_max.add_(mx - running_max, config_.averaging_constant());
  }
}

void FakeQuantizerImpl::init_learnable(const at::Tensor& x) {
  const GroupLayout l = to_groups(x, config_, who_);
  auto [s, z] = dynamic_qparams(l.grouped, l.group_size, config_);
  if (!scale.defined()) {
    scale = register_parameter("scale", s);
    zero_point = register_parameter("zero_point", z, /*requires_grad=*/!config_.symmetric());
  } else {
    torch::NoGradGuard no_grad;
    scale.copy_(s);
    zero_point.copy_(z);
  }
}

T2 FakeQuantizerImpl::qparams(const at::Tensor& x) {
  const GroupLayout l = to_groups(x, config_, who_);
  switch (config_.qparams()) {
    case QParamsMode::Dynamic: return dynamic_qparams(l.grouped, l.group_size, config_);
    case QParamsMode::MinMax:
    case QParamsMode::MovingAverage:
      TORCH_CHECK(running_min.defined(), who_, ": the ", qparams_mode_name(config_.qparams()),
                  " has observed no data yet; run forward in training mode first");
      return qparams_from_minmax(running_min, running_max, config_);
    case QParamsMode::Learnable: {
      TORCH_CHECK(scale.defined(), who_, ": learnable qparams are not initialised; run forward once first");
      torch::NoGradGuard no_grad;
      return {scale.clamp_min(config_.eps()).contiguous(),
              at::round(zero_point).clamp(config_.qmin(), config_.qmax()).contiguous()};
    }
  }
  TORCH_CHECK(false, who_, ": unknown qparams mode");
}

at::Tensor FakeQuantizerImpl::forward(const at::Tensor& x) {
  if (is_training()) ++steps_;
  // steps_ counts this call too: with start_step = k the first k training calls pass through.
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf, who_,
              ": fake quantization needs a float32, bfloat16 or float16 input, got ", x.scalar_type());
  if (!enabled_ || (start_step_ > 0 && steps_ <= start_step_) || x.numel() == 0) return x;
  const FakeQuantConfig& c = config_;
  if (c.format() == ValueFormat::MXFP4 || c.format() == ValueFormat::NVFP4) {
    const int64_t block = c.format() == ValueFormat::MXFP4 ? 32 : 16;
    TORCH_CHECK(x.dim() >= 1 && x.size(-1) % block == 0, who_, ": ", c.describe(), " needs the last dimension to be a "
                "multiple of ", block, ", got shape ", x.sizes());
    return fake_quant_block_float(x, c.format() == ValueFormat::MXFP4 ? "mxfp4" : "nvfp4", c.eps());
  }
  const GroupLayout l = to_groups(x, config_, who_);
  at::Tensor y;
  if (c.format() != ValueFormat::Integer) {
    const std::string fmt = c.format() == ValueFormat::Float8E4M3 ? "e4m3" : "e5m2";
    return from_groups(fake_quant_float8(l.grouped, l.group_size, fmt, c.eps()), l);
  }
  switch (c.qparams()) {
    case QParamsMode::Dynamic:
      y = fake_quant_dynamic(l.grouped, l.group_size, c.bits(), c.is_signed(), c.symmetric(), c.eps());
      break;
    case QParamsMode::MinMax:
    case QParamsMode::MovingAverage: {
      if (is_training()) observe(l.grouped, l.group_size);
      auto [s, z] = qparams(x);
      y = fake_quant_static(l.grouped, s, z, l.group_size, c.bits(), c.is_signed());
      break;
    }
    case QParamsMode::Learnable: {
      if (!scale.defined()) init_learnable(x);
      TORCH_CHECK(scale.numel() == l.ngroups, who_, ": learnable qparams hold ", scale.numel(), " groups, input has ",
                  l.ngroups);
      // Scale floored at eps; zero point rounded onto the format's grid with a straight-through
      // estimator (LSQ+ offset), as torch's learnable fake quantization does.
      const at::Tensor s = scale.clamp_min(c.eps());
      const at::Tensor z = zero_point + (at::round(zero_point).clamp(c.qmin(), c.qmax()) - zero_point).detach();
      const double g = 1.0 / std::sqrt(double(l.group_size) * double(c.qmax()));  // LSQ gradient scale
      y = fake_quant_learnable(l.grouped, s, z, l.group_size, c.bits(), c.is_signed(), g);
      break;
    }
  }
  return from_groups(y, l);
}

}  // namespace qat
}  // namespace lowbit
