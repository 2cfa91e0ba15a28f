// What to fake-quantize and how: bits, signedness, symmetric or not, granularity, where qparams
// come from. One FakeQuantConfig per tensor kind (activations, weights); QatConfig for a model.
#pragma once

#include <torch/torch.h>

#include <cfloat>
#include <functional>
#include <optional>
#include <string>

namespace lowbit {
namespace qat {

// How a tensor is split into groups sharing one (scale, zero point).
enum class Granularity {
  PerTensor,   // one group
  PerChannel,  // one group per index of `axis` (weights: axis 0 = per output row)
  PerGroup,    // group_size consecutive elements along the last dim (weights: the input dim)
  PerToken,    // one group per row of the last dim (activations)
};

// Where scale and zero point come from.
enum class QParamsMode {
  Dynamic,        // from the current tensor at every call (torchao's default for QAT)
  MinMax,         // static: running min / max observed in training mode (torch.ao MinMaxObserver)
  MovingAverage,  // static: moving average of min / max (torch.ao MovingAverageMinMaxObserver)
  Learnable,      // LSQ step size (+ LSQ+ offset when asymmetric), initialised from the first batch
};

// The values a tensor is rounded to.
enum class ValueFormat {
  Integer,     // intN / uintN with scale and zero point (bits, is_signed, symmetric)
  Float8E4M3,  // float8_e4m3fn values times a float32 scale (bits, is_signed, symmetric unused)
  Float8E5M2,  // float8_e5m2 values times a float32 scale
  MXFP4,       // e2m1 values, a power-of-two (e8m0) scale per 32 along the last dim (granularity unused)
  NVFP4,       // e2m1 values, an e4m3 scale per 16 along the last dim times a float32 tensor scale
};

const char* granularity_name(Granularity g);
const char* qparams_mode_name(QParamsMode m);

struct FakeQuantConfig {
  explicit FakeQuantConfig(int64_t bits = 8, bool is_signed = true) : bits_(bits), is_signed_(is_signed) {}
  // intN (is_signed) or uintN, N in 2..8.
  TORCH_ARG(int64_t, bits);
  TORCH_ARG(bool, is_signed);
  TORCH_ARG(bool, symmetric) = true;
  TORCH_ARG(ValueFormat, format) = ValueFormat::Integer;
  TORCH_ARG(Granularity, granularity) = Granularity::PerToken;
  TORCH_ARG(int64_t, axis) = 0;         // PerChannel
  TORCH_ARG(int64_t, group_size) = 32;  // PerGroup
  TORCH_ARG(QParamsMode, qparams) = QParamsMode::Dynamic;
  TORCH_ARG(double, averaging_constant) = 0.01;  // MovingAverage
  TORCH_ARG(double, eps) = FLT_EPSILON;          // the scale's floor (torch.finfo(torch.float32).eps)

 public:  // TORCH_ARG leaves the access at private

  // torchao Int8DynActInt4WeightQATQuantizer's activations: int8, asymmetric, per token, dynamic.
  static FakeQuantConfig int8_per_token_asymmetric();
  // Its weights: int4, symmetric, groups of group_size along the input dim, dynamic.
  static FakeQuantConfig int4_per_group_symmetric(int64_t group_size = 32);
  // int8 symmetric per output channel.
  static FakeQuantConfig int8_per_channel_symmetric();
  // float8 e4m3fn with one dynamic scale per row (torchao's float8 row-wise fake quant).
  static FakeQuantConfig float8_e4m3_per_row();

  int64_t qmin() const { return is_signed_ ? -(int64_t(1) << (bits_ - 1)) : 0; }
  int64_t qmax() const { return is_signed_ ? (int64_t(1) << (bits_ - 1)) - 1 : (int64_t(1) << bits_) - 1; }
  // Refuses a bad config with a message naming `who` (a module or parameter) and the value.
  void validate(const std::string& who) const;
  std::string describe() const;
};

// A model's QAT recipe for qat::prepare.
struct QatConfig {
  TORCH_ARG(std::optional<FakeQuantConfig>, activation) = std::nullopt;  // Linear inputs
  TORCH_ARG(std::optional<FakeQuantConfig>, weight) = std::nullopt;      // Linear weights
  TORCH_ARG(std::optional<FakeQuantConfig>, embedding) = std::nullopt;   // Embedding weights
  // Which modules to swap: called with the dotted name and the module; nullptr = all.
  TORCH_ARG(std::function<bool(const std::string&, const torch::nn::Module&)>, filter) = nullptr;
  // Fake quantization stays off for the first start_step training-mode forward calls (delayed start).
  TORCH_ARG(int64_t, start_step) = 0;

 public:

  // int8 dynamic per-token activations + int4 per-group symmetric weights (torchao 8da4w).
  static QatConfig int8_dynamic_activation_int4_weight(int64_t group_size = 32);
  // int4 per-group symmetric weights only.
  static QatConfig int4_weight_only(int64_t group_size = 32);
};

}  // namespace qat
}  // namespace lowbit
