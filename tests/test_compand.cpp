// The companded 8-bit formats (kernels/common/compand.h): their rule checked in double, and the
// table-driven paths (thresholds, the CPU key table, bulk encode) equal to the arithmetic.
#include <lowbit/kernels/common/code_tables.h>
#include <lowbit/kernels/common/compand.h>
#include <lowbit/kernels/cpu/format_tables.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "test_util.h"

using lowbit::QuantFormat;
namespace lk = lowbit::kernels;

namespace {

const QuantFormat kPow8[] = {QuantFormat::Pow8Signed, QuantFormat::Pow8Unsigned};

float float_of_key(uint32_t key) { return lk::float_of_order_key(key); }

// #{thresholds < x}: the count every table-driven backend computes.
int table_code(const lk::EncodeTable& t, float x) {
  return static_cast<int>(std::lower_bound(t.thresholds, t.thresholds + t.num_values - 1, x) - t.thresholds);
}

}  // namespace

TEST(Compand, DecodeIsTheSquareOfAnEvenGrid) {
  const auto s = lk::make_codebook(QuantFormat::Pow8Signed);
  const auto u = lk::make_codebook(QuantFormat::Pow8Unsigned);
  for (int c = 0; c < 256; ++c) {
    const double want_u = (c / 255.0) * (c / 255.0);
    EXPECT_NEAR(u[c], want_u, 1e-7 * want_u) << c;
    const int k = std::min(c, 254) - 127;
    const double want_s = (k < 0 ? -1.0 : 1.0) * (k / 127.0) * (k / 127.0);
    EXPECT_NEAR(s[c], want_s, 1e-7 * std::fabs(want_s)) << c;
  }
  EXPECT_EQ(s[127], 0.0f);
  EXPECT_EQ(u[0], 0.0f);
  EXPECT_EQ(s[255], s[254]);  // byte 255 is never written; it reads as the top code
  for (int k = 1; k <= 127; ++k) EXPECT_EQ(s[127 - k], -s[127 + k]) << k;
  EXPECT_TRUE(std::is_sorted(u.begin(), u.end()));
  EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
  EXPECT_NEAR(s[254], 1.0f, 1e-7);
  EXPECT_NEAR(u[255], 1.0f, 1e-7);
}

// The conversion-free helpers equal the conversions they replace, and decode is the integer
// formula's float bit for bit.
TEST(Compand, IntegerTricksAreExact) {
  for (uint32_t n = 0; n < (1u << 16); ++n) {
    ASSERT_EQ(lk::small_uint_to_float(n), static_cast<float>(n)) << n;
    ASSERT_EQ(lk::small_float_to_uint(static_cast<float>(n)), n) << n;
  }
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uni(-300.0f, 300.0f);
  for (float x : {0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 254.5f, 255.5f, 0.49999997f, 0.0f, -0.0f}) {
    ASSERT_EQ(lk::round_even_small(x), std::nearbyint(x)) << x;
  }
  for (int i = 0; i < 1000000; ++i) {
    const float x = uni(rng);
    ASSERT_EQ(lk::round_even_small(x), std::nearbyint(x)) << x;
  }
  for (uint32_t code = 0; code < 256; ++code) {
    const int32_t k = static_cast<int32_t>(std::min(code, 254u)) - 127;
    ASSERT_EQ(lk::pow8_decode_signed(code), static_cast<float>(k * std::abs(k)) * lk::kPow8SignedInvSq) << code;
    ASSERT_EQ(lk::pow8_decode_unsigned(code), static_cast<float>(code * code) * lk::kPow8UnsignedInvSq) << code;
  }
}

// The rule in double: the code's grid step is the nearest to sqrt|x| * m, up to the float
// rounding of the thresholds (about 1e-5 of a step), except that a nonzero x never gets the
// code of 0 (the nonzero step of its sign nearest to 0 instead).
TEST(Compand, EncodeRoundsTheSquareRootToTheNearestStep) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (QuantFormat f : kPow8) {
    const bool sgn = lowbit::format_is_signed(f);
    const double m = sgn ? 127.0 : 255.0;
    for (int i = 0; i < 200000; ++i) {
      float x = uni(rng) * std::pow(10.0f, -static_cast<float>(rng() % 8));
      if (!sgn) x = std::fabs(x);
      const int code = lk::pow8_encode(x, sgn);
      const int k = sgn ? code - 127 : code;
      const double t = std::sqrt(std::fabs(static_cast<double>(x))) * m;
      if (x != 0 && t < 0.5) {
        ASSERT_EQ(k, x > 0 ? 1 : -1) << "a nonzero value never encodes to 0, x=" << x;
        continue;
      }
      ASSERT_LE(std::fabs(std::fabs(static_cast<double>(k)) - t), 0.5 + 1e-4) << lowbit::format_name(f) << " x=" << x;
      if (k != 0) ASSERT_EQ(k < 0, x < 0) << "sign, x=" << x;
    }
    EXPECT_EQ(lk::pow8_encode(1.0f, sgn), sgn ? 254 : 255);
    EXPECT_EQ(lk::pow8_encode(0.0f, sgn), sgn ? 127 : 0);
    EXPECT_EQ(lk::pow8_encode(-0.0f, sgn), sgn ? 127 : 0);
    EXPECT_EQ(lk::pow8_encode(1e-45f, sgn), sgn ? 128 : 1);  // the smallest subnormal
    if (sgn) EXPECT_EQ(lk::pow8_encode(-1e-45f, sgn), 126);
    EXPECT_EQ(lk::pow8_encode(INFINITY, sgn), sgn ? 254 : 255);
    EXPECT_EQ(lk::pow8_encode(NAN, sgn), 0);
    if (sgn) EXPECT_EQ(lk::pow8_encode(-1.0f, sgn), 0);
    if (sgn) EXPECT_EQ(lk::pow8_encode(-INFINITY, sgn), 0);
    if (!sgn) EXPECT_EQ(lk::pow8_encode(-0.5f, sgn), 0);  // unsigned formats refuse negatives upstream
  }
}

// Encode then decode: within the rule's error, which the round-trip tests share (test_util.h).
TEST(Compand, RoundTripWithinItsBound) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (QuantFormat f : kPow8) {
    const bool sgn = lowbit::format_is_signed(f);
    const double bound = lowbit_test::roundtrip_bound(f);
    for (int i = 0; i < 100000; ++i) {
      const float x = sgn ? uni(rng) : std::fabs(uni(rng));
      const float y = lk::pow8_decode(lk::pow8_encode(x, sgn), sgn);
      ASSERT_LE(std::fabs(static_cast<double>(x) - y), bound) << lowbit::format_name(f) << " x=" << x;
    }
  }
}

// The table paths give the arithmetic's codes: the thresholds (ATen reference, GPU buckets), the
// CPU's one-lookup key table and its bulk encoder, on every 251st float in order and on the 64
// floats around each threshold (where a wrong threshold would show).
TEST(Compand, TablesEqualArithmeticOverTheFloats) {
  for (QuantFormat f : kPow8) {
    const bool sgn = lowbit::format_is_signed(f);
    const lk::EncodeTable tab = lk::make_encode_table(f);
    const lk::FormatView view = lk::format_tables(f);
    EXPECT_EQ(tab.num_values, sgn ? 255 : 256);
    std::vector<float> xs;
    const uint32_t lo = lk::order_key_of(-INFINITY), hi = lk::order_key_of(INFINITY);
    for (uint64_t key = lo; key <= hi; key += 251) xs.push_back(float_of_key(static_cast<uint32_t>(key)));
    for (int i = 0; i + 1 < tab.num_values; ++i) {
      const uint32_t k = lk::order_key_of(tab.thresholds[i]);
      for (int d = -32; d <= 32; ++d)
        if (k + d >= lo && k + d <= hi) xs.push_back(float_of_key(k + d));
    }
    std::vector<uint8_t> bulk(xs.size()), bulk_scalar(xs.size());
    const lk::Normalizer one = lk::make_normalizer(1.0f);
    lk::encode_codes(view, one, xs.data(), static_cast<int64_t>(xs.size()), bulk.data(), true);
    lk::encode_codes(view, one, xs.data(), static_cast<int64_t>(xs.size()), bulk_scalar.data(), false);
    for (size_t i = 0; i < xs.size(); ++i) {
      const float x = xs[i];
      const int want = lk::pow8_encode(x, sgn);
      ASSERT_EQ(table_code(tab, x), want) << lowbit::format_name(f) << " x=" << x;
      ASSERT_EQ(view.encode(x), want) << lowbit::format_name(f) << " x=" << x;
      ASSERT_EQ(bulk[i], want) << lowbit::format_name(f) << " x=" << x;
      ASSERT_EQ(bulk_scalar[i], want) << lowbit::format_name(f) << " x=" << x;
    }
  }
}

// Values around every threshold and a stride through [0, 1] (or [-1, 1]); with a 1 at the start
// of every block of 64 the absmax is 1 and the codes are the encode of the values themselves.
static at::Tensor encode_probe(QuantFormat f) {
  const lk::EncodeTable tab = lk::make_encode_table(f);
  std::vector<float> xs;
  for (uint32_t u = 0; u <= 0x3F800000u; u += 97) {
    float x;
    std::memcpy(&x, &u, 4);
    xs.push_back(x);
    if (lowbit::format_is_signed(f)) xs.push_back(-x);
  }
  for (int i = 0; i + 1 < tab.num_values; ++i) {
    const uint32_t k = lk::order_key_of(tab.thresholds[i]);
    for (int d = -32; d <= 32; ++d) {
      const float x = float_of_key(k + d);
      if (std::fabs(x) <= 1.0f && (lowbit::format_is_signed(f) || x >= 0.0f)) xs.push_back(x);
    }
  }
  std::vector<float> blocks;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (blocks.size() % 64 == 0) blocks.push_back(1.0f);
    blocks.push_back(xs[i]);
  }
  return at::tensor(blocks);
}

// The GPU's encode (an rsqrt estimate, corrected) gives the CPU's codes on those values, in the
// quantize op and hence in the step, which shares compand.h.
TEST(Compand, CudaEncodeEqualsCpuNearEveryThreshold) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (QuantFormat f : kPow8) {
    const at::Tensor x = encode_probe(f);
    auto [cpu_codes, cpu_absmax] = lowbit_test::op_quantize(x, f, 64);
    auto [gpu_codes, gpu_absmax] = lowbit_test::op_quantize(x.cuda(), f, 64);
    EXPECT_TRUE(at::all(cpu_absmax == 1.0f).item<bool>());
    const at::Tensor diff = (cpu_codes != gpu_codes.cpu()).nonzero();
    ASSERT_EQ(diff.size(0), 0) << lowbit::format_name(f) << ": first difference at x="
                               << x[diff.numel() ? diff[0][0].item<int64_t>() : 0].item<float>();
  }
}

// The quantize op (CPU kernel) and its ATen reference on a tensor with a spread of magnitudes,
// odd length; and the state format C8 picks these formats with block 64.
TEST(Compand, QuantizeOpAndStateFormat) {
  const at::Tensor x = at::randn({1000 + 37}) * at::exp(at::randn({1000 + 37}) * 3);
  for (QuantFormat f : kPow8) {
    const at::Tensor in = lowbit::format_is_signed(f) ? x : x.abs();
    auto [codes, absmax] = lowbit_test::op_quantize(in, f, 64);
    const std::vector<float> cb = lk::make_codebook(f);
    const auto* c = codes.data_ptr<uint8_t>();
    for (int64_t i = 0; i < in.numel(); ++i) {
      const float a = absmax[i / 64].item<float>();
      const float want_code = lk::pow8_encode(lk::normalize(lk::make_normalizer(a), in[i].item<float>()),
                                              lowbit::format_is_signed(f));
      ASSERT_EQ(c[i], want_code) << i;
    }
  }
  EXPECT_EQ(lowbit::quant_format_for(lowbit::StateFormat::C8, true), QuantFormat::Pow8Signed);
  EXPECT_EQ(lowbit::quant_format_for(lowbit::StateFormat::C8, false), QuantFormat::Pow8Unsigned);
  EXPECT_EQ(lowbit::default_block_size(QuantFormat::Pow8Signed), 64);
  lowbit::StateFormat parsed;
  EXPECT_TRUE(lowbit::parse_state_format("c8", &parsed));
  EXPECT_EQ(parsed, lowbit::StateFormat::C8);
}
