// The int8 x int8 converted forward (qat/int_mm_linear.h): the integer matmul exact on every shape
// the CPU takes, at::_int_mm's CUDA shape rule, the converted output within the proven bound of the
// fake-quantized model (and the bound tight enough to catch a misplaced scale), the fallback to the
// bit-exact path where the int8 path does not apply, and configs it refuses.
#include <cmath>

#include <lowbit/qat/int_mm_linear.h>

#include "test_qat_util.h"

using namespace lowbit_qat_test;
using lowbit_test::bitwise_equal;
namespace qat = lowbit::qat;
using qat::FakeQuantConfig;
using qat::Granularity;

namespace {

// The bound of int_mm_linear.h for one layer: gamma_{K+G+8} * (|x^| |w^|^T + |bias|), in float64.
// x^ and w^ are the fake-quantized tensors: each within a factor (1 + u) of |a_k| s and |b_k| t_g,
// which the two extra terms of gamma cover.
Tensor bound(const Tensor& xq, const Tensor& wq, const Tensor& bias, int64_t groups) {
  const double u = std::ldexp(1.0, -24), j = double(xq.size(-1) + groups + 10);
  const double gamma = j * u / (1 - j * u);
  Tensor t = at::mm(xq.abs().to(at::kDouble), wq.abs().to(at::kDouble).t());
  if (bias.defined()) t = t + bias.abs().to(at::kDouble).view({1, -1});
  return gamma * t;
}

}  // namespace

TEST(QatIntMm, Int8MatmulIsExactOnEveryCpuShape) {
  for (auto [m, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{1, 1, 1}, {5, 7, 3}, {16, 32, 8}, {17, 32, 8}, {33, 40, 24}, {64, 4096, 16}, {3, 100, 5}}) {
    const Tensor a = at::randint(-128, 128, {m, k}).to(at::kChar);
    const Tensor b = at::randint(-128, 128, {n, k}).to(at::kChar);
    const Tensor got = qat::int8_matmul(a, b.t());  // b as a column-major [k, n] view, as the layer passes it
    EXPECT_EQ(got.scalar_type(), at::kInt);
    EXPECT_TRUE(at::equal(got, qat::int8_matmul_reference(a, b.t()))) << m << " " << k << " " << n;
    EXPECT_TRUE(at::equal(got, at::mm(a.to(at::kLong), b.t().to(at::kLong)).to(at::kInt)));
    EXPECT_TRUE(at::equal(got, at::_int_mm(a, b.t())));  // torch's own integer matmul on the CPU
  }
  // Extremes: every product -128 * -128, k = 4096: 2^26, exact in int32 and in float64.
  const Tensor a = at::full({17, 4096}, -128, at::kChar);
  EXPECT_EQ(qat::int8_matmul(a, a.t()).max().item<int64_t>(), int64_t(1) << 26);
  // 127 * 127 * 4095 = 66048255: odd and above 2^24, so a float32 accumulation cannot hold it.
  const Tensor c = at::full({17, 4095}, 127, at::kChar);
  EXPECT_TRUE(at::equal(qat::int8_matmul(c, c.t()), at::full({17, 17}, 66048255, at::kInt)));
  EXPECT_TRUE(at::equal(qat::int8_matmul(c, c.t()), at::_int_mm(c, c.t())));
  EXPECT_THROW(qat::int8_matmul(a.to(at::kFloat), a.t()), c10::Error);
}

TEST(QatIntMm, CudaShapeRule) {
  EXPECT_TRUE(qat::int_mm_cuda_shape_ok(17, 32, 8));
  EXPECT_FALSE(qat::int_mm_cuda_shape_ok(16, 32, 8));  // m > 16
  EXPECT_FALSE(qat::int_mm_cuda_shape_ok(17, 36, 8));  // k multiple of 8
  EXPECT_FALSE(qat::int_mm_cuda_shape_ok(17, 32, 12)); // n multiple of 8
  EXPECT_FALSE(qat::int_mm_cuda_shape_ok(17, 0, 8));
}

TEST(QatIntMm, WithinTheProvenBoundOfTheFakeQuantizedModel) {
  const std::vector<std::pair<std::string, qat::QatConfig>> configs = {
      {"8da4w g32", qat::QatConfig::int8_dynamic_activation_int4_weight(32)},
      {"8da4w g8", qat::QatConfig::int8_dynamic_activation_int4_weight(8)},
      {"8da8w per-channel", qat::QatConfig().activation(FakeQuantConfig::int8_per_token_asymmetric()).weight(FakeQuantConfig::int8_per_channel_symmetric())},
      {"8da4w per-tensor", qat::QatConfig().activation(FakeQuantConfig::int8_per_token_asymmetric()).weight(FakeQuantConfig(4).granularity(Granularity::PerTensor))},
      {"sym act + int3 g16", qat::QatConfig().activation(FakeQuantConfig(8).granularity(Granularity::PerToken)).weight(FakeQuantConfig::int4_per_group_symmetric(16).bits(3))},
  };
  double worst = 0;  // largest |diff| / bound seen
  int64_t differing = 0, total = 0;
  for (const auto& [label, cfg] : configs) {
    for (int seed = 0; seed < 6; ++seed) {
      torch::manual_seed(seed);
      const int64_t in = 32 * (1 + seed), out = 5 + 8 * seed, rows = 3 + 7 * seed;  // odd shapes, m <= 16 too
      auto model = qat::prepare(torch::nn::Sequential(torch::nn::Linear(in, out)), cfg);
      model->eval();
      auto fq = model[0]->as<qat::FakeQuantizedLinear>();
      const Tensor x = at::randn({rows, in}) * at::exp(at::randn({rows, 1})) + at::randn({rows, 1});
      const Tensor want = model->forward(x).detach();
      const Tensor xq = fq->activation_fake_quant->forward(x).detach();
      const Tensor wq = fq->fake_quantized_weight().detach();
      auto converted = qat::convert(model);
      auto q = converted[0]->as<qat::QuantizedLinear>();
      ASSERT_TRUE(bitwise_equal(converted->forward(x), want)) << label;  // the default path: bit for bit
      EXPECT_EQ(qat::set_int8_matmul(converted), 1) << label;
      ASSERT_TRUE(q->uses_int8_matmul(x));
      const Tensor got = converted->forward(x);
      const Tensor diff = (got.to(at::kDouble) - want.to(at::kDouble)).abs();
      const Tensor b = bound(xq, wq, q->bias, in / std::min(q->group_size, in));
      ASSERT_TRUE((diff <= b).all().item<bool>()) << label << " seed " << seed << ": |diff| " << diff.max().item<double>()
                                                  << " exceeds the bound";
      worst = std::max(worst, (diff / b.clamp_min(1e-300)).max().item<double>());
      differing += (diff > 0).sum().item<int64_t>();
      total += diff.numel();
      qat::set_int8_matmul(converted, false);
      EXPECT_TRUE(bitwise_equal(converted->forward(x), want));
    }
  }
  // The bound is not vacuous: results do differ in the last bits, and stay well inside it.
  std::printf("int8 path: %lld of %lld outputs differ from the fake-quantized model; largest |diff| / bound %.3g\n",
              (long long)differing, (long long)total, worst);
  EXPECT_GT(differing, 0);
}

TEST(QatIntMm, BoundIsTightEnoughToCatchAMisplacedScale) {
  // The same formula with the zero-point correction dropped, or with each group's scale shifted
  // to its neighbour, must leave the bound: otherwise the bound test could not see such bugs.
  torch::manual_seed(0);
  const int64_t m = 24, k = 64, n = 16, g = 32;
  auto model = qat::prepare(torch::nn::Sequential(torch::nn::Linear(k, n)), qat::QatConfig::int8_dynamic_activation_int4_weight(g));
  model->eval();
  auto fq = model[0]->as<qat::FakeQuantizedLinear>();
  const Tensor x = at::randn({m, k}) + 0.5;
  const Tensor want = model->forward(x).detach();
  const Tensor b = bound(fq->activation_fake_quant->forward(x).detach(), fq->fake_quantized_weight().detach(), fq->bias.detach(), k / g);
  auto converted = qat::convert(model);  // keeps the layer alive
  auto q = converted[0]->as<qat::QuantizedLinear>();
  auto [xs, xz] = q->activation_fake_quant->qparams(x);
  const Tensor codes = lowbit::ops::quantize_codes_reference(x, xs, xz, k, 8, true);
  const Tensor xq = (codes.to(at::kInt) - 128).to(at::kChar);
  const Tensor w = (qat::unpack_rows(q->packed, 4, k).to(at::kInt) - 8).to(at::kChar);
  auto within = [&](const Tensor& y) { return ((y.to(at::kDouble) - want.to(at::kDouble)).abs() <= b).all().item<bool>(); };
  EXPECT_TRUE(within(qat::int_mm_linear(xq, xs.view(-1), xz.view(-1), w, q->scale, g, q->bias)));
  EXPECT_FALSE(within(qat::int_mm_linear(xq, xs.view(-1), at::zeros({m}), w, q->scale, g, q->bias)));
  EXPECT_FALSE(within(qat::int_mm_linear(xq, xs.view(-1), xz.view(-1), w, q->scale.view({n, 2}).flip(1).contiguous().view(-1), g, q->bias)));
}

TEST(QatIntMm, RefusesConfigsItCannotRun) {
  auto weight_only = qat::convert(qat::prepare(mlp(32, 16, 8), qat::QatConfig::int4_weight_only(16)));
  EXPECT_EQ(qat::set_int8_matmul(weight_only), 0);
  try {
    weight_only[0]->as<qat::QuantizedLinear>()->set_int8_matmul(true);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("0: the int8 x int8 matmul cannot run this layer: it needs int8 activations"),
              std::string::npos) << e.what();
  }
  auto asym_w = qat::convert(qat::prepare(mlp(32, 16, 8), qat::QatConfig().activation(FakeQuantConfig::int8_per_token_asymmetric())
                                                             .weight(FakeQuantConfig(4).symmetric(false).granularity(Granularity::PerGroup).group_size(16))));
  EXPECT_EQ(qat::set_int8_matmul(asym_w), 0);
  EXPECT_NE(qat::int_mm_config_problem(FakeQuantConfig::int8_per_token_asymmetric(), FakeQuantConfig(4).symmetric(false)).find("signed symmetric"),
            std::string::npos);
  EXPECT_NE(qat::int_mm_config_problem(FakeQuantConfig(4).granularity(Granularity::PerToken), FakeQuantConfig(4)).find("int8 (signed) per-token"),
            std::string::npos);
}

TEST(QatIntMm, CudaUsesIntMmWhereItAppliesAndFallsBackBitExactElsewhere) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(0);
  for (int64_t rows : {5, 16, 17, 64}) {
    auto model = qat::prepare(torch::nn::Sequential(torch::nn::Linear(128, 64)), qat::QatConfig::int8_dynamic_activation_int4_weight(32));
    model->eval();
    const Tensor x = at::randn({rows, 128});
    auto cpu = qat::convert(model);
    qat::set_int8_matmul(cpu);
    const Tensor want_int = cpu->forward(x);
    model->to(at::kCUDA);
    const Tensor xc = x.cuda();
    const Tensor want_fake = model->forward(xc).detach();
    auto converted = qat::convert(model);
    qat::set_int8_matmul(converted);
    auto q = converted[0]->as<qat::QuantizedLinear>();
    const Tensor got = converted->forward(xc);
    if (rows > 16) {
      ASSERT_TRUE(q->uses_int8_matmul(xc));
      // Integer sums exact, then the same elementwise float32 ops in the same order: the CPU's result.
      EXPECT_TRUE(bitwise_equal(got.cpu(), want_int)) << rows;
    } else {
      ASSERT_FALSE(q->uses_int8_matmul(xc));
      EXPECT_TRUE(bitwise_equal(got, want_fake)) << rows;  // the dequantize fallback: bit for bit
    }
  }
}
