// The CUDA kernels against the reference: bit-identical codes and absmax, on the GPU machine.
// Skipped (and reported as skipped) where no GPU is visible.
#include "test_util.h"

using lowbit::QuantFormat;
using lowbit_test::bitwise_equal;

#define REQUIRE_CUDA()                                                              \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";       \
  if (!c10::Dispatcher::singleton().findOp({"lowbit::quantize_blockwise", ""})->hasKernelForDispatchKey(c10::DispatchKey::CUDA)) \
    GTEST_SKIP() << "lowbit was built without CUDA"

TEST(QuantizeCuda, MatchesReferenceAllFormatsBlocksSizesAndDtypes) {
  REQUIRE_CUDA();
  for (auto f : lowbit_test::all_formats()) {
    const bool nonneg = !lowbit::format_is_signed(f);
    for (int64_t b : {32, 64, 128, 256, 512, 1024, 2048, 4096}) {
      for (int64_t n : {int64_t(1), b - 1, b, b + 1, 7 * b + 9, int64_t(300001)}) {
        for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
          const at::Tensor x = lowbit_test::random_input(n, dt, nonneg);
          auto [rc, ra] = lowbit_test::reference_quantize(x, f, b);
          auto [gc, ga] = lowbit_test::op_quantize(x.cuda(), f, b);
          ASSERT_TRUE(gc.is_cuda());
          ASSERT_TRUE(bitwise_equal(gc, rc)) << lowbit::format_name(f) << " b=" << b << " n=" << n << " " << dt;
          ASSERT_TRUE(bitwise_equal(ga, ra)) << lowbit::format_name(f) << " b=" << b << " n=" << n << " " << dt;
          for (auto odt : {at::kFloat, at::kBFloat16, at::kHalf}) {
            const at::Tensor want = lowbit::ops::dequantize_reference(rc, ra, lowbit::format_name(f), b, {n}, odt);
            const at::Tensor got = lowbit::QTensor(gc, ga, {n}, f, b).dequantize(odt);
            ASSERT_TRUE(got.is_cuda());
            ASSERT_TRUE(bitwise_equal(got, want)) << "dequantize " << lowbit::format_name(f) << " b=" << b << " n=" << n;
          }
        }
      }
    }
  }
}

TEST(QuantizeCuda, ReferenceRunsOnCudaTooAndAgrees) {
  REQUIRE_CUDA();
  const at::Tensor x = lowbit_test::random_input(100003).cuda();
  auto [rc, ra] = lowbit::ops::quantize_reference(x, "DE4Signed", 128);
  auto [gc, ga] = lowbit_test::op_quantize(x, QuantFormat::DE4Signed, 128);
  EXPECT_TRUE(bitwise_equal(rc, gc));
  EXPECT_TRUE(bitwise_equal(ra, ga));
}

TEST(QuantizeCuda, UnalignedAndNonContiguousInputs) {
  REQUIRE_CUDA();
  const at::Tensor base = lowbit_test::random_input(4096 * 3 + 5).cuda();
  const at::Tensor offset = base.narrow(0, 1, 4096 * 3);  // 4-byte aligned only: scalar path
  const at::Tensor strided = base.view({-1}).slice(0, 0, base.numel(), 3);
  for (const at::Tensor& x : {offset, strided}) {
    auto [rc, ra] = lowbit_test::reference_quantize(x.cpu(), QuantFormat::Dyn8Signed, 256);
    auto [gc, ga] = lowbit_test::op_quantize(x, QuantFormat::Dyn8Signed, 256);
    EXPECT_TRUE(bitwise_equal(gc, rc));
    EXPECT_TRUE(bitwise_equal(ga, ra));
  }
}

TEST(QuantizeCuda, RefusesNonFiniteAndMixedDevices) {
  REQUIRE_CUDA();
  at::Tensor x = lowbit_test::random_input(1000).cuda();
  x[999] = NAN;
  EXPECT_THROW(lowbit::quantize(x, QuantFormat::FP8E4M3), c10::Error);
  const lowbit::QTensor q = lowbit::quantize(lowbit_test::random_input(64).cuda(), QuantFormat::FP8E4M3, 32);
  try {
    lowbit::QTensor(q.codes(), q.absmax().cpu(), {64}, QuantFormat::FP8E4M3, 32);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("both must be on one device"), std::string::npos);
  }
  EXPECT_TRUE(q.to(at::kCPU).dequantize().equal(q.dequantize().cpu()));
}

TEST(QuantizeCuda, EmptyTensor) {
  REQUIRE_CUDA();
  const lowbit::QTensor q = lowbit::quantize(at::empty({0}, at::kCUDA), QuantFormat::Dyn8Unsigned);
  EXPECT_EQ(q.nbytes(), 0);
  EXPECT_EQ(q.dequantize().numel(), 0);
}
