// The kernels' own bf16/fp16 conversions must round exactly as ATen's casts do.
#include <lowbit/kernels/common/float_convert.h>

#include "test_util.h"

namespace lk = lowbit::kernels;

TEST(FloatConvert, EveryHalfAndBFloat16ToFloat) {
  const at::Tensor bits = at::arange(65536, at::kInt).to(at::kShort);
  const at::Tensor h = bits.view(at::kHalf).to(at::kFloat);
  const at::Tensor b = bits.view(at::kBFloat16).to(at::kFloat);
  for (int i = 0; i < 65536; ++i) {
    const float want_h = h[i].item<float>(), want_b = b[i].item<float>();
    const float got_h = lk::to_f32(lk::f16_t{uint16_t(i)}), got_b = lk::to_f32(lk::bf16_t{uint16_t(i)});
    if (std::isnan(want_h)) ASSERT_TRUE(std::isnan(got_h)) << i;
    else ASSERT_EQ(lk::f32_bits(got_h), lk::f32_bits(want_h)) << i;
    if (std::isnan(want_b)) ASSERT_TRUE(std::isnan(got_b)) << i;
    else ASSERT_EQ(lk::f32_bits(got_b), lk::f32_bits(want_b)) << i;
  }
}

TEST(FloatConvert, FloatToHalfAndBFloat16RoundsToNearestEven) {
  // Random bit patterns cover every exponent; add ties, overflow edges and subnormals.
  at::Tensor x = at::randint(INT32_MIN, INT32_MAX, {1 << 20}, at::kInt).view(at::kFloat);
  std::vector<float> extra = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, 2.98023224e-8f, 5.96e-8f,
                              6.1e-5f, 6.097555e-5f, 1.0009765625f, 1.00048828125f, INFINITY, -INFINITY};
  x = at::cat({x, at::tensor(extra)});
  const at::Tensor h = x.to(at::kHalf).view(at::kShort), b = x.to(at::kBFloat16).view(at::kShort);
  const float* xp = x.data_ptr<float>();
  const int16_t* hp = h.data_ptr<int16_t>();
  const int16_t* bp = b.data_ptr<int16_t>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (std::isnan(xp[i])) continue;
    ASSERT_EQ(lk::from_f32<lk::f16_t>(xp[i]).bits, uint16_t(hp[i])) << xp[i];
    ASSERT_EQ(lk::from_f32<lk::bf16_t>(xp[i]).bits, uint16_t(bp[i])) << xp[i];
  }
}
