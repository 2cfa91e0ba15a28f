// FakeQuantConfig / QatConfig: presets, validation with messages naming the module, descriptions.
#include "fake_quant_config.h"

#include <sstream>

namespace lowbit {
namespace qat {

const char* granularity_name(Granularity g) {
  switch (g) {
    case Granularity::PerTensor: return "per-tensor";
    case Granularity::PerChannel: return "per-channel";
    case Granularity::PerGroup: return "per-group";
    case Granularity::PerToken: return "per-token";
  }
  return "?";
}

const char* qparams_mode_name(QParamsMode m) {
  switch (m) {
    case QParamsMode::Dynamic: return "dynamic";
    case QParamsMode::MinMax: return "min-max observer";
    case QParamsMode::MovingAverage: return "moving-average observer";
    case QParamsMode::Learnable: return "learnable (LSQ)";
  }
  return "?";
}

FakeQuantConfig FakeQuantConfig::int8_per_token_asymmetric() {
  return FakeQuantConfig(8, true).symmetric(false).granularity(Granularity::PerToken);
}

FakeQuantConfig FakeQuantConfig::int4_per_group_symmetric(int64_t group_size) {
  return FakeQuantConfig(4, true).symmetric(true).granularity(Granularity::PerGroup).group_size(group_size);
}

FakeQuantConfig FakeQuantConfig::int8_per_channel_symmetric() {
  return FakeQuantConfig(8, true).symmetric(true).granularity(Granularity::PerChannel).axis(0);
}

FakeQuantConfig FakeQuantConfig::float8_e4m3_per_row() {
  return FakeQuantConfig().format(ValueFormat::Float8E4M3).granularity(Granularity::PerToken);
}

void FakeQuantConfig::validate(const std::string& who) const {
  TORCH_CHECK(format_ == ValueFormat::Integer || qparams_ == QParamsMode::Dynamic, who,
              ": float8 fake quantization supports Dynamic qparams only, got ", qparams_mode_name(qparams_));
  TORCH_CHECK(bits_ >= 2 && bits_ <= 8, who, ": bits must be in [2, 8], got ", bits_);
  TORCH_CHECK(granularity_ != Granularity::PerGroup || group_size_ >= 1, who, ": group_size must be >= 1, got ",
              group_size_);
  TORCH_CHECK(std::isfinite(eps_) && eps_ > 0, who, ": eps must be finite and > 0, got ", eps_);
  TORCH_CHECK(averaging_constant_ > 0 && averaging_constant_ <= 1, who, ": averaging_constant must be in (0, 1], got ",
              averaging_constant_);
  // Static and learnable qparams need a fixed number of groups; a token count changes per batch.
  TORCH_CHECK(qparams_ == QParamsMode::Dynamic || granularity_ != Granularity::PerToken, who, ": ",
              qparams_mode_name(qparams_), " qparams need a fixed number of groups; per-token granularity has one "
              "group per token, so use Dynamic, or PerTensor / PerChannel");
}

std::string FakeQuantConfig::describe() const {
  std::ostringstream s;
  if (format_ == ValueFormat::Integer) {
    s << (is_signed_ ? "int" : "uint") << bits_ << " " << (symmetric_ ? "symmetric" : "asymmetric") << " ";
  } else if (format_ == ValueFormat::MXFP4 || format_ == ValueFormat::NVFP4) {
    s << (format_ == ValueFormat::MXFP4 ? "MXFP4 (blocks of 32)" : "NVFP4 (blocks of 16)");
    return s.str();
  } else {
    s << (format_ == ValueFormat::Float8E4M3 ? "float8_e4m3fn " : "float8_e5m2 ");
  }
  s << granularity_name(granularity_);
  if (granularity_ == Granularity::PerGroup) s << " (" << group_size_ << ")";
  if (granularity_ == Granularity::PerChannel) s << " (axis " << axis_ << ")";
  s << " " << qparams_mode_name(qparams_);
  return s.str();
}

QatConfig QatConfig::int8_dynamic_activation_int4_weight(int64_t group_size) {
  return QatConfig()
      .activation(FakeQuantConfig::int8_per_token_asymmetric())
      .weight(FakeQuantConfig::int4_per_group_symmetric(group_size));
}

QatConfig QatConfig::int4_weight_only(int64_t group_size) {
  return QatConfig().weight(FakeQuantConfig::int4_per_group_symmetric(group_size));
}

}  // namespace qat
}  // namespace lowbit
