// QAT modules: FakeQuantizer (granularities, observers, LSQ, switches, autograd), FakeQuantizedLinear
// and FakeQuantizedEmbedding, prepare / convert, the converted model equal to the fake-quantized one
// bit for bit in float32, save / load, memory, and errors that name the module.
#include <cstdio>

#include "test_qat_util.h"

using namespace lowbit_qat_test;
using lowbit_test::bitwise_equal;
namespace qat = lowbit::qat;
using qat::FakeQuantConfig;
using qat::Granularity;
using qat::QParamsMode;

namespace {

template <typename F>
void expect_error(F&& f, const std::string& text) {
  try {
    f();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "no error; expected one containing '" << text << "'";
}

// A few SGD steps so the weights are not their initial values.
void train_a_little(torch::nn::Module& m, const std::function<at::Tensor()>& loss) {
  torch::optim::SGD opt(m.parameters(), 0.05);
  m.train();
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    loss().backward();
    opt.step();
  }
  m.eval();
}

}  // namespace

TEST(QatModules, FakeQuantizerGranularitiesMatchTheOps) {
  const Tensor x = at::randn({6, 4, 48});
  // per-group along the last dim, per-token, per-tensor: no data movement.
  qat::FakeQuantizer pg(FakeQuantConfig(4).granularity(Granularity::PerGroup).group_size(16));
  EXPECT_TRUE(bitwise_equal(pg(x), std::get<0>(op_dynamic(x, 16, 4, true, true))));
  qat::FakeQuantizer pt(FakeQuantConfig(8).symmetric(false).granularity(Granularity::PerToken));
  EXPECT_TRUE(bitwise_equal(pt(x), std::get<0>(op_dynamic(x, 48, 8, true, false))));
  qat::FakeQuantizer pten(FakeQuantConfig(3, false).symmetric(false).granularity(Granularity::PerTensor));
  EXPECT_TRUE(bitwise_equal(pten(x), std::get<0>(op_dynamic(x, x.numel(), 3, false, false))));
  // per-channel on axis 1: the channel's elements are strided; groups are formed after movedim.
  qat::FakeQuantizer pc(FakeQuantConfig(8).granularity(Granularity::PerChannel).axis(1));
  const Tensor want = std::get<0>(op_dynamic(x.movedim(1, 0).contiguous(), 6 * 48, 8, true, true)).movedim(0, 1);
  EXPECT_TRUE(bitwise_equal(pc(x).contiguous(), want.contiguous()));
}

TEST(QatModules, StraightThroughGradientAndDoubleBackwardRefused) {
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    qat::FakeQuantizer fq(FakeQuantConfig(4).granularity(Granularity::PerGroup).group_size(8));
    const Tensor x = (at::randn({3, 40}) * 2).to(dt).requires_grad_();
    const Tensor y = fq(x);
    const Tensor g = at::randn({3, 40}).to(dt);
    y.backward(g);
    auto [ry, rm, rs, rz] = lowbit::ops::fake_quant_dynamic_reference(x.detach(), 8, 4, true, true, FLT_EPSILON);
    EXPECT_TRUE(bitwise_equal(y.detach(), ry));
    EXPECT_TRUE(bitwise_equal(x.grad(), lowbit::ops::fake_quant_backward_reference(g, rm)));
  }
  qat::FakeQuantizer fq(FakeQuantConfig(4).granularity(Granularity::PerTensor));
  const Tensor x = at::randn({10}).requires_grad_();
  const Tensor loss = (fq(x) * fq(x)).sum();
  expect_error([&] { loss.backward({}, /*retain_graph=*/true, /*create_graph=*/true); },
               "double backward through fake quantization is not supported");
}

TEST(QatModules, ClippedValuesHaveZeroGradientLikeFiniteDifferences) {
  // Outside the clamp range the output does not move with x: the finite difference is 0, and so is the STE.
  qat::FakeQuantizer fq(FakeQuantConfig(4).granularity(Granularity::PerTensor).qparams(QParamsMode::MinMax));
  fq->train();
  fq(at::tensor({-1.0f, 1.0f}));  // observe the range [-1, 1]
  fq->eval();                      // and stop observing
  const Tensor x = at::tensor({-5.0f, 3.0f, 0.3f}).requires_grad_();
  fq(x).sum().backward();
  const float h = 1e-2f;
  for (int i = 0; i < 2; ++i) {
    Tensor xp = x.detach().clone(), xm = x.detach().clone();
    xp[i] += h;
    xm[i] -= h;
    const float fd = ((fq(xp).sum() - fq(xm).sum()) / (2 * h)).item<float>();
    EXPECT_EQ(fd, 0.0f);
    EXPECT_EQ(x.grad()[i].item<float>(), 0.0f);
  }
  EXPECT_EQ(x.grad()[2].item<float>(), 1.0f);  // inside: straight through
}

TEST(QatModules, LearnableScaleGradientMatchesFiniteDifferencesWhereClamped) {
  // For clamped elements y = (qbound - zero_point) * scale exactly, so the LSQ gradients are true
  // derivatives there: d/d scale = g * sum(dy * (qbound - zp)), d/d zp = -g * scale * sum(dy).
  for (bool sym : {true, false}) {
    auto cfg = FakeQuantConfig(4).symmetric(sym).granularity(Granularity::PerChannel).axis(0).qparams(QParamsMode::Learnable);
    qat::FakeQuantizer fq(cfg);
    fq->train();
    fq(at::randn({3, 8}) * 0.1);  // initialise from a small-range batch
    const Tensor x = at::where(at::rand({3, 8}) < 0.5, at::full({3, 8}, 50.0f), at::full({3, 8}, -50.0f));
    const Tensor w = at::randn({3, 8});
    (fq(x) * w).sum().backward();
    const double g = 1.0 / std::sqrt(8.0 * 7.0);
    for (int64_t c = 0; c < 3; ++c) {
      // y is linear in scale while everything stays clamped, so a large step loses nothing.
      const float h = fq->scale[c].item<float>() * 0.05f;
      auto loss_at = [&](float delta) {
        torch::NoGradGuard ng;
        Tensor saved = fq->scale.detach().clone();
        fq->scale[c] += delta;
        const double l = (fq(x).to(at::kDouble) * w.to(at::kDouble)).sum().item<double>();
        fq->scale.copy_(saved);
        return l;
      };
      const double fd = (loss_at(h) - loss_at(-h)) / (2.0 * h);
      EXPECT_NEAR(fq->scale.grad()[c].item<float>(), g * fd, 1e-4 * std::abs(g * fd) + 1e-6) << "channel " << c;
    }
    if (!sym) {
      ASSERT_TRUE(fq->zero_point.grad().defined());
      const Tensor want = -g * fq->scale.detach() * (w * at::ones({3, 8})).sum(1);
      EXPECT_TRUE(at::allclose(fq->zero_point.grad(), want, 1e-4, 1e-5));
    }
  }
}

TEST(QatModules, ObserversMinMaxAndMovingAverage) {
  auto cfg = FakeQuantConfig(8).symmetric(false).granularity(Granularity::PerTensor).qparams(QParamsMode::MinMax);
  qat::FakeQuantizer mm(cfg);
  mm->train();
  mm(at::tensor({-1.0f, 2.0f}));
  mm(at::tensor({-3.0f, 1.0f}));
  EXPECT_EQ(mm->running_min.item<float>(), -3.0f);
  EXPECT_EQ(mm->running_max.item<float>(), 2.0f);
  mm->eval();
  const Tensor x = at::randn({50});
  auto [s, z] = lowbit::ops::fake_quant_qparams_reference(at::tensor({-3.0f}), at::tensor({2.0f}), 8, true, false, FLT_EPSILON);
  EXPECT_TRUE(bitwise_equal(mm(x), std::get<0>(op_static(x, s, z, 50, 8, true))));
  EXPECT_EQ(mm->running_min.item<float>(), -3.0f);  // eval does not observe

  qat::FakeQuantizer ma(FakeQuantConfig(cfg).qparams(QParamsMode::MovingAverage).averaging_constant(0.5));
  ma->train();
  ma(at::tensor({-1.0f, 2.0f}));
  ma(at::tensor({-3.0f, 4.0f}));
  EXPECT_EQ(ma->running_min.item<float>(), -2.0f);
  EXPECT_EQ(ma->running_max.item<float>(), 3.0f);
  qat::FakeQuantizer unobserved(cfg);
  unobserved->eval();
  expect_error([&] { unobserved(x); }, "has observed no data yet");
}

TEST(QatModules, EnableDisableAndDelayedStart) {
  qat::FakeQuantizer fq(FakeQuantConfig(2).granularity(Granularity::PerTensor));
  fq->set_start_step(2);
  fq->train();
  const Tensor x = at::randn({32});
  EXPECT_TRUE(at::equal(fq(x), x));  // step 1: off
  EXPECT_TRUE(fq->active() == false);
  EXPECT_TRUE(at::equal(fq(x), x));  // step 2: off
  EXPECT_TRUE(fq->active());
  EXPECT_FALSE(at::equal(fq(x), x));  // step 3: on
  fq->enable(false);
  EXPECT_TRUE(at::equal(fq(x), x));
  fq->enable(true);
  EXPECT_TRUE(bitwise_equal(fq(x), std::get<0>(op_dynamic(x, 32, 2, true, true))));
}

TEST(QatModules, FakeQuantizedLinearAndEmbedding) {
  torch::nn::Linear lin(40, 24);
  qat::FakeQuantizedLinear fl(lin, FakeQuantConfig::int8_per_token_asymmetric(), FakeQuantConfig::int4_per_group_symmetric(8));
  EXPECT_EQ(fl->weight.data_ptr(), lin->weight.data_ptr());  // shares the parameter
  const Tensor x = at::randn({5, 7, 40});
  const Tensor xq = std::get<0>(op_dynamic(x, 40, 8, true, false));
  const Tensor wq = std::get<0>(op_dynamic(lin->weight.detach(), 8, 4, true, true));
  EXPECT_TRUE(bitwise_equal(fl(x).detach(), torch::nn::functional::linear(xq, wq, lin->bias.detach())));

  torch::nn::Embedding emb(50, 24);
  qat::FakeQuantizedEmbedding fe(emb, FakeQuantConfig(4).granularity(Granularity::PerGroup).group_size(8));
  const Tensor idx = at::tensor({3, 7, 3, 49, 0, 7}, at::kLong).view({2, 3});
  const Tensor table = std::get<0>(op_dynamic(emb->weight.detach(), 8, 4, true, true));
  const Tensor out = fe(idx);
  EXPECT_EQ(out.sizes(), at::IntArrayRef({2, 3, 24}));
  EXPECT_TRUE(bitwise_equal(out.detach(), table.index_select(0, idx.view(-1)).view({2, 3, 24})));
  out.sum().backward();
  const Tensor touched = emb->weight.grad().abs().sum(1) > 0;
  EXPECT_EQ(touched.sum().item<int64_t>(), 4);  // rows 0, 3, 7, 49 only
  expect_error([&] { qat::FakeQuantizedEmbedding(emb, FakeQuantConfig(4).granularity(Granularity::PerTensor), "tok"); },
               "tok.weight: an embedding's weight config must quantize each row on its own");
}

TEST(QatModules, PrepareSwapsByTypeAndFilterAndSharesParameters) {
  auto model = mlp(16, 32, 8);
  const void* w0 = model[0]->as<torch::nn::Linear>()->weight.data_ptr();
  auto cfg = qat::QatConfig::int8_dynamic_activation_int4_weight(8).filter(
      [](const std::string& name, const torch::nn::Module&) { return name != "2"; });
  auto prepared = qat::prepare(model, cfg);
  ASSERT_TRUE(prepared[0]->as<qat::FakeQuantizedLinear>() != nullptr);
  ASSERT_TRUE(prepared[2]->as<torch::nn::Linear>() != nullptr);  // filtered out
  EXPECT_EQ(prepared[0]->as<qat::FakeQuantizedLinear>()->weight.data_ptr(), w0);
  EXPECT_EQ(prepared[0]->as<qat::FakeQuantizedLinear>()->name, "0");
  // A custom module: children swapped in place (seen by named_children()).
  auto root = std::make_shared<torch::nn::Module>();
  root->register_module("proj", torch::nn::Linear(16, 8));
  root->register_module("tok", torch::nn::Embedding(10, 16));
  auto cfg2 = qat::QatConfig::int4_weight_only(8).embedding(FakeQuantConfig(4).granularity(Granularity::PerGroup).group_size(8));
  auto same = qat::prepare(root, cfg2);
  EXPECT_EQ(same.get(), root.get());
  EXPECT_TRUE(std::dynamic_pointer_cast<qat::FakeQuantizedLinearImpl>(root->named_children()["proj"]) != nullptr);
  EXPECT_TRUE(std::dynamic_pointer_cast<qat::FakeQuantizedEmbeddingImpl>(root->named_children()["tok"]) != nullptr);
  qat::enable_fake_quant(root, false);
  for (const auto& m : root->modules())
    if (auto q = std::dynamic_pointer_cast<qat::FakeQuantizerImpl>(m)) EXPECT_FALSE(q->enabled());
}

TEST(QatModules, ErrorsNameTheModuleAndValue) {
  auto model = mlp(20, 16, 4);
  expect_error([&] { qat::prepare(model, qat::QatConfig::int4_weight_only(32)); },
               "0.weight: group_size 32 does not divide the last dimension 20");
  expect_error([&] { qat::prepare(model, qat::QatConfig().weight(FakeQuantConfig(9))); }, "0.weight: bits must be in [2, 8], got 9");
  expect_error([&] { qat::prepare(model, qat::QatConfig().activation(FakeQuantConfig(8).qparams(QParamsMode::MinMax))); },
               "0.input: min-max observer qparams need a fixed number of groups");
  auto prepared = qat::prepare(mlp(20, 16, 4), qat::QatConfig::int8_dynamic_activation_int4_weight(4));
  expect_error([&] { prepared->forward(at::ones({2, 20}, at::kInt)); },
               "0.input: fake quantization needs a float32, bfloat16 or float16 input, got Int");
}

TEST(QatModules, ConvertedModelEqualsFakeQuantizedModelBitForBit) {
  const std::vector<std::pair<std::string, qat::QatConfig>> configs = {
      {"int4 weight-only g8", qat::QatConfig::int4_weight_only(8)},
      {"8da4w g8", qat::QatConfig::int8_dynamic_activation_int4_weight(8)},
      {"int8 per-channel", qat::QatConfig().weight(FakeQuantConfig::int8_per_channel_symmetric())},
      {"uint4 asym per-token + int8 act", qat::QatConfig()
                                              .weight(FakeQuantConfig(4, false).symmetric(false))
                                              .activation(FakeQuantConfig::int8_per_token_asymmetric())},
      {"int2 per-tensor", qat::QatConfig().weight(FakeQuantConfig(2).granularity(Granularity::PerTensor))},
      {"int4 learnable per-group", qat::QatConfig().weight(FakeQuantConfig::int4_per_group_symmetric(8).qparams(QParamsMode::Learnable))},
      {"int3 asym learnable per-channel", qat::QatConfig().weight(FakeQuantConfig(3).symmetric(false).granularity(Granularity::PerChannel).qparams(QParamsMode::Learnable))},
  };
  for (const auto& [label, cfg] : configs) {
    for (int seed = 0; seed < 4; ++seed) {
      torch::manual_seed(seed);
      const int64_t in = 8 * (1 + seed), hidden = 8 * (3 + seed) + 8, out = 3 + 2 * seed;  // odd outputs
      auto model = qat::prepare(mlp(in, hidden, out), cfg);
      const Tensor xs = at::randn({17, in}), ts = at::randn({17, out});
      train_a_little(*model, [&] { return torch::mse_loss(model->forward(xs), ts); });
      const Tensor x = at::randn({2, 9, in});
      const Tensor want = model->forward(x).detach();
      auto converted = qat::convert(model);
      ASSERT_TRUE(converted[0]->as<qat::QuantizedLinear>() != nullptr) << label;
      const Tensor got = converted->forward(x);
      ASSERT_TRUE(bitwise_equal(got, want)) << label << " seed " << seed << " max diff "
                                            << (got - want).abs().max().item<float>();
    }
  }
}

TEST(QatModules, ConvertedEmbeddingEqualsFakeQuantizedEmbedding) {
  for (int64_t bits : {2, 4, 5, 8}) {
    auto root = std::make_shared<torch::nn::Module>();
    root->register_module("tok", torch::nn::Embedding(37, 24));
    qat::prepare(root, qat::QatConfig().embedding(FakeQuantConfig(bits).symmetric(bits != 4).granularity(Granularity::PerGroup).group_size(8)));
    auto fe = std::dynamic_pointer_cast<qat::FakeQuantizedEmbeddingImpl>(root->named_children()["tok"]);
    const Tensor idx = at::randint(37, {4, 11}, at::kLong);
    const Tensor want = fe->forward(idx).detach();
    qat::convert(root);
    auto qe = std::dynamic_pointer_cast<qat::QuantizedEmbeddingImpl>(root->named_children()["tok"]);
    ASSERT_TRUE(qe != nullptr);
    EXPECT_TRUE(bitwise_equal(qe->forward(idx), want)) << bits;
    EXPECT_EQ(qe->weight_bytes(), 37 * (bits <= 4 ? 12 : 24) + 2 * 4 * 37 * 3);
  }
}

TEST(QatModules, ConvertedModelSavesAndLoadsAndHoldsPackedBytes) {
  torch::manual_seed(1);
  auto model = qat::convert(qat::prepare(mlp(64, 64, 10), qat::QatConfig::int8_dynamic_activation_int4_weight(32)));
  auto q0 = model[0]->as<qat::QuantizedLinear>();
  ASSERT_TRUE(q0 != nullptr);
  // int4: 64 x 64 codes in 64 * 32 bytes, plus one float scale and zero point per 32 weights.
  EXPECT_EQ(q0->weight_bytes(), 64 * 32 + 2 * 4 * (64 * 64 / 32));
  EXPECT_EQ(q0->packed.scalar_type(), at::kByte);
  const std::string path = ::testing::TempDir() + "qat_converted.pt";
  torch::save(model, path);
  torch::manual_seed(2);  // a different initialisation, same architecture
  auto other = qat::convert(qat::prepare(mlp(64, 64, 10), qat::QatConfig::int8_dynamic_activation_int4_weight(32)));
  const Tensor x = at::randn({5, 64});
  EXPECT_FALSE(bitwise_equal(other->forward(x), model->forward(x)));
  torch::load(other, path);
  EXPECT_TRUE(bitwise_equal(other->forward(x), model->forward(x)));
  std::remove(path.c_str());
}

TEST(QatModules, Float8FakeQuantizerTrains) {
  qat::FakeQuantizer fq(FakeQuantConfig::float8_e4m3_per_row());
  const Tensor x = (at::randn({6, 40}) * 5).requires_grad_();
  const Tensor y = fq(x);
  auto [ry, rm, rs] = lowbit::ops::fake_quant_float8_reference(x.detach(), 40, "e4m3", FLT_EPSILON);
  EXPECT_TRUE(bitwise_equal(y.detach(), ry));
  const Tensor g = at::randn({6, 40});
  y.backward(g);
  EXPECT_TRUE(bitwise_equal(x.grad(), lowbit::ops::fake_quant_backward_reference(g, rm)));
  qat::FakeQuantizer e5(FakeQuantConfig().format(qat::ValueFormat::Float8E5M2).granularity(Granularity::PerTensor));
  EXPECT_TRUE(bitwise_equal(e5(x).detach(), std::get<0>(lowbit::ops::fake_quant_float8_reference(x.detach(), 240, "e5m2", FLT_EPSILON))));
  auto model = qat::prepare(mlp(16, 8, 4), qat::QatConfig().weight(FakeQuantConfig::float8_e4m3_per_row()));
  EXPECT_NO_THROW(model->forward(at::randn({3, 16})));
  EXPECT_NO_THROW(qat::convert(model));  // float8 weights convert too (test_qat_convert_float.cpp)
  expect_error([&] { qat::FakeQuantizer(FakeQuantConfig::float8_e4m3_per_row().qparams(QParamsMode::Learnable).granularity(Granularity::PerTensor), "act"); },
               "act: float8 fake quantization supports Dynamic qparams only");
}

TEST(QatModules, BlockScaledFloatFakeQuantizers) {
  const Tensor x = (at::randn({5, 64}) * 2).requires_grad_();
  for (auto [fmt, name] : {std::pair<qat::ValueFormat, std::string>{qat::ValueFormat::MXFP4, "mxfp4"}, {qat::ValueFormat::NVFP4, "nvfp4"}}) {
    qat::FakeQuantizer fq(FakeQuantConfig().format(fmt));
    const Tensor y = fq(x);
    auto [ry, rm, rs] = lowbit::ops::fake_quant_block_float_reference(x.detach(), name, FLT_EPSILON);
    EXPECT_TRUE(bitwise_equal(y.detach(), ry)) << name;
    x.mutable_grad() = Tensor();
    const Tensor g = at::randn({5, 64});
    y.backward(g);
    EXPECT_TRUE(bitwise_equal(x.grad(), lowbit::ops::fake_quant_backward_reference(g, rm))) << name;
  }
  qat::FakeQuantizer bad(FakeQuantConfig().format(qat::ValueFormat::MXFP4), "proj.weight");
  expect_error([&] { bad(at::randn({4, 48})); }, "proj.weight: MXFP4 (blocks of 32) needs the last dimension to be a multiple of 32");
}
