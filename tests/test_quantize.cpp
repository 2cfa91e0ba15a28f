// Blockwise quantize/dequantize on the CPU: bit-identical to the ATen reference, error bounds,
// edge sizes and values, dtypes, layouts, thread counts, and refusals of bad input.
#include <omp.h>

#include "test_util.h"

using lowbit::QuantFormat;
using lowbit_test::bitwise_equal;
using lowbit_test::error_of;

namespace {

const int64_t kBlocks[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};

void expect_matches_reference(const at::Tensor& x, QuantFormat f, int64_t b) {
  auto [codes, absmax] = lowbit_test::op_quantize(x, f, b);
  auto [rcodes, rabsmax] = lowbit_test::reference_quantize(x, f, b);
  ASSERT_TRUE(bitwise_equal(codes, rcodes)) << lowbit::format_name(f) << " block " << b << " n " << x.numel();
  ASSERT_TRUE(bitwise_equal(absmax, rabsmax)) << lowbit::format_name(f) << " block " << b;
  const std::vector<int64_t> shape = x.sizes().vec();
  for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor y = lowbit::ops::dequantize_reference(rcodes, rabsmax, lowbit::format_name(f), b, shape, dt);
    const at::Tensor z = lowbit::QTensor(codes, absmax, shape, f, b).dequantize(dt);
    ASSERT_TRUE(bitwise_equal(y, z)) << "dequantize " << lowbit::format_name(f) << " " << dt;
  }
}

}  // namespace

TEST(Quantize, MatchesReferenceAllFormatsBlocksAndSizes) {
  for (auto f : lowbit_test::all_formats()) {
    const bool nonneg = !lowbit::format_is_signed(f);
    for (int64_t b : kBlocks) {
      for (int64_t n : {int64_t(1), b - 1, b, b + 1, 3 * b + 7}) {
        expect_matches_reference(lowbit_test::random_input(n, at::kFloat, nonneg), f, b);
      }
    }
  }
}

TEST(Quantize, MatchesReferenceForHalfTypesAndLargeInputs) {
  for (auto f : lowbit_test::all_formats()) {
    const bool nonneg = !lowbit::format_is_signed(f);
    for (auto dt : {at::kBFloat16, at::kHalf}) expect_matches_reference(lowbit_test::random_input(5001, dt, nonneg), f, 0);
    expect_matches_reference(lowbit_test::random_input(1 << 20 | 13, at::kFloat, nonneg), f, 0);
  }
}

TEST(Quantize, EmptyTensor) {
  for (auto f : lowbit_test::all_formats()) {
    const lowbit::QTensor q = lowbit::quantize(at::empty({0, 5}), f);
    EXPECT_EQ(q.codes().numel(), 0);
    EXPECT_EQ(q.absmax().numel(), 0);
    EXPECT_EQ(q.nbytes(), 0);
    EXPECT_EQ(q.dequantize().sizes(), at::IntArrayRef({0, 5}));
  }
}

TEST(Quantize, NonContiguousInputReadsLogicalOrder) {
  const at::Tensor base = lowbit_test::random_input(300 * 257).view({300, 257});
  for (const at::Tensor& x : {base.t(), base.slice(1, 0, 257, 3), base.select(1, 5)}) {
    ASSERT_FALSE(x.is_contiguous());
    auto [c1, a1] = lowbit_test::op_quantize(x, QuantFormat::Dyn8Signed, 64);
    auto [c2, a2] = lowbit_test::op_quantize(x.contiguous(), QuantFormat::Dyn8Signed, 64);
    EXPECT_TRUE(bitwise_equal(c1, c2));
    EXPECT_TRUE(bitwise_equal(a1, a2));
    const lowbit::QTensor q = lowbit::quantize(x, QuantFormat::Dyn8Signed, 64);
    EXPECT_EQ(q.dequantize().sizes(), x.sizes());
  }
}

TEST(Quantize, RoundTripErrorWithinFormatBound) {
  for (auto f : lowbit_test::all_formats()) {
    const double bound = lowbit_test::roundtrip_bound(f);
    for (int64_t b : {int64_t(32), lowbit::default_block_size(f), int64_t(4096)}) {
      const at::Tensor x = lowbit_test::random_input(50000 + 3, at::kFloat, !lowbit::format_is_signed(f));
      const lowbit::QTensor q = lowbit::quantize(x, f, b);
      const at::Tensor err = (q.dequantize() - x).abs();
      const at::Tensor scale = q.absmax().repeat_interleave(b).narrow(0, 0, x.numel());
      const double worst = (err / scale.clamp_min(1e-30)).max().item<double>();
      EXPECT_LE(worst, bound) << lowbit::format_name(f) << " block " << b;
      EXPECT_GT(worst, bound / 50) << "suspiciously exact: is the test exercising " << lowbit::format_name(f) << "?";
    }
  }
}

TEST(Quantize, SignedFormatsPreserveSignAndZero) {
  for (auto f : {QuantFormat::Dyn8Signed, QuantFormat::DE4Signed, QuantFormat::FP8E4M3, QuantFormat::FP8E5M2}) {
    const at::Tensor x = lowbit_test::random_input(20011);
    const at::Tensor y = lowbit::quantize(x, f).dequantize();
    EXPECT_EQ((x * y < 0).sum().item<int64_t>(), 0) << lowbit::format_name(f);
    EXPECT_TRUE(y.index({x == 0}).eq(0).all().item<bool>()) << lowbit::format_name(f);
  }
  for (auto f : {QuantFormat::Dyn8Unsigned}) {
    const at::Tensor x = lowbit_test::random_input(20011, at::kFloat, true);
    EXPECT_TRUE(lowbit::quantize(x, f).dequantize().index({x == 0}).eq(0).all().item<bool>());
  }
}

TEST(Quantize, AllZeroBlocksDecodeToZeroInEveryFormat) {
  for (auto f : lowbit_test::all_formats()) {
    at::Tensor x = lowbit_test::random_input(1000, at::kFloat, true);
    x.narrow(0, 256, 256).zero_();
    const lowbit::QTensor q = lowbit::quantize(x, f, 128);
    EXPECT_EQ(q.absmax()[2].item<float>(), 0.0f);
    EXPECT_TRUE(q.dequantize().narrow(0, 256, 256).eq(0).all().item<bool>()) << lowbit::format_name(f);
    EXPECT_TRUE(lowbit::quantize(at::zeros({77}), f).dequantize().eq(0).all().item<bool>());
  }
}

TEST(Quantize, ExtremeMagnitudes) {
  for (auto f : lowbit_test::all_formats()) {
    const bool nonneg = !lowbit::format_is_signed(f);
    for (float scale : {1e-38f, 1e-42f /* denormal */, 3e38f, 1.0f}) {
      const at::Tensor x = (lowbit_test::random_input(999, at::kFloat, nonneg) / 50).clamp(-1, 1) * scale;
      expect_matches_reference(x, f, 64);
      const lowbit::QTensor q = lowbit::quantize(x, f, 64);
      EXPECT_TRUE(at::isfinite(q.dequantize()).all().item<bool>()) << lowbit::format_name(f) << " " << scale;
      EXPECT_EQ(q.absmax().max().item<float>(), x.abs().max().item<float>());
    }
  }
}

TEST(Quantize, ResultDoesNotDependOnThreadCount) {
  const at::Tensor x = lowbit_test::random_input((1 << 18) + 5);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto [c1, a1] = lowbit_test::op_quantize(x, QuantFormat::DE4Signed, 128);
  omp_set_num_threads(2);
  auto [c2, a2] = lowbit_test::op_quantize(x, QuantFormat::DE4Signed, 128);
  omp_set_num_threads(saved);
  EXPECT_TRUE(bitwise_equal(c1, c2));
  EXPECT_TRUE(bitwise_equal(a1, a2));
}

TEST(Quantize, PacksTwoFourBitCodesPerByteAndCountsBytesExactly) {
  const at::Tensor x = lowbit_test::random_input(1001, at::kFloat, true);
  const lowbit::QTensor q4 = lowbit::quantize(x, QuantFormat::Linear4Unsigned, 128);
  EXPECT_EQ(q4.codes().numel(), 501);
  EXPECT_EQ(q4.absmax().numel(), 8);
  EXPECT_EQ(q4.nbytes(), 501 + 8 * 4);
  // Odd length: the last byte's high nibble is empty.
  EXPECT_EQ(q4.codes()[500].item<uint8_t>() >> 4, 0);
  const lowbit::QTensor q8 = lowbit::quantize(x, QuantFormat::FP8E4M3);
  EXPECT_EQ(q8.nbytes(), 1001 + 4 * 4);
}

// ---- refusals ----------------------------------------------------------------------------------

TEST(QuantizeErrors, NonFiniteInputNamesTheBlock) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    at::Tensor x = lowbit_test::random_input(1000);
    x[700] = bad;
    for (auto fn : {std::function<void()>([&] { lowbit::quantize(x, QuantFormat::Dyn8Signed, 256); }),
                    std::function<void()>([&] { lowbit_test::reference_quantize(x, QuantFormat::Dyn8Signed, 256); })}) {
      const std::string msg = error_of(fn);
      EXPECT_NE(msg.find("NaN or Inf in block 2 (elements 512..767"), std::string::npos) << msg;
    }
  }
}

TEST(QuantizeErrors, NegativeInputForUnsignedFormat) {
  at::Tensor x = lowbit_test::random_input(100, at::kFloat, true);
  x[40] = -1e-3f;
  const std::string msg = error_of([&] { lowbit::quantize(x, QuantFormat::Linear4Unsigned, 32); });
  EXPECT_NE(msg.find("negative values in block 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Linear4Unsigned is unsigned"), std::string::npos) << msg;
}

TEST(QuantizeErrors, BadDtypeBlockSizeFormatAndShapes) {
  EXPECT_NE(error_of([] { lowbit::quantize(at::ones({4}, at::kLong), QuantFormat::Dyn8Signed); }).find("must be float32, bfloat16 or float16, got Long"),
            std::string::npos);
  for (int64_t b : {16, 100, 8192, -1}) {
    EXPECT_NE(error_of([&] { lowbit::quantize(at::ones({4}), QuantFormat::Dyn8Signed, b); }).find("block_size must be"),
              std::string::npos)
        << b;
  }
  EXPECT_NE(error_of([] { lowbit::format_from_name("int3"); }).find("unknown quantization format 'int3'"),
            std::string::npos);
  const lowbit::QTensor q = lowbit::quantize(at::ones({100}), QuantFormat::Dyn8Signed, 32);
  EXPECT_NE(error_of([&] { lowbit::QTensor(q.codes(), q.absmax(), {101}, QuantFormat::Dyn8Signed, 32); }).find("needs 101 code bytes, got 100"),
            std::string::npos);
  EXPECT_NE(error_of([&] { lowbit::QTensor(q.codes(), q.absmax().narrow(0, 0, 3), {100}, QuantFormat::Dyn8Signed, 32); }).find("need 4 absmax values, got 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { lowbit::QTensor(q.codes().to(at::kInt), q.absmax(), {100}, QuantFormat::Dyn8Signed, 32); }).find("codes must be uint8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { q.dequantize(at::kDouble); }).find("dtype must be float32, bfloat16 or float16"),
            std::string::npos);
  EXPECT_NE(error_of([] { lowbit::quantize(at::ones({4}).to_sparse(), QuantFormat::Dyn8Signed); }).find("dense"),
            std::string::npos);
}
