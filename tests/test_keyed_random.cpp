// keyed_normal_ (tensors/keyed_random.h): any split of a parameter's elements gives the bits of the
// whole fill, on every device; the values are a scalar loop's (native 32-bit hash, libm's log and
// cos) to the polynomials' accuracy, and a standard normal; bad arguments are refused naming them,
// the tensor untouched.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include <lowbit/tensors/keyed_random.h>

namespace {

bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         at::equal(a.contiguous().view(at::kByte), b.contiguous().view(at::kByte));
}

// The scalar reference: the same hash in native uint32 arithmetic, Box-Muller with libm.
uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  return x ^ (x >> 16);
}

double reference_normal(uint64_t key, uint64_t index) {
  const uint32_t k1 = static_cast<uint32_t>(key), k2 = static_cast<uint32_t>(key >> 32);
  const uint32_t high = mix32(static_cast<uint32_t>(index >> 32) ^ k1);
  const uint32_t h1 = mix32(mix32(static_cast<uint32_t>(index) ^ high) ^ k2);
  const uint32_t h2 = mix32(h1 ^ 0x9e3779b9U);
  const double u1 = (h1 + 1.0) * std::ldexp(1.0, -32), u2 = h2 * std::ldexp(1.0, -32);
  return std::sqrt(std::max(0.0, -2.0 * std::log(u1))) * std::cos(2.0 * M_PI * u2);
}

// Fills `whole`'s elements in pieces of random lengths (some empty) and compares with one fill.
void expect_splits_give_the_whole(at::ScalarType dtype, int64_t first, uint32_t seed) {
  SCOPED_TRACE(c10::str(dtype, " from element ", first, ", split seed ", seed));
  const int64_t n = 10007;
  const uint64_t key = lowbit::keyed_random_key("h3.qkv_w", 1234);
  const at::Tensor whole = at::empty({n}, at::TensorOptions().dtype(dtype));
  lowbit::keyed_normal_(whole, 0.25, 0.02, key, first);
  const at::Tensor pieces = at::full({n}, 7.0, at::TensorOptions().dtype(dtype));
  std::mt19937 rng(seed);
  for (int64_t begin = 0; begin < n;) {
    const int64_t len = std::min<int64_t>(n - begin, std::uniform_int_distribution<int64_t>(0, 3000)(rng));
    lowbit::keyed_normal_(pieces.narrow(0, begin, len), 0.25, 0.02, key, first + begin);
    begin += len;
  }
  EXPECT_TRUE(same_bits(whole, pieces));
}

TEST(KeyedRandom, AnySplitGivesTheBitsOfTheWholeFill) {
  const uint32_t seed = std::random_device{}();
  for (at::ScalarType t : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf})
    // Indices past 2^32 use the hash of their high word too; one range crosses it.
    for (int64_t first : {int64_t{0}, int64_t{123}, (int64_t{1} << 32) - 5000, int64_t{3} << 40})
      expect_splits_give_the_whole(t, first, seed);
}

TEST(KeyedRandom, EqualsAScalarLoopOfTheSameHashToThePolynomialsAccuracy) {
  for (uint64_t key : {uint64_t{0}, lowbit::keyed_random_key("wte", 1), ~uint64_t{0}})
    for (int64_t first : {int64_t{0}, (int64_t{1} << 32) - 2000, (int64_t{5} << 33) + 17}) {
      const int64_t n = 4096;
      const at::Tensor z = at::empty({n}, at::kDouble);
      lowbit::keyed_normal_(z, 0.0, 1.0, key, first);
      const double* got = z.data_ptr<double>();
      double worst = 0;
      for (int64_t i = 0; i < n; ++i)
        worst = std::max(worst, std::abs(got[i] - reference_normal(key, static_cast<uint64_t>(first + i))));
      EXPECT_LT(worst, 1e-12) << "key " << key << " from element " << first;
    }
}

TEST(KeyedRandom, IsAStandardNormalScaledAndShifted) {
  const int64_t n = int64_t{1} << 20;
  const at::Tensor z = at::empty({n}, at::kDouble);
  lowbit::keyed_normal_(z, 0.0, 1.0, lowbit::keyed_random_key("h0.fc_w", 42));
  EXPECT_NEAR(z.mean().item<double>(), 0.0, 5.0 / std::sqrt(double(n)));
  EXPECT_NEAR(z.var().item<double>(), 1.0, 0.01);
  EXPECT_NEAR(z.pow(4).mean().item<double>(), 3.0, 0.05);  // kurtosis
  EXPECT_NEAR(z.abs().gt(1.959964).to(at::kDouble).mean().item<double>(), 0.05, 0.002);
  EXPECT_NEAR(z.abs().gt(3.0).to(at::kDouble).mean().item<double>(), 0.0027, 0.0005);
  EXPECT_LT(std::abs((z.narrow(0, 0, n - 1) * z.narrow(0, 1, n - 1)).mean().item<double>()), 0.01);  // neighbours
  // Another key: uncorrelated; the same key and seed: the same values.
  const at::Tensor other = at::empty({n}, at::kDouble), again = at::empty({n}, at::kDouble);
  lowbit::keyed_normal_(other, 0.0, 1.0, lowbit::keyed_random_key("h0.fc_w", 43));
  lowbit::keyed_normal_(again, 0.0, 1.0, lowbit::keyed_random_key("h0.fc_w", 42));
  EXPECT_LT(std::abs((z * other).mean().item<double>()), 0.01);
  EXPECT_TRUE(same_bits(z, again));
  // mean + std * z in float64, rounded once to float32.
  const at::Tensor scaled = at::empty({n}, at::kFloat);
  lowbit::keyed_normal_(scaled, 2.0, 0.5, lowbit::keyed_random_key("h0.fc_w", 42));
  EXPECT_TRUE(same_bits(scaled, (z * 0.5 + 2.0).to(at::kFloat)));
  // std 0: the mean everywhere.
  lowbit::keyed_normal_(scaled, -1.5, 0.0, 9);
  EXPECT_TRUE(at::equal(scaled, at::full({n}, -1.5, at::kFloat)));
}

TEST(KeyedRandom, NonContiguousOutIsFilledInItsOwnOrderAndEmptyIsANoOp) {
  const at::Tensor base = at::zeros({5, 7}, at::kFloat);
  const at::Tensor t = base.t();  // [7, 5], not contiguous
  lowbit::keyed_normal_(t, 0.0, 1.0, 77, 3);
  const at::Tensor dense = at::empty({7, 5}, at::kFloat);
  lowbit::keyed_normal_(dense, 0.0, 1.0, 77, 3);
  EXPECT_TRUE(same_bits(t.contiguous(), dense));
  const at::Tensor strided = at::zeros({40}, at::kFloat);
  lowbit::keyed_normal_(strided.slice(0, 0, 40, 2), 0.0, 1.0, 77, 3);
  EXPECT_TRUE(same_bits(strided.slice(0, 0, 40, 2), dense.view({-1}).narrow(0, 0, 20)));
  EXPECT_TRUE(at::equal(strided.slice(0, 1, 40, 2), at::zeros({20}, at::kFloat)));
  lowbit::keyed_normal_(at::empty({0, 3}, at::kFloat), 0.0, 1.0, 77, 0);
  lowbit::keyed_normal_(at::empty({0}, at::kFloat), 0.0, 1.0, 77, std::numeric_limits<int64_t>::max());
}

TEST(KeyedRandom, BadArgumentsAreRefusedNamingThemAndChangeNothing) {
  const at::Tensor out = at::full({16}, 3.0, at::kFloat);
  const auto refused = [&](const std::function<void()>& fn, const std::string& part) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one naming '" << part << "'";
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
    EXPECT_TRUE(at::equal(out, at::full({16}, 3.0, at::kFloat)));
  };
  refused([&] { lowbit::keyed_normal_(at::zeros({4}, at::kInt), 0.0, 1.0, 1); }, "keyed_normal_: out has dtype Int");
  refused([&] { lowbit::keyed_normal_(at::Tensor(), 0.0, 1.0, 1); }, "keyed_normal_: out is an undefined tensor");
  refused([&] { lowbit::keyed_normal_(out, NAN, 1.0, 1); }, "keyed_normal_: mean is nan");
  refused([&] { lowbit::keyed_normal_(out, 0.0, -1.0, 1); }, "keyed_normal_: std is -1");
  refused([&] { lowbit::keyed_normal_(out, 0.0, INFINITY, 1); }, "keyed_normal_: std is inf");
  refused([&] { lowbit::keyed_normal_(out, 0.0, 1.0, 1, -1); }, "keyed_normal_: first_element is -1");
  refused([&] { lowbit::keyed_normal_(out, 0.0, 1.0, 1, std::numeric_limits<int64_t>::max() - 3); },
          "keyed_normal_: first_element is 9223372036854775804");
}

TEST(KeyedRandom, KeysDependOnNameAndSeedAndNeverOnThePlatform) {
  // Fixed values: a key that changed would change every model initialized with it.
  EXPECT_EQ(lowbit::keyed_random_key("h3.qkv_w", 1234), uint64_t{0xf812511c7622cf5cULL});
  EXPECT_NE(lowbit::keyed_random_key("h3.qkv_w", 1234), lowbit::keyed_random_key("h3.qkv_w", 1235));
  EXPECT_NE(lowbit::keyed_random_key("h3.qkv_w", 1234), lowbit::keyed_random_key("h3.qkv_b", 1234));
  EXPECT_NE(lowbit::keyed_random_key("", 0), uint64_t{0});
}

TEST(KeyedRandom, CudaFillsTheBitsOfTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (at::ScalarType t : {at::kDouble, at::kFloat, at::kBFloat16}) {
    const at::Tensor cpu = at::empty({100003}, at::TensorOptions().dtype(t));
    const at::Tensor gpu = at::empty({100003}, at::TensorOptions().dtype(t).device(at::kCUDA));
    lowbit::keyed_normal_(cpu, 0.1, 0.02, 5, (int64_t{1} << 32) - 50000);
    lowbit::keyed_normal_(gpu, 0.1, 0.02, 5, (int64_t{1} << 32) - 50000);
    EXPECT_TRUE(same_bits(cpu, gpu.cpu())) << t;
  }
}

}  // namespace
