// Codebooks are generated, not pasted: check their defining properties and the encode tables.
#include <lowbit/kernels/common/code_tables.h>
#include <lowbit/kernels/common/encode.h>
#include <lowbit/kernels/cpu/cpu_features.h>
#include <lowbit/kernels/cpu/encode_avx512.h>
#include <lowbit/kernels/cpu/encode_linear4.h>
#include <lowbit/kernels/cpu/format_tables.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "test_util.h"

using lowbit::QuantFormat;
namespace lk = lowbit::kernels;

TEST(Codebooks, SizesAndLandmarks) {
  for (auto f : lowbit_test::all_formats()) {
    EXPECT_EQ(lowbit::codebook(f).numel(), lowbit::format_bits(f) == 4 ? 16 : 256) << lowbit::format_name(f);
  }
  const auto s8 = lk::make_codebook(QuantFormat::Dyn8Signed);
  EXPECT_EQ(s8[127], 0.0f);
  EXPECT_EQ(s8[255], 1.0f);
  EXPECT_TRUE(std::is_sorted(s8.begin(), s8.end()));
  EXPECT_NEAR(s8[0], -0.99297, 1e-5);  // asymmetric: the signed map has +1 but not -1
  const auto u8 = lk::make_codebook(QuantFormat::Dyn8Unsigned);
  EXPECT_EQ(u8[0], 0.0f);
  EXPECT_EQ(u8[255], 1.0f);
  // Smallest nonzero values: 1e-6 times the midpoints of the first decade's grid cells.
  EXPECT_NEAR(u8[1], 0.325e-6, 1e-12);
  EXPECT_NEAR(s8[128], 0.55e-6, 1e-12);
  EXPECT_EQ(std::set<float>(u8.begin(), u8.end()).size(), 256u);
  const auto de4 = lk::make_codebook(QuantFormat::DE4Signed);
  EXPECT_EQ(de4[7], 0.0f);
  EXPECT_EQ(de4[15], 1.0f);
  EXPECT_NEAR(de4[8], 0.0055, 1e-7);
  const auto lin = lk::make_codebook(QuantFormat::Linear4Unsigned);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(lin[i], (i + 1) / 16.0f);
}

// FP8 codes are the real e4m3fn / e5m2 bit patterns: decoding them with torch's float8 dtypes gives
// the codebook times the format's max.
TEST(Codebooks, Fp8MatchesTorchFloat8) {
  const at::Tensor codes = at::arange(256, at::kInt).to(at::kByte);
  for (auto [f, dt, maxv] : {std::tuple{QuantFormat::FP8E4M3, at::kFloat8_e4m3fn, 448.0},
                             std::tuple{QuantFormat::FP8E5M2, at::kFloat8_e5m2, 57344.0}}) {
    const at::Tensor vals = codes.view(dt).to(at::kDouble);
    const auto cb = lk::make_codebook(f);
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const double v = vals[c].item<double>();
      if (!std::isfinite(v)) {
        EXPECT_TRUE(std::isnan(cb[c])) << c;
        continue;
      }
      ++finite;
      EXPECT_EQ(cb[c], static_cast<float>(v / maxv)) << lowbit::format_name(f) << " code " << c;
    }
    EXPECT_EQ(finite, f == QuantFormat::FP8E4M3 ? 254 : 248);
  }
}

// Brute force: the nearest codebook value in exact (double) arithmetic, ties to the lower code;
// a nonzero x only among the nonzero values of its sign (where the format has any).
static int nearest_code(const std::vector<float>& cb, float x) {
  const auto same_side = [&](float v) { return x > 0 ? v > 0 : v < 0; };
  const bool off_zero = x != 0 && std::any_of(cb.begin(), cb.end(), same_side);
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < static_cast<int>(cb.size()); ++c) {
    if (!std::isfinite(cb[c]) || (off_zero && !same_side(cb[c]))) continue;
    const double d = std::fabs(static_cast<double>(x) - static_cast<double>(cb[c]));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

// The code a format's encode rule gives: the nearest value for the table formats; the companded
// ones round in the companded domain (compand.h; test_compand.cpp checks that rule in double).
static int expected_code(QuantFormat f, const std::vector<float>& cb, float x) {
  if (lowbit::is_arithmetic_format(f)) return lk::pow8_encode(x, lowbit::format_is_signed(f));
  return nearest_code(cb, x);
}

TEST(Codebooks, EncodeIsExactNearestWithTiesToLowerCode) {
  std::mt19937 rng(std::random_device{}());
  for (auto f : lowbit_test::all_formats()) {
    const auto cb = lk::make_codebook(f);
    const lk::EncodeTable tab = lk::make_encode_table(f);
    const lk::FormatView enc = lk::format_tables(f);
    std::vector<float> probes;
    std::uniform_real_distribution<float> u(-1.05f, 1.05f);
    for (int i = 0; i < 20000; ++i) probes.push_back(u(rng));
    // Around zero: both zeros, subnormals, and magnitudes below each format's smallest nonzero value.
    for (float p : {0.0f, -0.0f, 1e-45f, -1e-45f, 3e-45f, -3e-45f, 1e-38f, -1e-38f, 1e-20f, -1e-20f, 1e-9f, -1e-9f,
                    1e-7f, -1e-7f})
      probes.push_back(p);
    // Every exact midpoint and its float neighbours: the tie and near-tie cases.
    for (int i = 0; i + 1 < tab.num_values; ++i) {
      const float a = cb[tab.sorted_codes[i]], b = cb[tab.sorted_codes[i + 1]];
      const float m = static_cast<float>((static_cast<double>(a) + b) / 2);
      for (float p : {m, std::nextafter(m, -INFINITY), std::nextafter(m, INFINITY), a, b}) probes.push_back(p);
    }
    for (float x : probes) {
      const int want = expected_code(f, cb, x);
      int count = 0;
      while (count < tab.num_values - 1 && tab.thresholds[count] < x) ++count;
      const int eytz = tab.bits == 4 ? lk::count_below_eytzinger<4>(tab.eytzinger, x)
                                     : lk::count_below_eytzinger<8>(tab.eytzinger, x);
      ASSERT_EQ(tab.sorted_codes[count], want) << lowbit::format_name(f) << " x=" << x;
      ASSERT_EQ(eytz, count) << lowbit::format_name(f) << " x=" << x;
      ASSERT_EQ(enc.encode(x), want) << lowbit::format_name(f) << " x=" << x;
    }
  }
}

// The CPU's key table (code_tables.h: make_key_table) against the thresholds by order key, for
// every format and every bucket of x (x's top 16 bits): at both ends of the bucket, on both sides
// of its threshold T and at 32 random low bits. The thresholds' count below x moves one way through
// a bucket and changes at most once, so agreeing at both ends and at T and T + 1 is agreeing on
// every float of the bucket, NaNs included.
TEST(Codebooks, KeyTableAgreesWithTheThresholdsInEveryBucket) {
  std::mt19937 rng(std::random_device{}());
  for (auto f : lowbit_test::all_formats()) {
    const lk::EncodeTable tab = lk::make_encode_table(f);
    const lk::FormatView enc = lk::format_tables(f);
    std::vector<uint32_t> keys;
    for (int k = 0; k + 1 < tab.num_values; ++k) keys.push_back(lk::order_key_of(tab.thresholds[k]));
    for (uint32_t b = 0; b < (1u << 16); ++b) {
      const uint32_t t = 0xFFFFu - ((enc.key_entries[b] + (b << 16)) & 0xFFFFu);  // the bucket's T
      std::vector<uint32_t> lows = {0, 1, 0xFFFE, 0xFFFF, t, std::min(t + 1, 0xFFFFu), t > 0 ? t - 1 : 0,
                                    std::min(t + 2, 0xFFFFu)};
      for (int r = 0; r < 32; ++r) lows.push_back(rng() & 0xFFFFu);
      for (const uint32_t low : lows) {
        const uint32_t x = (b << 16) | low;
        const uint32_t u = x ^ ((x >> 31) ? enc.key_flip : 0u);
        float v;
        std::memcpy(&v, &u, 4);
        const size_t below = std::lower_bound(keys.begin(), keys.end(), lk::order_key_bits(u)) - keys.begin();
        ASSERT_EQ(enc.encode(v), tab.sorted_codes[below])
            << lowbit::format_name(f) << " bits 0x" << std::hex << u << " bucket 0x" << b;
      }
    }
  }
}

// The GPU kernels' encode (encode.h: window_bucket, code_tables.h: make_window_starts): the bucket's
// start plus one compare gives #{thresholds < x}, for every format, on the 33 floats around each
// threshold, both zeros, tiny, huge and infinite values, and every 4099th float of [-2, 2].
TEST(Codebooks, WindowBucketStartAndOneCompareCountThresholds) {
  const auto bits_of = [](float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  const auto float_of = [](uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
  };
  for (auto f : lowbit_test::all_formats()) {
    const lk::EncodeTable tab = lk::make_encode_table(f);
    const std::vector<uint8_t> starts = lk::make_window_starts(tab);
    const int nthr = tab.num_values - 1;
    std::vector<float> probes = {0.0f, -0.0f, 1e-45f, -1e-45f, 1e-30f, -1e-30f, 0x1p-62f, -0x1p-62f, 2.0f, -2.0f,
                                 4.0f, -4.0f, 1e30f, -1e30f, INFINITY, -INFINITY};
    for (int i = 0; i < nthr; ++i) {
      float lo = tab.thresholds[i], hi = tab.thresholds[i];
      probes.push_back(lo);
      for (int k = 0; k < 16; ++k) {
        lo = std::nextafter(lo, -INFINITY);
        hi = std::nextafter(hi, INFINITY);
        probes.push_back(lo);
        probes.push_back(hi);
      }
    }
    for (uint32_t k = 0; k <= bits_of(2.0f); k += 4099) {
      probes.push_back(float_of(k));
      probes.push_back(-float_of(k));
    }
    uint32_t last_bucket = 0;
    float last = -INFINITY;
    std::sort(probes.begin(), probes.end());
    for (float x : probes) {
      int want = 0;
      while (want < nthr && tab.thresholds[want] < x) ++want;
      const uint32_t b = lk::window_bucket(bits_of(x));
      const int s = starts[b];
      const float t = s < nthr ? tab.thresholds[s] + 0.0f : INFINITY;
      ASSERT_EQ(s + (t < x ? 1 : 0), want) << lowbit::format_name(f) << " x=" << x << " bucket " << b;
      if (x > last) ASSERT_LE(last_bucket, b) << "buckets out of value order at x=" << x;
      last_bucket = b;
      last = x;
    }
  }
}

// The bulk encoder (AVX-512 where present, with its masked tail) and the scalar loop against the
// brute-force nearest code, on values that pass through the normalizing multiplies.
TEST(Codebooks, BulkEncodeMatchesNearestOnBothPaths) {
  std::mt19937 rng(std::random_device{}());
  for (auto f : lowbit_test::all_formats()) {
    const auto cb = lk::make_codebook(f);
    const lk::EncodeTable tab = lk::make_encode_table(f);
    std::vector<float> x;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int i = 0; i < 5000; ++i) x.push_back(u(rng) * std::pow(10.0f, -static_cast<float>(rng() % 9)));
    for (int i = 0; i + 1 < tab.num_values; ++i) {
      const float t = tab.thresholds[i];
      for (float p : {t, std::nextafter(t, -INFINITY), std::nextafter(t, INFINITY)}) x.push_back(p);
    }
    for (float p : {0.0f, -0.0f, 1.0f, -1.0f, 1e-30f, -1e-30f, 1e-45f}) x.push_back(p);
    x.push_back(0.5f);  // odd length: the vector path's masked tail
    if (x.size() % 16 == 0) x.push_back(0.25f);
    const float scale = 0.75f;  // normalize(nz, v) = (v * 1) * (1 / 0.75)
    const lk::Normalizer nz = lk::make_normalizer(scale);
    std::vector<float> v(x.size());
    for (size_t i = 0; i < x.size(); ++i) v[i] = x[i] * scale;
    std::vector<uint8_t> fast(x.size()), slow(x.size());
    const lk::FormatView enc = lk::format_tables(f);
    lk::encode_codes(enc, nz, v.data(), static_cast<int64_t>(v.size()), fast.data(), true);
    lk::encode_codes(enc, nz, v.data(), static_cast<int64_t>(v.size()), slow.data(), false);
    for (size_t i = 0; i < x.size(); ++i) {
      const float n = lk::normalize(nz, v[i]);
      ASSERT_EQ(slow[i], expected_code(f, cb, n)) << lowbit::format_name(f) << " x=" << n;
      ASSERT_EQ(fast[i], slow[i]) << lowbit::format_name(f) << " x=" << n << " at " << i;
    }
    if (lowbit::format_bits(f) != 4) continue;
    // Packed: every length around the vector width (the tail and an odd last element).
    for (int64_t len : {int64_t(1), int64_t(15), int64_t(16), int64_t(17), int64_t(33), static_cast<int64_t>(x.size())}) {
      for (bool vec : {true, false}) {
        std::vector<uint8_t> packed((len + 1) / 2 + 1, 0xAB);
        lk::encode_codes_packed4(enc, nz, v.data(), len, packed.data(), vec);
        for (int64_t i = 0; i < len; i += 2) {
          const int hi = i + 1 < len ? slow[i + 1] : 0;
          ASSERT_EQ(packed[i / 2], slow[i] | (hi << 4)) << lowbit::format_name(f) << " len " << len << " at " << i;
        }
        ASSERT_EQ(packed[(len + 1) / 2], 0xAB) << "wrote past the end, len " << len;
      }
    }
  }
}

// The 4-bit bulk decode of packed codes (nibbles split and reordered by byte permutes with VBMI,
// its masked tail) and the plain loop: random codes, lengths around the 64-code step (odd ones end
// on a low nibble), nothing written past the end.
TEST(Codebooks, BulkDecode4MatchesCodebookOnBothPaths) {
  std::mt19937 rng(std::random_device{}());
  for (auto f : lowbit_test::all_formats()) {
    if (lowbit::format_bits(f) != 4) continue;
    const lk::FormatView view = lk::format_tables(f);
    const auto cb = lk::make_codebook(f);
    std::vector<uint8_t> packed(150);
    for (auto& b : packed) b = static_cast<uint8_t>(rng() % 256);
    const float amax = 0.37f;
    for (int64_t len : {int64_t(1), int64_t(2), int64_t(31), int64_t(63), int64_t(64), int64_t(65), int64_t(128), int64_t(299)}) {
      for (bool vec : {true, false}) {
        std::vector<float> out(len + 1, 12345.0f);
        lk::decode_codes4(view, packed.data(), len, amax, out.data(), vec);
        for (int64_t i = 0; i < len; ++i) {
          const int code = (packed[i / 2] >> (4 * (i % 2))) & 0x0F;
          ASSERT_EQ(out[i], cb[code] * amax) << lowbit::format_name(f) << " len " << len << " at " << i << " vec " << vec;
        }
        ASSERT_EQ(out[len], 12345.0f) << "wrote past the end, len " << len;
      }
    }
  }
}

// The 8-bit bulk decode (byte permutes with VBMI, and its masked tail) and the plain loop: every
// code, lengths around the 64-code step, nothing written past the end.
TEST(Codebooks, BulkDecodeMatchesCodebookOnBothPaths) {
  std::mt19937 rng(std::random_device{}());
  for (auto f : lowbit_test::all_formats()) {
    if (lowbit::format_bits(f) != 8) continue;
    const lk::FormatView view = lk::format_tables(f);
    const auto cb = lk::make_codebook(f);
    std::vector<uint8_t> codes(300);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i < 256 ? i : rng() % 256);
    std::shuffle(codes.begin(), codes.end(), rng);
    const float amax = 0.37f;
    for (int64_t len : {int64_t(1), int64_t(63), int64_t(64), int64_t(65), int64_t(300)}) {
      for (bool vec : {true, false}) {
        std::vector<float> out(len + 1, 12345.0f);
        lk::decode_codes8(view, codes.data(), len, amax, out.data(), vec);
        for (int64_t i = 0; i < len; ++i) {
          const float want = cb[codes[i]] * amax;
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(out[i])) << lowbit::format_name(f) << " code " << int(codes[i]);
          } else {
            ASSERT_EQ(out[i], want) << lowbit::format_name(f) << " len " << len << " at " << i << " vec " << vec;
          }
        }
        ASSERT_EQ(out[len], 12345.0f) << "wrote past the end, len " << len;
      }
    }
  }
}

#if defined(__x86_64__)
namespace {
// Lanes where two vectors of 16 codes differ.
int differ(__m128i a, __m128i b) {
  return 16 - __builtin_popcount(static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi8(a, b))));
}

// Lanes where two vectors of 16 codes differ, among the lanes of m.
int differ_in(__m128i a, __m128i b, __mmask16 m) {
  return __builtin_popcount(static_cast<unsigned>(m & ~_mm_movemask_epi8(_mm_cmpeq_epi8(a, b))) & 0xFFFFu);
}

// Over every float bit pattern (NaNs included), how many vector 4-bit codes differ from the key
// table's (the scalar path's definition): out[0] DE4Signed's tree search, out[1] and out[2]
// Linear4Unsigned's tree search and formula on AVX-512, out[3] the formula on AVX2; out[4] and
// out[5] the float-compare rank searches of both formats over the finite floats (the only ones they
// get).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void four_bit_mismatches(int64_t out[6]) {
  const lk::FormatView de4 = lk::format_tables(QuantFormat::DE4Signed);
  const lk::FormatView lin = lk::format_tables(QuantFormat::Linear4Unsigned);
  const __m512i de4_tree = lk::tree4_keys(de4.eytzinger), lin_tree = lk::tree4_keys(lin.eytzinger);
  const __m512i de4_codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(de4.sorted_codes)));
  const __m512i lin_codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lin.sorted_codes)));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const lk::Rank4 de4_rank = lk::rank4_tables(de4.thresholds), lin_rank = lk::rank4_tables(lin.thresholds);
  const __m512i de4_flip = _mm512_set1_epi32(static_cast<int>(de4.key_flip));
  const __m512i lin_flip = _mm512_set1_epi32(static_cast<int>(lin.key_flip));
  out[0] = out[1] = out[2] = out[3] = out[4] = out[5] = 0;
  for (uint64_t first = 0; first < (uint64_t(1) << 32); first += 16) {
    const __m512 x = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(first)), lane));
    const __m128i de4_want = lk::encode16(de4.key_entries, de4_flip, x);
    out[0] += differ(lk::encode16_tree4(de4_tree, de4_codes, x), de4_want);
    const __m128i want = lk::encode16(lin.key_entries, lin_flip, x);
    const __mmask16 finite = _mm512_cmplt_epu32_mask(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF)),
                                                     _mm512_set1_epi32(0x7F800000));
    out[4] += differ_in(lk::encode16_rank4_finite(de4_rank, de4_codes, x), de4_want, finite);
    out[5] += differ_in(lk::encode16_rank4_finite(lin_rank, lin_codes, x), want, finite);
    out[1] += differ(lk::encode16_tree4(lin_tree, lin_codes, x), want);
    out[2] += differ(lk::encode16_linear4(x), want);
    const __m256i lo = lk::encode8_linear4(_mm512_castps512_ps256(x));
    const __m256i hi = lk::encode8_linear4(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    out[3] += differ(_mm512_cvtepi32_epi8(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)), want);
  }
}
}  // namespace

// The vector 4-bit encodes give the key table's code for every float: AVX-512's tree search of both
// 4-bit formats, and the formula that replaces the tree for the evenly spaced one in the AVX-512
// and AVX2 steps (only that format's tables claim the formula), and the float-compare tree the
// AVX-512 step takes for a block whose values are all finite, on the finite floats. Checked where
// AVX-512 runs.
TEST(Codebooks, FourBitVectorEncodesEqualTheKeyTableOnEveryFloat) {
  for (auto f : lowbit_test::all_formats())
    EXPECT_EQ(lk::format_tables(f).linear4, f == QuantFormat::Linear4Unsigned) << lowbit::format_name(f);
  if (!lk::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 here";
  int64_t bad[6];
  four_bit_mismatches(bad);
  EXPECT_EQ(bad[0], 0) << "DE4Signed, tree";
  EXPECT_EQ(bad[1], 0) << "Linear4Unsigned, tree";
  EXPECT_EQ(bad[2], 0) << "Linear4Unsigned, formula";
  EXPECT_EQ(bad[3], 0) << "Linear4Unsigned, formula on AVX2";
  EXPECT_EQ(bad[4], 0) << "DE4Signed, float tree on finite values";
  EXPECT_EQ(bad[5], 0) << "Linear4Unsigned, float tree on finite values";
}
#endif

TEST(Codebooks, ParseNames) {
  QuantFormat f;
  EXPECT_TRUE(lowbit::parse_format("fp8e5m2", &f));
  EXPECT_EQ(f, QuantFormat::FP8E5M2);
  EXPECT_FALSE(lowbit::parse_format("int8", &f));
  EXPECT_THROW(lowbit::format_from_name("int8"), c10::Error);
}
