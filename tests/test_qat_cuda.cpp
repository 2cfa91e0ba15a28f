// The fake-quant CUDA kernels against the ATen reference (computed on the CPU): bit-identical
// outputs, masks, qparams and STE gradients for every integer config, dtype and odd shape; LSQ's
// reductions to a tolerance; unaligned and non-contiguous inputs; the converted model on the GPU.
// Skipped (and reported as skipped) where no GPU is visible.
#include "test_qat_util.h"

using namespace lowbit_qat_test;
using lowbit_test::bitwise_equal;
namespace ops = lowbit::ops;

#define REQUIRE_QAT_CUDA()                                                                             \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";                          \
  if (!c10::Dispatcher::singleton().findOp({"lowbit::fake_quant_dynamic", ""})->hasKernelForDispatchKey( \
          c10::DispatchKey::CUDA))                                                                     \
  GTEST_SKIP() << "lowbit was built without CUDA"

TEST(QatCuda, DynamicStaticAndBackwardMatchReferenceBitForBit) {
  REQUIRE_QAT_CUDA();
  std::vector<std::pair<int64_t, int64_t>> sizes = shapes();
  sizes.push_back({4096 * 67, 4096});  // per-token rows of a large activation
  sizes.push_back({1 << 20, 32});      // many small groups
  for (const IntCfg& c : all_int_configs()) {
    for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto [n, g] : sizes) {
        const std::string what = name(c) + " " + c10::toString(dt) + " n=" + std::to_string(n) + " g=" + std::to_string(g);
        const Tensor x = random_groups(n, g, dt);
        auto [y, m, s, z] = op_dynamic(x.cuda(), g, c.bits, c.is_signed, c.symmetric);
        auto [ry, rm, rs, rz] = ops::fake_quant_dynamic_reference(x, g, c.bits, c.is_signed, c.symmetric, FLT_EPSILON);
        ASSERT_TRUE(y.is_cuda()) << what;
        ASSERT_TRUE(bitwise_equal(s, rs)) << what << ": scale";
        ASSERT_TRUE(bitwise_equal(z, rz)) << what << ": zero_point";
        ASSERT_TRUE(bitwise_equal(y, ry)) << what << ": output";
        ASSERT_TRUE(bitwise_equal(m, rm)) << what << ": mask";
        const Tensor dy = at::randn({n}).to(dt);
        ASSERT_TRUE(bitwise_equal(op_backward(dy.cuda(), m), ops::fake_quant_backward_reference(dy, rm))) << what;
        auto [qs, qz] = random_qparams(x, g, c);
        auto [sy, sm] = op_static(x.cuda(), qs.cuda(), qz.cuda(), g, c.bits, c.is_signed);
        auto [rsy, rsm] = ops::fake_quant_static_reference(x, qs, qz, g, c.bits, c.is_signed);
        ASSERT_TRUE(bitwise_equal(sy, rsy)) << what << ": static output";
        ASSERT_TRUE(bitwise_equal(sm, rsm)) << what << ": static mask";
        auto [dx, gs, gz] = op_lsq(dy.cuda(), x.cuda(), qs.cuda(), qz.cuda(), g, c.bits, c.is_signed, 0.1);
        auto [rdx, rgs, rgz] = ops::fake_quant_lsq_backward_reference(dy, x, qs, qz, g, c.bits, c.is_signed, 0.1);
        ASSERT_TRUE(bitwise_equal(dx, rdx)) << what << ": lsq dx";
        ASSERT_TRUE(at::allclose(gs.cpu(), rgs, 1e-5, 1e-6)) << what << ": lsq d scale";
        ASSERT_TRUE(at::allclose(gz.cpu(), rgz, 1e-5, 1e-6)) << what << ": lsq d zero point";
      }
    }
  }
}

TEST(QatCuda, EdgeValuesUnalignedAndNonContiguous) {
  REQUIRE_QAT_CUDA();
  for (float bad : {NAN, INFINITY, 0.0f, 1e37f, 1e-41f}) {
    Tensor x = at::randn({9, 24});
    x[4].fill_(bad);
    x[2][3] = bad;
    auto [y, m, s, z] = op_dynamic(x.cuda(), 24, 4, true, false);
    auto [ry, rm, rs, rz] = ops::fake_quant_dynamic_reference(x, 24, 4, true, false, FLT_EPSILON);
    EXPECT_TRUE(same_bits_or_both_nan(y.cpu(), ry)) << bad;
    EXPECT_TRUE(same_bits_or_both_nan(s.cpu(), rs)) << bad;
    EXPECT_TRUE(bitwise_equal(m, rm)) << bad;
  }
  const Tensor base = random_groups(40 * 33 + 1, 1, at::kBFloat16).cuda();
  const Tensor offset = base.narrow(0, 1, 40 * 33);       // 2-byte aligned only: the scalar path
  const Tensor strided = base.narrow(0, 0, 40 * 33).view({40, 33}).t();  // non-contiguous
  for (const Tensor& x : {offset, strided}) {
    auto [y, m, s, z] = op_dynamic(x, 33 + 7 * (x.dim() == 2), 8, true, true);
    auto [ry, rm, rs, rz] = ops::fake_quant_dynamic_reference(x.cpu(), 33 + 7 * (x.dim() == 2), 8, true, true, FLT_EPSILON);
    EXPECT_TRUE(bitwise_equal(y, ry));
    EXPECT_TRUE(bitwise_equal(m, rm));
  }
  auto [ey, em, es, ez] = op_dynamic(at::empty({0, 8}, at::kCUDA), 8, 4, true, true);
  EXPECT_EQ(ey.sizes(), at::IntArrayRef({0, 8}));
}

TEST(QatCuda, ConvertedModelEqualsFakeQuantizedModelOnTheGpu) {
  REQUIRE_QAT_CUDA();
  namespace qat = lowbit::qat;
  for (int seed = 0; seed < 3; ++seed) {
    torch::manual_seed(seed);
    auto model = qat::prepare(torch::nn::Sequential(torch::nn::Linear(64, 96), torch::nn::ReLU(), torch::nn::Linear(96, 10)),
                              qat::QatConfig::int8_dynamic_activation_int4_weight(32));
    model->to(torch::kCUDA);
    model->eval();
    const Tensor x = at::randn({7, 64}, at::kCUDA);
    const Tensor want = model->forward(x).detach();
    auto converted = qat::convert(model);
    EXPECT_TRUE(bitwise_equal(converted->forward(x), want)) << seed;
  }
}

TEST(QatCuda, Float8MatchesReferenceBitForBit) {
  REQUIRE_QAT_CUDA();
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_float8", "")
                       .typed<T3(const Tensor&, int64_t, std::string_view, double)>();
  std::vector<std::pair<int64_t, int64_t>> sizes = shapes();
  sizes.push_back({4096 * 67, 4096});
  for (const std::string fmt : {"e4m3", "e5m2"}) {
    for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto [n, g] : sizes) {
        const Tensor x = random_groups(n, g, dt);
        auto [y, m, s] = op.call(x.cuda(), g, fmt, FLT_EPSILON);
        auto [ry, rm, rs] = ops::fake_quant_float8_reference(x, g, fmt, FLT_EPSILON);
        ASSERT_TRUE(bitwise_equal(s, rs)) << fmt << " " << dt << " n=" << n;
        ASSERT_TRUE(bitwise_equal(y, ry)) << fmt << " " << dt << " n=" << n;
        ASSERT_TRUE(bitwise_equal(m, rm)) << fmt << " " << dt << " n=" << n;
      }
    }
  }
}

TEST(QatCuda, BlockFloatMatchesReferenceBitForBit) {
  REQUIRE_QAT_CUDA();
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_block_float", "")
                       .typed<T3(const Tensor&, std::string_view, double)>();
  for (const std::string fmt : {"mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "nvfp4"}) {
    for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 32}, {37, 96}, {1031, 4096}}) {
        const Tensor x = random_groups(rows * cols, cols, dt).view({rows, cols});
        auto [y, m, s] = op.call(x.cuda(), fmt, FLT_EPSILON);
        auto [ry, rm, rs] = ops::fake_quant_block_float_reference(x, fmt, FLT_EPSILON);
        ASSERT_TRUE(bitwise_equal(s, rs)) << fmt << " " << dt << " " << rows << "x" << cols;
        ASSERT_TRUE(bitwise_equal(y, ry)) << fmt << " " << dt << " " << rows << "x" << cols;
        ASSERT_TRUE(bitwise_equal(m, rm)) << fmt << " " << dt << " " << rows << "x" << cols;
      }
    }
  }
}
