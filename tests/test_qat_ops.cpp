// The fake-quant ops on the CPU: bit-identical to the ATen reference for every integer config,
// dtype and odd shape; the torchao / torch.ao conventions pinned on hand-made cases and on an
// independent scalar loop; edge values; layouts; thread counts; refusals of bad arguments.
#include <omp.h>

#include <cfloat>
#include <cmath>

#include "test_qat_util.h"

using namespace lowbit_qat_test;
using lowbit_test::bitwise_equal;
namespace ops = lowbit::ops;

namespace {

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16, at::kHalf};

void expect_dynamic_matches(const Tensor& x, int64_t g, const IntCfg& c, const std::string& what) {
  auto [y, m, s, z] = op_dynamic(x, g, c.bits, c.is_signed, c.symmetric);
  auto [ry, rm, rs, rz] = ops::fake_quant_dynamic_reference(x, g, c.bits, c.is_signed, c.symmetric, FLT_EPSILON);
  ASSERT_TRUE(same_bits_or_both_nan(s, rs)) << what << ": scale";
  ASSERT_TRUE(same_bits_or_both_nan(z, rz)) << what << ": zero_point";
  ASSERT_TRUE(same_bits_or_both_nan(y, ry)) << what << ": output";
  ASSERT_TRUE(bitwise_equal(m, rm)) << what << ": mask";
  // Backward from that mask, on a fresh gradient.
  const Tensor dy = at::randn(x.sizes()).to(x.scalar_type());
  ASSERT_TRUE(bitwise_equal(op_backward(dy, m), ops::fake_quant_backward_reference(dy, rm))) << what << ": backward";
}

// The conventions written out once more as a plain scalar loop (double-checked against the header's
// comment, not its code): torchao choose_qparams_affine + quantize_affine / dequantize_affine.
void scalar_fake_quant(const std::vector<float>& x, int bits, bool is_signed, bool sym, std::vector<float>* y,
                       float* scale_out, float* zp_out) {
  const float qmin = is_signed ? -float(1 << (bits - 1)) : 0.0f;
  const float qmax = is_signed ? float((1 << (bits - 1)) - 1) : float((1 << bits) - 1);
  float mn = x[0], mx = x[0];
  for (float v : x) mn = std::min(mn, v), mx = std::max(mx, v);
  mn = std::min(mn, 0.0f);
  mx = std::max(mx, 0.0f);
  float scale, zp;
  if (sym) {
    scale = std::max(std::max(-mn, mx) / ((qmax - qmin) / 2), FLT_EPSILON);
    zp = float((int(qmin) + int(qmax) + 1) / 2);
  } else {
    scale = std::max((mx - mn) / (qmax - qmin), FLT_EPSILON);
    zp = std::min(std::max(qmin - std::nearbyint(mn / scale), qmin), qmax);
  }
  y->clear();
  for (float v : x) {
    const float q = std::min(std::max(std::nearbyint(v * (1.0f / scale)) + zp, qmin), qmax);
    y->push_back((q - zp) * scale);
  }
  *scale_out = scale;
  *zp_out = zp;
}

}  // namespace

TEST(QatOps, DynamicMatchesReferenceEveryConfigDtypeAndShape) {
  for (const IntCfg& c : all_int_configs()) {
    for (auto dt : kDtypes) {
      for (auto [n, g] : shapes()) {
        expect_dynamic_matches(random_groups(n, g, dt), g, c,
                               name(c) + " " + c10::toString(dt) + " n=" + std::to_string(n) + " g=" + std::to_string(g));
      }
    }
  }
}

TEST(QatOps, StaticMatchesReferenceEveryConfigDtypeAndShape) {
  for (const IntCfg& c : all_int_configs()) {
    for (auto dt : kDtypes) {
      for (auto [n, g] : shapes()) {
        const Tensor x = random_groups(n, g, dt);
        auto [s, z] = random_qparams(x, g, c);
        auto [y, m] = op_static(x, s, z, g, c.bits, c.is_signed);
        auto [ry, rm] = ops::fake_quant_static_reference(x, s, z, g, c.bits, c.is_signed);
        ASSERT_TRUE(bitwise_equal(y, ry)) << name(c) << " " << dt << " n=" << n;
        ASSERT_TRUE(bitwise_equal(m, rm)) << name(c) << " " << dt << " n=" << n;
      }
    }
  }
}

TEST(QatOps, LsqBackwardMatchesReference) {
  for (const IntCfg& c : all_int_configs()) {
    for (auto dt : kDtypes) {
      for (auto [n, g] : shapes()) {
        const Tensor x = random_groups(n, g, dt);
        auto [s, z] = random_qparams(x, g, c);
        const Tensor dy = at::randn({n}).to(dt);
        const double factor = 1.0 / std::sqrt(double(g) * ((1 << (c.bits - 1)) - 1 + 1));
        auto [dx, gs, gz] = op_lsq(dy, x, s, z, g, c.bits, c.is_signed, factor);
        auto [rdx, rgs, rgz] = ops::fake_quant_lsq_backward_reference(dy, x, s, z, g, c.bits, c.is_signed, factor);
        ASSERT_TRUE(bitwise_equal(dx, rdx)) << name(c) << " " << dt << " n=" << n;
        // Reductions: both sum in double, in different orders; then one float rounding.
        ASSERT_TRUE(at::allclose(gs, rgs, 1e-5, 1e-6)) << name(c) << " " << dt << " n=" << n;
        ASSERT_TRUE(at::allclose(gz, rgz, 1e-5, 1e-6)) << name(c) << " " << dt << " n=" << n;
        // The STE part of LSQ is the plain fake-quant backward.
        auto [y, m] = op_static(x, s, z, g, c.bits, c.is_signed);
        ASSERT_TRUE(bitwise_equal(dx, op_backward(dy, m)));
      }
    }
  }
}

TEST(QatOps, ConventionsMatchTheTorchaoFormulasOnAScalarLoop) {
  for (const IntCfg& c : all_int_configs()) {
    for (int rep = 0; rep < 20; ++rep) {
      const int64_t g = 1 + rep * 7;
      const Tensor x = random_groups(g, g, at::kFloat);
      std::vector<float> xv(x.data_ptr<float>(), x.data_ptr<float>() + g), want;
      float ws, wz;
      scalar_fake_quant(xv, int(c.bits), c.is_signed, c.symmetric, &want, &ws, &wz);
      auto [y, m, s, z] = op_dynamic(x, g, c.bits, c.is_signed, c.symmetric);
      ASSERT_EQ(s.item<float>(), ws) << name(c);
      ASSERT_EQ(z.item<float>(), wz) << name(c);
      for (int64_t i = 0; i < g; ++i) ASSERT_EQ(y[i].item<float>(), want[i]) << name(c) << " i=" << i;
    }
  }
}

TEST(QatOps, PinnedCases) {
  // Round half to even: scale 1, zero point 0.
  const Tensor x = at::tensor({0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 3.5f});
  auto [y, m] = op_static(x, at::ones({1}), at::zeros({1}), 6, 8, true);
  EXPECT_TRUE(at::equal(y, at::tensor({0.0f, 2.0f, 2.0f, -0.0f, -2.0f, 4.0f})));
  // Symmetric zero points: 0 for intN, 2^(N-1) for uintN.
  EXPECT_EQ(std::get<3>(op_dynamic(at::randn({8}), 8, 4, true, true)).item<float>(), 0.0f);
  EXPECT_EQ(std::get<3>(op_dynamic(at::randn({8}), 8, 4, false, true)).item<float>(), 8.0f);
  EXPECT_EQ(std::get<3>(op_dynamic(at::randn({8}), 8, 8, false, true)).item<float>(), 128.0f);
  // Asymmetric, all negative, int8: scale = 3/255, zero point = -128 - round(-3 / scale) = 127.
  auto [yn, mn, sn, zn] = op_dynamic(at::tensor({-3.0f, -1.0f}), 2, 8, true, false);
  EXPECT_EQ(sn.item<float>(), 3.0f / 255.0f);
  EXPECT_EQ(zn.item<float>(), 127.0f);
  // The symmetric int4 scale: amax / 7.5.
  EXPECT_EQ(std::get<2>(op_dynamic(at::tensor({-3.0f, 1.0f}), 2, 4, true, true)).item<float>(), 3.0f / 7.5f);
  // Clipped STE: the mask marks what the clamp left alone.
  auto [yc, mc] = op_static(at::tensor({-200.0f, -128.0f, 127.0f, 127.6f, 0.0f}), at::ones({1}), at::zeros({1}), 5, 8, true);
  EXPECT_TRUE(at::equal(yc, at::tensor({-128.0f, -128.0f, 127.0f, 127.0f, 0.0f})));
  EXPECT_EQ(mc.item<uint8_t>(), 0b10110);
}

TEST(QatOps, ExtremeValuesAllZeroRowsAndNonFinite) {
  for (const IntCfg& c : all_int_configs()) {
    // All-zero groups: scale = eps, output exactly 0, every mask bit set, never NaN.
    auto [y0, m0, s0, z0] = op_dynamic(at::zeros({4, 16}), 16, c.bits, c.is_signed, c.symmetric);
    EXPECT_TRUE(at::equal(s0, at::full({4}, FLT_EPSILON))) << name(c);
    EXPECT_TRUE(at::equal(y0, at::zeros({4, 16}))) << name(c);
    EXPECT_TRUE(at::equal(m0, at::full({8}, 255, at::kByte))) << name(c);
    // Huge and tiny magnitudes (float32 range ends, subnormals) stay finite and match the reference.
    for (float mag : {1e37f, 1e-30f, 1e-41f}) {
      const Tensor x = at::randn({5, 24}) * mag;
      expect_dynamic_matches(x, 24, c, name(c) + " magnitude " + std::to_string(mag));
      EXPECT_TRUE(at::isfinite(std::get<0>(op_dynamic(x, 24, c.bits, c.is_signed, c.symmetric))).all().item<bool>());
    }
    // NaN / Inf, dynamic: the group holding one turns NaN (its scale is NaN / Inf), others are untouched.
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      Tensor x = at::randn({3, 10});
      x[1][4] = bad;
      expect_dynamic_matches(x, 10, c, name(c) + " non-finite");
      auto [y, m, s, z] = op_dynamic(x, 10, c.bits, c.is_signed, c.symmetric);
      EXPECT_TRUE(at::isnan(y[1]).all().item<bool>()) << name(c) << " " << bad;
      EXPECT_TRUE(at::isfinite(y[0]).all().item<bool>() && at::isfinite(y[2]).all().item<bool>());
    }
  }
  // Static: +-Inf clamps to the range ends with mask 0; NaN stays NaN with mask 0.
  auto [y, m] = op_static(at::tensor({INFINITY, -INFINITY, NAN, 1.0f}), at::ones({1}), at::zeros({1}), 4, 8, true);
  EXPECT_EQ(y[0].item<float>(), 127.0f);
  EXPECT_EQ(y[1].item<float>(), -128.0f);
  EXPECT_TRUE(std::isnan(y[2].item<float>()));
  EXPECT_EQ(m.item<uint8_t>(), 0b1000);
  auto [ry, rm] = ops::fake_quant_static_reference(at::tensor({INFINITY, -INFINITY, NAN, 1.0f}), at::ones({1}),
                                                   at::zeros({1}), 4, 8, true);
  EXPECT_TRUE(same_bits_or_both_nan(y, ry));
  EXPECT_TRUE(bitwise_equal(m, rm));
}

TEST(QatOps, EmptyTensors) {
  for (auto dt : kDtypes) {
    const Tensor x = at::empty({0, 32}, dt);
    auto [y, m, s, z] = op_dynamic(x, 32, 4, true, true);
    EXPECT_EQ(y.sizes(), x.sizes());
    EXPECT_EQ(y.scalar_type(), dt);
    EXPECT_EQ(m.numel(), 0);
    EXPECT_EQ(s.numel(), 0);
    auto [ys, ms] = op_static(x, at::empty({0}), at::empty({0}), 32, 4, true);
    EXPECT_EQ(ys.sizes(), x.sizes());
    EXPECT_EQ(op_backward(x, ms).sizes(), x.sizes());
    auto [dx, gs, gz] = op_lsq(x, x, at::empty({0}), at::empty({0}), 32, 4, true, 1.0);
    EXPECT_EQ(dx.sizes(), x.sizes());
    EXPECT_EQ(gs.numel(), 0);
  }
}

TEST(QatOps, NonContiguousInputsReadInLogicalOrder) {
  const Tensor base = at::randn({40, 36});
  for (const Tensor& x : {base.t(), base.slice(1, 0, 36, 2), base.select(1, 3), base.to(at::kHalf).t()}) {
    ASSERT_FALSE(x.is_contiguous());
    const int64_t g = x.size(-1);
    auto [y1, m1, s1, z1] = op_dynamic(x, g, 4, true, false);
    auto [y2, m2, s2, z2] = op_dynamic(x.contiguous(), g, 4, true, false);
    EXPECT_TRUE(bitwise_equal(y1, y2));
    EXPECT_TRUE(bitwise_equal(m1, m2));
    EXPECT_EQ(y1.sizes(), x.sizes());
    const Tensor dy = at::randn(x.sizes()).to(x.scalar_type());
    EXPECT_TRUE(bitwise_equal(op_backward(dy.t().contiguous().t(), m1), op_backward(dy, m1)));
  }
}

TEST(QatOps, ResultsDoNotDependOnThreadCount) {
  const Tensor x = random_groups(257 * 33, 33, at::kFloat);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto [y1, m1, s1, z1] = op_dynamic(x, 33, 4, true, true);
  omp_set_num_threads(std::max(2, saved));
  auto [y2, m2, s2, z2] = op_dynamic(x, 33, 4, true, true);
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(y1, y2));
  EXPECT_TRUE(bitwise_equal(m1, m2));
}

TEST(QatOps, RefusesBadArgumentsNamingTheValue) {
  auto throws_with = [](auto&& f, const std::string& text) {
    try {
      f();
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "no error; expected one containing '" << text << "'";
  };
  const Tensor x = at::randn({4, 10});
  throws_with([&] { op_dynamic(x, 7, 4, true, true); }, "group_size 7 does not divide the input's 40 elements");
  throws_with([&] { op_dynamic(x, 10, 9, true, true); }, "bits must be in [2, 8], got 9");
  throws_with([&] { op_dynamic(x, 10, 1, true, true); }, "bits must be in [2, 8], got 1");
  throws_with([&] { op_dynamic(x.to(at::kInt), 10, 4, true, true); }, "input must be float32, bfloat16 or float16, got Int");
  throws_with([&] { op_dynamic(x, 10, 4, true, true, 0.0); }, "eps must be finite and > 0, got 0");
  throws_with([&] { op_dynamic(x, 0, 4, true, true); }, "group_size must be >= 1, got 0");
  throws_with([&] { op_static(x, at::ones({3}), at::zeros({4}), 10, 4, true); }, "scale must have one value per group (4 groups of 10), got 3");
  throws_with([&] { op_static(x, at::ones({4}, at::kDouble), at::zeros({4}), 10, 4, true); }, "scale must be float32, got Double");
  throws_with([&] { op_backward(x, at::zeros({4}, at::kByte)); }, "mask of 40 elements needs 5 bytes, got 4");
  // The reference refuses the same way.
  throws_with([&] { ops::fake_quant_dynamic_reference(x, 7, 4, true, true, FLT_EPSILON); }, "group_size 7 does not divide");
}

TEST(QatOps, PackAndCodesRoundTripToTheFakeQuantOutput) {
  for (const IntCfg& c : all_int_configs()) {
    const Tensor w = random_groups(24 * 40, 40, at::kFloat).view({24, 40});
    auto [y, m, s, z] = op_dynamic(w, 40, c.bits, c.is_signed, c.symmetric);
    const Tensor codes = ops::quantize_codes_reference(w, s, z, 40, c.bits, c.is_signed);
    const Tensor packed = ops::pack_codes_reference(codes, c.bits);
    EXPECT_EQ(packed.numel(), c.bits <= 4 ? w.numel() / 2 : w.numel()) << name(c);
    const Tensor back = ops::unpack_codes_reference(packed, c.bits, w.numel()).view(w.sizes());
    EXPECT_TRUE(at::equal(back, codes)) << name(c);
    EXPECT_LE(codes.max().item<int>(), (1 << c.bits) - 1);
    const Tensor deq = ops::dequantize_codes_reference(back, s, z, 40, c.bits, c.is_signed, at::kFloat);
    EXPECT_TRUE(bitwise_equal(deq, y)) << name(c);
  }
  // Odd count with 4-bit codes: the tail nibble is zero.
  const Tensor odd = ops::pack_codes_reference(at::full({3}, 15, at::kByte), 4);
  EXPECT_TRUE(at::equal(odd, at::tensor({255, 15}, at::kByte)));
}

// ---- float8 ----------------------------------------------------------------------------------------

namespace {

T3 op_float8(const Tensor& x, int64_t g, const std::string& format) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_float8", "")
                       .typed<T3(const Tensor&, int64_t, std::string_view, double)>();
  return op.call(x, g, format, FLT_EPSILON);
}

}  // namespace

TEST(QatOps, Float8RoundingIsTorchsCast) {
  // Every float8 value, the midpoints between neighbours (ties), and random values of every binade.
  for (bool e4m3 : {true, false}) {
    const auto f = lowbit::kernels::fq_float8_format(e4m3);
    const auto dt = e4m3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
    Tensor grid = at::arange(256, at::kInt).to(at::kByte).view(dt).to(at::kFloat);
    grid = std::get<0>(at::sort(grid.masked_select(at::isfinite(grid) & (grid.abs() <= f.max_value))));
    const Tensor mids = (grid.narrow(0, 0, grid.numel() - 1) + grid.narrow(0, 1, grid.numel() - 1)) / 2;
    const Tensor rnd = (at::rand({200000}) * 2 - 1) * at::pow(2.0, at::randint(-30, 17, {200000}).to(at::kFloat));
    const Tensor v = at::cat({grid, mids, rnd.clamp(-f.max_value, f.max_value)});
    const Tensor want = v.to(dt).to(at::kFloat);
    const float* pv = v.data_ptr<float>();
    const float* pw = want.data_ptr<float>();
    for (int64_t i = 0; i < v.numel(); ++i) {
      const float got = lowbit::kernels::fq_float8_round(pv[i], f);
      ASSERT_EQ(lowbit::kernels::f32_bits(got), lowbit::kernels::f32_bits(pw[i])) << (e4m3 ? "e4m3 " : "e5m2 ") << pv[i];
    }
  }
}

TEST(QatOps, Float8MatchesReferenceEveryFormatDtypeAndShape) {
  for (const std::string fmt : {"e4m3", "e5m2"}) {
    for (auto dt : kDtypes) {
      for (auto [n, g] : shapes()) {
        const Tensor x = random_groups(n, g, dt);
        auto [y, m, s] = op_float8(x, g, fmt);
        auto [ry, rm, rs] = ops::fake_quant_float8_reference(x, g, fmt, FLT_EPSILON);
        ASSERT_TRUE(bitwise_equal(s, rs)) << fmt << " " << dt << " n=" << n;
        ASSERT_TRUE(bitwise_equal(y, ry)) << fmt << " " << dt << " n=" << n;
        ASSERT_TRUE(bitwise_equal(m, rm)) << fmt << " " << dt << " n=" << n;
      }
    }
    // All-zero rows stay 0 with scale eps; the scale is amax / fmax; NaN / Inf rows turn NaN.
    Tensor x = at::randn({4, 16});
    x[1].zero_();
    x[2][3] = NAN;
    x[3][5] = INFINITY;
    auto [y, m, s] = op_float8(x, 16, fmt);
    auto [ry, rm, rs] = ops::fake_quant_float8_reference(x, 16, fmt, FLT_EPSILON);
    EXPECT_TRUE(same_bits_or_both_nan(y, ry)) << fmt;
    EXPECT_TRUE(same_bits_or_both_nan(s, rs)) << fmt;
    EXPECT_TRUE(bitwise_equal(m, rm)) << fmt;
    EXPECT_EQ(s[1].item<float>(), FLT_EPSILON);
    EXPECT_TRUE(at::equal(y[1], at::zeros({16})));
    EXPECT_EQ(s[0].item<float>(), x[0].abs().max().item<float>() / (fmt == "e4m3" ? 448.0f : 57344.0f));
    EXPECT_TRUE(at::isnan(y[2]).all().item<bool>() && at::isnan(y[3]).all().item<bool>());
  }
  EXPECT_THROW(op_float8(at::randn({8}), 8, "e3m4"), c10::Error);
}

// ---- block-scaled floats (MXFP4 / MXFP8, NVFP4) ----------------------------------------------------

namespace {

T3 op_block_float(const Tensor& x, const std::string& format) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("lowbit::fake_quant_block_float", "")
                       .typed<T3(const Tensor&, std::string_view, double)>();
  return op.call(x, format, FLT_EPSILON);
}

}  // namespace

TEST(QatOps, BlockFloatMatchesReferenceEveryFormatDtypeAndShape) {
  for (const std::string fmt : {"mxfp4", "mxfp8_e4m3", "mxfp8_e5m2", "nvfp4"}) {
    for (auto dt : kDtypes) {
      for (int64_t rows : {1, 3, 37}) {
        for (int64_t cols : {32, 64, 96 * 5}) {
          const Tensor x = random_groups(rows * cols, cols, dt).view({rows, cols});
          auto [y, m, s] = op_block_float(x, fmt);
          auto [ry, rm, rs] = ops::fake_quant_block_float_reference(x, fmt, FLT_EPSILON);
          ASSERT_TRUE(bitwise_equal(s, rs)) << fmt << " " << dt << " " << rows << "x" << cols;
          ASSERT_TRUE(bitwise_equal(y, ry)) << fmt << " " << dt << " " << rows << "x" << cols;
          ASSERT_TRUE(bitwise_equal(m, rm)) << fmt << " " << dt << " " << rows << "x" << cols;
        }
      }
    }
    // Edge rows: all zero, NaN, Inf, huge, tiny (subnormal).
    Tensor x = at::randn({6, 32});
    x[1].zero_();
    x[2][7] = NAN;
    x[3][9] = INFINITY;
    x[4] *= 1e30;
    x[5] *= 1e-40;
    auto [y, m, s] = op_block_float(x, fmt);
    auto [ry, rm, rs] = ops::fake_quant_block_float_reference(x, fmt, FLT_EPSILON);
    EXPECT_TRUE(same_bits_or_both_nan(y, ry)) << fmt;
    EXPECT_TRUE(same_bits_or_both_nan(s, rs)) << fmt;
    EXPECT_TRUE(bitwise_equal(m, rm)) << fmt;
    if (fmt != "nvfp4") {
      EXPECT_TRUE(at::equal(y[1], at::zeros({32}))) << fmt;
    } else {
      // The tensor scale comes from the whole tensor: a NaN / Inf anywhere turns all of it NaN.
      EXPECT_TRUE(at::isnan(y).all().item<bool>());
      Tensor finite = x.clone();
      finite[2][7] = 1.0f;
      finite[3][9] = 1.0f;
      EXPECT_TRUE(at::equal(std::get<0>(op_block_float(finite, fmt))[1], at::zeros({32})));
    }
  }
}

TEST(QatOps, BlockFloatPinnedValues) {
  // MXFP4: amax 5 -> floor(log2 5) = 2 -> scale 2^(2-2) = 1; elements on the e2m1 grid, ties to even,
  // 7 > 6 saturates (FLOOR scaling can exceed the element max) with mask 0.
  Tensor x = at::zeros({32});
  const float vals[] = {5.0f, 0.25f, 0.75f, 1.25f, 2.5f, 3.5f, 5.0f, -0.3f, 1.75f};
  for (int i = 0; i < 9; ++i) x[i] = vals[i];
  auto [y, m, s] = op_block_float(x, "mxfp4");
  EXPECT_EQ(s.item<float>(), 1.0f);
  const float want[] = {4.0f, 0.0f, 1.0f, 1.0f, 2.0f, 4.0f, 4.0f, -0.5f, 2.0f};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(y[i].item<float>(), want[i]) << i;
  x[0] = 7.0f;
  auto [y2, m2, s2] = op_block_float(x, "mxfp4");
  EXPECT_EQ(y2[0].item<float>(), 6.0f);
  EXPECT_EQ(m2[0].item<uint8_t>() & 1, 0);
  // NVFP4: the total scale is tensor_scale * e4m3(block_amax / 6 / tensor_scale).
  const Tensor w = at::randn({4, 16}) * 3;
  auto [yn, mn, sn] = op_block_float(w, "nvfp4");
  const float ts = w.abs().max().item<float>() / 2688.0f;
  for (int b = 0; b < 4; ++b) {
    const float blk = (w[b].abs().max().item<float>() / 6.0f) / ts;
    const float e4m3 = at::tensor({blk}).to(at::kFloat8_e4m3fn).to(at::kFloat).item<float>();
    EXPECT_EQ(sn[b].item<float>(), ts * e4m3) << b;
  }
  EXPECT_THROW(op_block_float(at::randn({30}), "mxfp4"), c10::Error);
  EXPECT_THROW(op_block_float(at::randn({32}), "fp4"), c10::Error);
}
