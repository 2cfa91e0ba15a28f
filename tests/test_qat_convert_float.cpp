// qat::convert for the float formats (float8 e4m3 / e5m2 per tensor, row or group; MXFP4; NVFP4):
// code tables against ATen's float8 dtypes, converted outputs equal to the fake-quantized model's
// bit for bit over seeds and shapes, the bytes each packed format promises, save / load.
#include <cstdio>

#include <lowbit/kernels/common/float_codes.h>
#include <lowbit/tensors/float_code_tensors.h>

#include "test_qat_util.h"

using namespace lowbit_qat_test;
using lowbit_test::bitwise_equal;
namespace qat = lowbit::qat;
namespace kernels = lowbit::kernels;
using qat::FakeQuantConfig;
using qat::Granularity;
using qat::ValueFormat;

namespace {

FakeQuantConfig fmt(ValueFormat f, Granularity g = Granularity::PerToken, int64_t group = 32) {
  return FakeQuantConfig().format(f).granularity(g).group_size(group);
}

struct Case {
  std::string label;
  qat::QatConfig config;
};

std::vector<Case> float_cases() {
  return {
      {"e4m3 per-row", qat::QatConfig().weight(fmt(ValueFormat::Float8E4M3))},
      {"e4m3 per-tensor", qat::QatConfig().weight(fmt(ValueFormat::Float8E4M3, Granularity::PerTensor))},
      {"e4m3 per-channel", qat::QatConfig().weight(fmt(ValueFormat::Float8E4M3, Granularity::PerChannel))},
      {"e5m2 per-row", qat::QatConfig().weight(fmt(ValueFormat::Float8E5M2))},
      {"e5m2 per-group(16)", qat::QatConfig().weight(fmt(ValueFormat::Float8E5M2, Granularity::PerGroup, 16))},
      {"e4m3 weights + e4m3 activations", qat::QatConfig().weight(fmt(ValueFormat::Float8E4M3)).activation(fmt(ValueFormat::Float8E4M3))},
      {"MXFP4", qat::QatConfig().weight(fmt(ValueFormat::MXFP4))},
      {"MXFP4 + int8 activations", qat::QatConfig().weight(fmt(ValueFormat::MXFP4)).activation(FakeQuantConfig::int8_per_token_asymmetric())},
      {"NVFP4", qat::QatConfig().weight(fmt(ValueFormat::NVFP4))},
      {"NVFP4 + NVFP4 activations", qat::QatConfig().weight(fmt(ValueFormat::NVFP4)).activation(fmt(ValueFormat::NVFP4))},
  };
}

// Rows of very different magnitudes (float8 subnormals, NVFP4 block scales at their clamp), some
// exact zeros and an all-zero row.
void spread_weights(torch::nn::Module& m) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters()) {
    if (p.dim() != 2) continue;
    p.mul_(at::exp(at::randn({p.size(0), 1}) * 3));
    p.view(-1).index_put_({at::randint(p.numel(), {p.numel() / 7 + 1}, at::kLong)}, 0.0f);
    p[p.size(0) / 2].zero_();
  }
}

}  // namespace

TEST(QatConvertFloat, CodeTablesMatchAtenFloat8AndE2M1) {
  const at::Tensor all = at::arange(256, at::kInt).to(at::kByte);
  for (auto [e4m3, dt] : {std::pair<bool, at::ScalarType>{true, at::kFloat8_e4m3fn}, {false, at::kFloat8_e5m2}}) {
    const kernels::Float8Format f = kernels::fq_float8_format(e4m3);
    EXPECT_EQ(kernels::fq_float_code_bits(f), 8);
    const at::Tensor table = lowbit::ops::float_code_table(f, at::kCPU);
    const at::Tensor aten = all.view(dt).to(at::kFloat);
    // Every code of a finite value up to the format's max decodes as ATen's dtype does (sign of zero included).
    const at::Tensor valid = at::logical_and(at::isfinite(aten), aten.abs() <= f.max_value);
    EXPECT_TRUE(bitwise_equal(table.index({valid}), aten.index({valid}))) << e4m3;
    EXPECT_EQ(valid.sum().item<int64_t>(), e4m3 ? 254 : 248);
    // encode is the inverse on them.
    EXPECT_TRUE(at::equal(lowbit::ops::encode_float_codes(aten.index({valid}), f, "test"), all.index({valid})));
  }
  const kernels::Float8Format e2m1 = kernels::fq_e2m1_format();
  EXPECT_EQ(kernels::fq_float_code_bits(e2m1), 4);
  const at::Tensor t = lowbit::ops::float_code_table(e2m1, at::kCPU);
  const std::vector<float> want = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  EXPECT_TRUE(bitwise_equal(t, at::tensor(want)));
  EXPECT_TRUE(at::equal(lowbit::ops::encode_float_codes(t, e2m1, "test"), at::arange(16, at::kInt).to(at::kByte)));
  // A value the format does not hold is refused, not silently mis-coded.
  EXPECT_THROW(lowbit::ops::encode_float_codes(at::tensor({2.5f}), e2m1, "test"), c10::Error);
  EXPECT_THROW(lowbit::ops::encode_float_codes(at::tensor({NAN}), e2m1, "test"), c10::Error);
  // e8m0: every power of two the MX scale takes, 2^-127 (a float32 subnormal) to 2^127.
  const at::Tensor e = at::arange(-127, 128, at::kDouble);
  const at::Tensor pow2 = at::pow(2.0, e).to(at::kFloat);
  const at::Tensor codes = lowbit::ops::encode_e8m0(pow2);
  EXPECT_TRUE(at::equal(codes.to(at::kLong), (e + 127).to(at::kLong)));
  EXPECT_TRUE(bitwise_equal(lowbit::ops::decode_e8m0(codes), pow2));
}

TEST(QatConvertFloat, RoundingEqualsTheKernelsRounding) {
  // round_to_float_format (what convert stores) against fq_float8_round (what the kernels apply).
  const at::Tensor v = at::cat({at::randn({20000}) * at::exp(at::randn({20000}) * 6), at::tensor({0.0f, -0.0f, 1e-30f})});
  for (const kernels::Float8Format f : {kernels::fq_float8_format(true), kernels::fq_float8_format(false), kernels::fq_e2m1_format()}) {
    const at::Tensor c = v.clamp(-f.max_value, f.max_value).contiguous();
    const at::Tensor got = lowbit::ops::round_to_float_format(c, f);
    at::Tensor want = at::empty_like(c);
    for (int64_t i = 0; i < c.numel(); ++i) want.data_ptr<float>()[i] = kernels::fq_float8_round(c.data_ptr<float>()[i], f);
    EXPECT_TRUE(bitwise_equal(got, want)) << f.mantissa_bits;
  }
}

TEST(QatConvertFloat, ConvertedModelEqualsFakeQuantizedModelBitForBit) {
  for (const Case& c : float_cases()) {
    for (int seed = 0; seed < 6; ++seed) {
      torch::manual_seed(100 + seed);
      const int64_t in = 32 * (1 + seed % 3), hidden = 64 + 32 * (seed % 2), out = 3 + 2 * seed;  // odd outputs
      auto model = qat::prepare(mlp(in, hidden, out), c.config);
      spread_weights(*model);
      const Tensor x = at::randn({2, 5 + seed, in}) * 3;
      model->eval();
      const Tensor want = model->forward(x).detach();
      std::vector<Tensor> fq_weights;
      for (const auto& m : model->modules())
        if (auto f = std::dynamic_pointer_cast<qat::FakeQuantizedLinearImpl>(m)) fq_weights.push_back(f->fake_quantized_weight().detach());
      auto converted = qat::convert(model);
      ASSERT_TRUE(converted[0]->as<qat::QuantizedLinear>() != nullptr) << c.label;
      const Tensor got = converted->forward(x);
      ASSERT_TRUE(bitwise_equal(got, want)) << c.label << " seed " << seed << " max diff "
                                            << (got - want).abs().max().item<float>();
      size_t i = 0;
      for (const auto& m : converted->modules())
        if (auto q = std::dynamic_pointer_cast<qat::QuantizedLinearImpl>(m))
          EXPECT_TRUE(bitwise_equal(q->dequantized_weight(), fq_weights[i++])) << c.label << " layer " << i;
    }
  }
}

TEST(QatConvertFloat, BytesAreWhatThePackedFormatPromises) {
  const int64_t out = 48, in = 96;
  struct Want {
    FakeQuantConfig cfg;
    int64_t bytes;
  };
  const std::vector<Want> wants = {
      {fmt(ValueFormat::Float8E4M3), out * in + 4 * out},                                    // byte + fp32 per row
      {fmt(ValueFormat::Float8E5M2, Granularity::PerTensor), out * in + 4},                  // byte + one fp32
      {fmt(ValueFormat::Float8E4M3, Granularity::PerGroup, 32), out * in + 4 * out * in / 32},
      {fmt(ValueFormat::MXFP4), out * in / 2 + out * in / 32},                               // 4.25 bits
      {fmt(ValueFormat::NVFP4), out * in / 2 + out * in / 16 + 4},                           // 4.5 bits + 4 bytes
  };
  for (const Want& w : wants) {
    auto model = qat::convert(qat::prepare(torch::nn::Sequential(torch::nn::Linear(in, out)), qat::QatConfig().weight(w.cfg)));
    auto q = model[0]->as<qat::QuantizedLinear>();
    ASSERT_TRUE(q != nullptr);
    EXPECT_EQ(q->weight_bytes(), w.bytes) << w.cfg.describe();
    EXPECT_EQ(qat::float_weight_bytes(w.cfg, out, in, q->group_size), w.bytes) << w.cfg.describe();
    EXPECT_EQ(q->packed.scalar_type(), at::kByte);
    EXPECT_EQ(q->packed.numel(), out * in / (w.cfg.format() == ValueFormat::MXFP4 || w.cfg.format() == ValueFormat::NVFP4 ? 2 : 1));
  }
}

TEST(QatConvertFloat, SavesAndLoads) {
  for (const Case& c : float_cases()) {
    torch::manual_seed(7);
    auto model = qat::convert(qat::prepare(mlp(64, 32, 10), c.config));
    const std::string path = ::testing::TempDir() + "qat_converted_float.pt";
    torch::save(model, path);
    torch::manual_seed(8);
    auto other = qat::convert(qat::prepare(mlp(64, 32, 10), c.config));
    const Tensor x = at::randn({5, 64});
    EXPECT_FALSE(bitwise_equal(other->forward(x), model->forward(x))) << c.label;
    torch::load(other, path);
    EXPECT_TRUE(bitwise_equal(other->forward(x), model->forward(x))) << c.label;
    std::remove(path.c_str());
  }
}

TEST(QatConvertFloat, EmbeddingsConvertRowByRow) {
  for (const FakeQuantConfig& cfg : {fmt(ValueFormat::Float8E4M3), fmt(ValueFormat::Float8E5M2, Granularity::PerGroup, 16), fmt(ValueFormat::MXFP4)}) {
    torch::manual_seed(3);
    auto root = std::make_shared<torch::nn::Module>();
    root->register_module("tok", torch::nn::Embedding(37, 64));
    qat::prepare(root, qat::QatConfig().embedding(cfg));
    spread_weights(*root);
    auto fe = std::dynamic_pointer_cast<qat::FakeQuantizedEmbeddingImpl>(root->named_children()["tok"]);
    const Tensor idx = at::randint(37, {4, 11}, at::kLong);
    const Tensor want = fe->forward(idx).detach();
    qat::convert(root);
    auto qe = std::dynamic_pointer_cast<qat::QuantizedEmbeddingImpl>(root->named_children()["tok"]);
    ASSERT_TRUE(qe != nullptr);
    EXPECT_TRUE(bitwise_equal(qe->forward(idx), want)) << cfg.describe();
    EXPECT_EQ(qe->weight_bytes(), qat::float_weight_bytes(cfg, 37, 64, qe->group_size)) << cfg.describe();
  }
}

TEST(QatConvertFloat, NonFiniteWeightsAreRefusedNamingTheModule) {
  auto model = qat::prepare(mlp(32, 16, 4), qat::QatConfig().weight(fmt(ValueFormat::MXFP4)));
  {
    torch::NoGradGuard ng;
    model->parameters()[0][1][3] = NAN;
  }
  try {
    qat::convert(model);
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("0.weight: the weight holds NaN or Inf"), std::string::npos) << e.what();
  }
}
