// The wire ops (tensors/wire_ops.h): each row packed as quantize_blockwise packs it, the CPU and CUDA
// kernels bit for bit the ATen reference, the decoded values within the format's bound of the input
// in float64, non-finite blocks carried as NaN, and bad arguments refused naming the argument.
#include "test_util.h"

#include <lowbit/tensors/wire_ops.h>

namespace {

using lowbit::QuantFormat;
using lowbit_test::bitwise_equal;
using lowbit_test::error_of;

std::vector<QuantFormat> signed_formats() {
  std::vector<QuantFormat> v;
  for (QuantFormat f : lowbit_test::all_formats())
    if (lowbit::format_is_signed(f)) v.push_back(f);
  return v;
}

at::Tensor packed_for(QuantFormat f, int64_t rows, int64_t chunk, int64_t block, at::Device dev = at::kCPU) {
  return at::full({rows, lowbit::ops::wire_row_bytes(f, chunk, block)}, 0xAB,
                  at::TensorOptions().dtype(at::kByte).device(dev));
}

bool has_cuda_kernel() {
  return torch::cuda::is_available() &&
         c10::Dispatcher::singleton().findOp({"lowbit::wire_pack_", ""})->hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

TEST(WireOps, EachRowIsQuantizeBlockwiseOfItsChunkAndKernelsMatchTheReference) {
  std::vector<at::Device> devices{at::kCPU};
  if (has_cuda_kernel()) devices.push_back(at::Device(at::kCUDA, 0));
  for (QuantFormat f : signed_formats())
    for (int64_t block : {32, 64, 128, 256})
      for (int64_t rows : {1, 2, 3, 5})
        for (int64_t units : {0, 1, 3}) {  // chunk = units * 256: empty rows too
          const int64_t chunk = units * 256;
          for (auto dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
            SCOPED_TRACE(c10::str(lowbit::format_name(f), " block ", block, " rows ", rows, " chunk ", chunk, " ", dt));
            const at::Tensor x = lowbit_test::random_input(rows * chunk, dt);
            const std::string name = lowbit::format_name(f);
            const at::Tensor want = packed_for(f, rows, chunk, block);
            lowbit::ops::wire_pack_reference(x, want, name, block);
            const int64_t cb = lowbit::code_bytes(f, chunk);
            for (int64_t r = 0; r < rows && chunk > 0; ++r) {
              auto [codes, absmax] = lowbit_test::reference_quantize(x.narrow(0, r * chunk, chunk), f, block);
              ASSERT_TRUE(bitwise_equal(want[r].narrow(0, 0, cb), codes)) << "row " << r;
              ASSERT_TRUE(bitwise_equal(want[r].narrow(0, cb, want.size(1) - cb).clone().view(at::kFloat), absmax));
            }
            const at::Tensor decoded = at::full({rows * chunk}, 7.0f);
            lowbit::ops::wire_unpack_reference(want, decoded, name, block);
            for (const at::Device& dev : devices) {
              SCOPED_TRACE(dev.str());
              const at::Tensor got = packed_for(f, rows, chunk, block, dev);
              lowbit::ops::wire_pack_(x.to(dev), got, name, block);
              ASSERT_TRUE(bitwise_equal(got, want));
              const at::Tensor out = at::full({rows * chunk}, 7.0f, at::TensorOptions().device(dev));
              lowbit::ops::wire_unpack_(got, out, name, block);
              ASSERT_TRUE(bitwise_equal(out, decoded));
            }
            // Within the format's bound of the input, in float64, block by block.
            if (chunk == 0) continue;
            const at::Tensor xd = x.to(at::kDouble).view({-1, block});
            const at::Tensor err = (decoded.to(at::kDouble).view({-1, block}) - xd).abs().amax(1);
            const at::Tensor bound = xd.abs().amax(1) * lowbit_test::roundtrip_bound(f);
            EXPECT_TRUE(err.le(bound).all().item<bool>()) << "largest error over bound "
                                                          << (err / bound.clamp_min(1e-30)).max().item<double>();
          }
        }
}

TEST(WireOps, ABlockWithInfOrNaNIsCarriedAsNaNAndOnlyThatBlock) {
  const QuantFormat f = QuantFormat::Dyn8Signed;
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), NAN}) {
    at::Tensor x = lowbit_test::random_input(2 * 512);
    x[512 + 300] = bad;  // row 1, its second block of 256
    const at::Tensor packed = packed_for(f, 2, 512, 256);
    lowbit::ops::wire_pack_(x, packed, "Dyn8Signed", 256);  // no error: the wire carries it on
    const at::Tensor out = at::zeros({1024});
    lowbit::ops::wire_unpack_(packed, out, "Dyn8Signed", 256);
    const at::Tensor nan = out.isnan();
    EXPECT_TRUE(nan.narrow(0, 768, 256).all().item<bool>());
    EXPECT_FALSE(nan.narrow(0, 0, 768).any().item<bool>());
    const at::Tensor ref = at::zeros({1024});
    lowbit::ops::wire_unpack_reference(packed, ref, "Dyn8Signed", 256);
    EXPECT_TRUE(bitwise_equal(out, ref));
  }
}

TEST(WireOps, BadArgumentsAreRefusedNamingTheArgumentAndChangeNothing) {
  const at::Tensor x = lowbit_test::random_input(512);
  const at::Tensor packed = packed_for(QuantFormat::Dyn8Signed, 2, 256, 256);
  const at::Tensor before = packed.clone();
  const auto pack = [&](const at::Tensor& in, const at::Tensor& p, const std::string& fmt, int64_t b) {
    return error_of([&] { lowbit::ops::wire_pack_(in, p, fmt, b); });
  };
  EXPECT_NE(pack(x, packed, "Dyn8Unsigned", 256).find("unsigned"), std::string::npos);
  EXPECT_NE(pack(x, packed, "nope", 256).find("nope"), std::string::npos);
  EXPECT_NE(pack(x, packed, "Dyn8Signed", 128).find("packed rows have 260 bytes"), std::string::npos);
  EXPECT_NE(pack(x.narrow(0, 0, 501), packed, "Dyn8Signed", 256).find("whole number of chunks"), std::string::npos);
  EXPECT_NE(pack(x.view({2, 256}).t(), packed, "Dyn8Signed", 256).find("contiguous"), std::string::npos);
  EXPECT_NE(pack(x.to(at::kDouble), packed, "Dyn8Signed", 256).find("input must be"), std::string::npos);
  EXPECT_NE(pack(x, packed.view(-1), "Dyn8Signed", 256).find("2-D"), std::string::npos);
  EXPECT_NE(pack(x, packed.to(at::kChar), "Dyn8Signed", 256).find("uint8"), std::string::npos);
  EXPECT_NE(pack(lowbit_test::random_input(2 * 96), packed_for(QuantFormat::Dyn8Signed, 2, 96, 64), "Dyn8Signed", 64)
                .find("whole number of blocks"),
            std::string::npos);
  EXPECT_NE(pack(x, packed, "Dyn8Signed", 100).find("block"), std::string::npos);
  // DE4Signed, 2 rows of 128: 64 code bytes + one absmax each; the output over the same bytes.
  const at::Tensor bytes = at::zeros({1024}, at::kByte);
  EXPECT_NE(error_of([&] {
              lowbit::ops::wire_unpack_(bytes.narrow(0, 0, 136).view({2, 68}), bytes.view(at::kFloat), "DE4Signed", 128);
            }).find("share memory"),
            std::string::npos);
  EXPECT_NE(error_of([&] { lowbit::ops::wire_unpack_(packed, at::zeros({512}, at::kBFloat16), "Dyn8Signed", 256); })
                .find("output must be float32"),
            std::string::npos);
  EXPECT_TRUE(bitwise_equal(packed, before));
}

}  // namespace
