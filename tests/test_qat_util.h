// Helpers of the QAT tests: the fake-quant ops through the dispatcher, random inputs, configs.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <lowbit/kernels/common/fake_quant_math.h>
#include <lowbit/tensors/fake_quant_ops.h>

#include "test_util.h"

namespace lowbit_qat_test {

using Tensor = at::Tensor;
using T4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using T3 = std::tuple<Tensor, Tensor, Tensor>;
using T2 = std::tuple<Tensor, Tensor>;

// The small network the QAT module tests prepare and convert.
inline torch::nn::Sequential mlp(int64_t in, int64_t hidden, int64_t out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, out));
}

inline T4 op_dynamic(const Tensor& x, int64_t g, int64_t bits, bool is_signed, bool sym, double eps = FLT_EPSILON) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_dynamic", "")
                       .typed<T4(const Tensor&, int64_t, int64_t, bool, bool, double)>();
  return op.call(x, g, bits, is_signed, sym, eps);
}

inline T2 op_static(const Tensor& x, const Tensor& s, const Tensor& z, int64_t g, int64_t bits, bool is_signed) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_static", "")
                       .typed<T2(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, bool)>();
  return op.call(x, s, z, g, bits, is_signed);
}

inline Tensor op_backward(const Tensor& grad, const Tensor& mask) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_backward", "")
                       .typed<Tensor(const Tensor&, const Tensor&)>();
  return op.call(grad, mask);
}

inline T3 op_lsq(const Tensor& dy, const Tensor& x, const Tensor& s, const Tensor& z, int64_t g, int64_t bits,
                 bool is_signed, double factor) {
  static auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("lowbit::fake_quant_lsq_backward", "")
          .typed<T3(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, bool, double)>();
  return op.call(dy, x, s, z, g, bits, is_signed, factor);
}

// Bit-identical, except that a NaN matches any NaN (IEEE leaves a NaN's sign and payload open, and
// ATen's vectorized min / max and our scalar ones pick different ones).
inline bool same_bits_or_both_nan(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const Tensor an = at::isnan(a.cpu()), bn = at::isnan(b.cpu());
  if (!at::equal(an, bn)) return false;
  return lowbit_test::bitwise_equal(at::where(an, at::zeros_like(a.cpu()), a.cpu()), at::where(bn, at::zeros_like(b.cpu()), b.cpu()));
}

struct IntCfg {
  int64_t bits;
  bool is_signed, symmetric;
};

inline std::string name(const IntCfg& c) {
  return std::string(c.is_signed ? "int" : "uint") + std::to_string(c.bits) + (c.symmetric ? " sym" : " asym");
}

inline std::vector<IntCfg> all_int_configs() {
  std::vector<IntCfg> v;
  for (int64_t b = 2; b <= 8; ++b)
    for (bool s : {true, false})
      for (bool sym : {true, false}) v.push_back({b, s, sym});
  return v;
}

// (numel, group_size): per-tensor, odd groups, groups not a multiple of 8, per-token-like rows.
inline std::vector<std::pair<int64_t, int64_t>> shapes() {
  return {{1, 1}, {7, 7}, {39, 3}, {5 * 64, 64}, {1000, 1000}, {33 * 128, 128}, {37 * 17, 17}, {11 * 32, 32},
          {3 * 4099, 4099}, {300 * 12, 12}};
}

// Fresh random values, scales varying per group, some exact zeros, some all-zero groups.
inline Tensor random_groups(int64_t n, int64_t g, at::ScalarType dt) {
  const int64_t ng = n / g;
  Tensor x = at::randn({ng, g}) * at::exp(at::randn({ng, 1}) * 2) + at::randn({ng, 1}) * (at::rand({1}).item<float>() < 0.5 ? 1.0 : 0.0);
  if (n > 3) x.view(-1).index_put_({at::randint(n, {n / 9 + 1}, at::kLong)}, 0.0f);
  if (ng > 2) x[ng / 2].zero_();
  if (dt == at::kHalf) x = x.clamp(-6e4, 6e4);
  return x.view(-1).to(dt);
}

// Scale / zero point a user could set: positive scales near the data's, integer zero points in range.
inline T2 random_qparams(const Tensor& x, int64_t g, const IntCfg& c) {
  const int64_t ng = x.numel() / g;
  const Tensor amax = x.to(at::kFloat).view({ng, g}).abs().amax(1);
  const Tensor s = (amax * (0.3 + at::rand({ng})) / (1 << (c.bits - 1))).clamp_min(1e-6);
  const double qmin = c.is_signed ? -(1 << (c.bits - 1)) : 0, qmax = c.is_signed ? (1 << (c.bits - 1)) - 1 : (1 << c.bits) - 1;
  const Tensor z = c.symmetric ? at::full({ng}, double(int64_t(qmin + qmax + 1) / 2)) : at::randint(int64_t(qmin), int64_t(qmax) + 1, {ng}).to(at::kFloat);
  return {s, z};
}

}  // namespace lowbit_qat_test
