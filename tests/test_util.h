// Helpers shared by the C++ tests: random inputs, bitwise comparison, the reference ops.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <torch/torch.h>

#include <lowbit/lowbit.h>
#include <lowbit/tensors/blockwise_ops.h>

namespace lowbit_test {

// The message of the c10::Error that f throws, or "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// Fresh random data each call: a mix of scales per block so absmax varies, with a few exact zeros.
inline at::Tensor random_input(int64_t n, at::ScalarType dtype = at::kFloat, bool nonnegative = false) {
  at::Tensor x = at::randn({n}, at::kFloat) * at::exp(at::randn({n}, at::kFloat) * 2);
  if (n > 3) x.index_put_({at::randint(n, {n / 7 + 1}, at::kLong)}, 0.0f);
  if (nonnegative) x = x.abs();
  if (dtype == at::kHalf) x = x.clamp(-6e4, 6e4);  // stay finite in float16
  return x.to(dtype);
}

inline bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const at::Tensor ac = a.cpu().contiguous(), bc = b.cpu().contiguous();
  if (ac.nbytes() == 0) return true;  // an empty tensor's data pointer may be null, which memcmp must not get
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.nbytes()) == 0;
}

inline std::tuple<at::Tensor, at::Tensor> reference_quantize(const at::Tensor& x, lowbit::QuantFormat f, int64_t b) {
  return lowbit::ops::quantize_reference(x, lowbit::format_name(f), b);
}

inline std::tuple<at::Tensor, at::Tensor> op_quantize(const at::Tensor& x, lowbit::QuantFormat f, int64_t b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::quantize_blockwise", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, std::string_view, int64_t)>();
  return op.call(x, lowbit::format_name(f), b);
}

inline std::vector<lowbit::QuantFormat> all_formats() {
  std::vector<lowbit::QuantFormat> v;
  for (int i = 0; i < lowbit::kNumQuantFormats; ++i) v.push_back(static_cast<lowbit::QuantFormat>(i));
  return v;
}

// Largest error |x - decode(encode(x))| / absmax over normalized x in the format's range:
// half the widest gap between neighbouring codebook values, or the distance from a range end to
// the nearest codebook value (clamping), whichever is larger.
inline double roundtrip_bound(lowbit::QuantFormat f) {
  const at::Tensor cb = lowbit::codebook(f);
  std::vector<double> v;
  for (int64_t i = 0; i < cb.numel(); ++i) {
    const double x = cb[i].item<float>();
    if (std::isfinite(x)) v.push_back(x);
  }
  std::sort(v.begin(), v.end());
  const double lo = lowbit::format_is_signed(f) ? -1.0 : 0.0;
  double bound = std::max(v.front() - lo, 1.0 - v.back());
  for (size_t i = 0; i + 1 < v.size(); ++i)
    if (v[i + 1] >= lo) bound = std::max(bound, (v[i + 1] - v[i]) / 2);
  // The companded formats round sqrt|x| to the nearest step, not x to the nearest value: the
  // crossover of neighbours c/m, (c+1)/m sits ((c+1/2)/m)^2, 1/(4 m^2) below their value midpoint.
  if (lowbit::is_arithmetic_format(f)) {
    const double m = lowbit::format_is_signed(f) ? 127.0 : 255.0;
    bound += 0.25 / (m * m);
  }
  // Slack for the float rounding of decode (codebook * absmax) and of the error itself.
  return bound + 1e-6;
}

}  // namespace lowbit_test
