// Codebooks of every QuantFormat, generated in code, and the tables that encode against them.
//
// Encoding rule (DESIGN.md): a value maps to the nearest codebook value, ties to the lower code,
// except that a nonzero value never maps to zero (keep_nonzero_off_zero).
// We turn that rule into fp32 thresholds once, on the host, so that every backend (CPU loop, CUDA,
// HIP, the ATen reference through torch.bucketize) computes the same thing with plain float
// compares: code = sorted_codes[#{ i : thresholds[i] < x }]. See make_thresholds for the proof
// that the compare is exact.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <stdexcept>
#include <vector>

#include "compand.h"
#include "encode.h"
#include "format_table.h"

namespace lowbit {
namespace kernels {

// ------------------------------------------------------------------------------------------------
// Codebook generation
// ------------------------------------------------------------------------------------------------

// torch.linspace(0.1, 1, steps) in float32, rounded once per element as ATen's CPU kernel does
// (start + step*i for the first half, end - step*(steps-1-i) for the second, fused).
inline std::vector<float> linspace_f32(float start, float end, int steps) {
  std::vector<float> out(steps);
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int half = steps / 2;
  for (int i = 0; i < steps; ++i) {
    out[i] = i < half ? std::fma(step, static_cast<float>(i), start)
                      : std::fma(-step, static_cast<float>(steps - 1 - i), end);
  }
  return out;
}

// The dynamic tree map of Dettmers et al., "8-bit Optimizers via Block-wise Quantization"
// (arXiv 2110.02861): for each decade 10^-(E-1) .. 10^0 the midpoints of an even grid on [0.1, 1]
// with twice as many points per decade as the last, plus 0 and 1. The unsigned map spends the sign
// bit on one more fraction bit. Built in float32 exactly as bitsandbytes' create_dynamic_map, so its
// values (and published results) carry over; sorted ascending, the index is the code.
inline std::vector<float> dynamic_map(bool is_signed, int exponent_bits, int total_bits) {
  std::vector<float> data;
  const int non_sign_bits = total_bits - 1;
  for (int i = 0; i < exponent_bits; ++i) {
    const int items = is_signed ? (1 << (i + non_sign_bits - exponent_bits)) + 1
                                : (1 << (i + non_sign_bits - exponent_bits + 1)) + 1;
    const std::vector<float> grid = linspace_f32(0.1f, 1.0f, items);
    const float scale = static_cast<float>(std::pow(10.0, -(exponent_bits - 1) + i));
    for (int k = 0; k + 1 < items; ++k) {
      const float mean = (grid[k] + grid[k + 1]) / 2.0f;
      data.push_back(scale * mean);
      if (is_signed) data.push_back(-(scale * mean));
    }
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  while (data.size() < (size_t(1) << total_bits)) data.push_back(0.0f);
  std::sort(data.begin(), data.end());
  return data;
}

// Value of an fp8 bit pattern with `mbits` mantissa bits and exponent bias `bias`. e4m3fn has no
// infinities (only 0x7F/0xFF are NaN); e5m2 follows IEEE (exponent all ones = Inf/NaN).
inline double fp8_value(uint8_t code, int mbits, int bias, bool ieee_special) {
  const int ebits = 7 - mbits;
  const int sign = code >> 7;
  const int e = (code >> mbits) & ((1 << ebits) - 1);
  const int m = code & ((1 << mbits) - 1);
  const double s = sign ? -1.0 : 1.0;
  const int emax = (1 << ebits) - 1;
  if (ieee_special && e == emax) return m ? std::numeric_limits<double>::quiet_NaN() : s * INFINITY;
  if (!ieee_special && e == emax && m == (1 << mbits) - 1) return std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return s * std::ldexp(static_cast<double>(m), 1 - bias - mbits);
  return s * std::ldexp(1.0 + static_cast<double>(m) / (1 << mbits), e - bias);
}

// Decoded (normalized) value of every code of `fmt`: codebook[code] * absmax is the decoded
// element. 4-bit formats have 16 entries, 8-bit ones 256. FP8 codes that are NaN/Inf patterns are
// NaN here: the encoder never produces them.
inline std::vector<float> make_codebook(QuantFormat fmt) {
  const FormatSpec& f = format_spec(fmt);
  switch (f.codebook) {
    case CodebookKind::DynamicTree: return dynamic_map(f.is_signed, f.exponent_bits, f.bits);
    case CodebookKind::Linear: {
      std::vector<float> v(size_t(1) << f.bits);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1) / static_cast<float>(v.size());
      return v;
    }
    case CodebookKind::Float8: {
      std::vector<float> v(256);
      for (int c = 0; c < 256; ++c) {
        const double x = fp8_value(uint8_t(c), f.mantissa_bits, f.exponent_bias, f.ieee_special);
        v[c] = std::isfinite(x) ? static_cast<float>(x / f.max_value) : std::numeric_limits<float>::quiet_NaN();
      }
      return v;
    }
    case CodebookKind::Power: {
      std::vector<float> v(256);
      for (int c = 0; c < 256; ++c) v[c] = pow8_decode(static_cast<uint32_t>(c), f.is_signed);
      return v;
    }
  }
  return {};
}

// ------------------------------------------------------------------------------------------------
// Encode tables
// ------------------------------------------------------------------------------------------------

struct EncodeTable {
  int bits = 8;
  int depth = 8;              // levels of the Eytzinger tree: 2^depth - 1 keys
  int num_values = 0;         // distinct finite codebook values
  float thresholds[256];      // ascending; num_values-1 real ones, then +inf
  uint8_t sorted_codes[256];  // code of the k-th smallest value
  float eytzinger[256];       // thresholds as a perfect BST in breadth-first order, index 1..255
};

// For neighbours a < b with codes ca, cb, the threshold t such that, for every float x in [a, b],
//   x > t  <=>  x is nearer b than a, or equally near and cb < ca.
// The exact midpoint m = (a+b)/2 is a double. For float x: x > m <=> x > floor_f32(m) when m is not
// a float; when it is, x == m is a tie and we step t one float down iff the tie goes to b.
inline float make_threshold(float a, float b, int ca, int cb) {
  const double m = (static_cast<double>(a) + static_cast<double>(b)) / 2.0;
  float t = static_cast<float>(m);
  if (static_cast<double>(t) > m) t = std::nextafter(t, -INFINITY);
  const bool exact = static_cast<double>(t) == m;
  if (exact && cb < ca) t = std::nextafter(t, -INFINITY);
  return t;
}

inline float float_of_order_key(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? key ^ 0x80000000u : ~key;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
inline uint32_t order_key_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

// Thresholds of a format encoded by arithmetic (compand.h): its encode is monotone in x and its
// codes are in value order, so threshold i is the largest float x with encode(x) <= i, found by
// bisection over the floats in order; then #{thresholds < x} == encode(x) for every non-NaN x, and
// the table-driven paths give the arithmetic's codes (tests/test_codebooks.cpp checks all floats).
inline void arithmetic_thresholds(QuantFormat fmt, EncodeTable& tab) {
  const bool is_signed = format_is_signed(fmt);
  for (int i = 0; i < tab.num_values; ++i)
    if (tab.sorted_codes[i] != i) throw std::logic_error("arithmetic_thresholds: codes not in value order");
  const uint32_t lo_key = order_key_of(-INFINITY), hi_key = order_key_of(INFINITY);
  for (int i = 0; i + 1 < tab.num_values; ++i) {
    uint32_t lo = lo_key, hi = hi_key;  // encode(lo) <= i < encode(hi)
    if (pow8_encode(float_of_order_key(lo), is_signed) > i || pow8_encode(float_of_order_key(hi), is_signed) <= i)
      throw std::logic_error("arithmetic_thresholds: code out of range");
    while (hi - lo > 1) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (pow8_encode(float_of_order_key(mid), is_signed) <= i) lo = mid;
      else hi = mid;
    }
    tab.thresholds[i] = float_of_order_key(lo);
  }
}

// A nonzero value never encodes to zero: it takes the nonzero code of its sign nearest to zero.
// A second moment that is small but positive then never decodes to 0, which would divide its
// update by eps alone (m / eps: tens of learning rates where gradients are sparse); a tiny first
// moment keeps its sign. The thresholds around the zero value move to the floats next to 0:
// -denorm_min below it (x <= -denorm_min counts it) and +0.0 above (x > 0 counts it), so both
// zeros, and only they, encode to zero. (A value whose ratio to its block's absmax is below the
// smallest float normalizes to 0 first and encodes to zero: normalize's one rounding.)
inline void keep_nonzero_off_zero(const std::vector<std::pair<float, int>>& sorted_values, EncodeTable& tab) {
  for (int i = 0; i < tab.num_values; ++i) {
    if (sorted_values[i].first != 0.0f) continue;
    if (i > 0) tab.thresholds[i - 1] = -std::numeric_limits<float>::denorm_min();
    if (i + 1 < tab.num_values) tab.thresholds[i] = 0.0f;
  }
}

inline EncodeTable make_encode_table(QuantFormat fmt) {
  EncodeTable tab;
  tab.bits = format_bits(fmt);
  tab.depth = tab.bits;
  const std::vector<float> cb = make_codebook(fmt);
  // (value, code), finite only; equal values (fp8's -0 and +0) keep the lower code.
  std::vector<std::pair<float, int>> vals;
  for (int c = 0; c < static_cast<int>(cb.size()); ++c)
    if (std::isfinite(cb[c])) vals.push_back({cb[c], c});
  std::sort(vals.begin(), vals.end());
  std::vector<std::pair<float, int>> uniq;
  for (const auto& v : vals)
    if (uniq.empty() || uniq.back().first != v.first) uniq.push_back(v);
  tab.num_values = static_cast<int>(uniq.size());
  for (int i = 0; i < 256; ++i) {
    tab.thresholds[i] = INFINITY;
    tab.sorted_codes[i] = 0;
    tab.eytzinger[i] = INFINITY;
  }
  for (int i = 0; i < tab.num_values; ++i) tab.sorted_codes[i] = static_cast<uint8_t>(uniq[i].second);
  if (format_spec(fmt).codebook == CodebookKind::Power) {
    arithmetic_thresholds(fmt, tab);  // pow8_encode keeps nonzero values off zero itself
  } else {
    for (int i = 0; i + 1 < tab.num_values; ++i)
      tab.thresholds[i] = make_threshold(uniq[i].first, uniq[i + 1].first, uniq[i].second, uniq[i + 1].second);
    keep_nonzero_off_zero(uniq, tab);
  }
  // In-order walk of the perfect tree assigns the sorted keys.
  const int nkeys = (1 << tab.depth) - 1;
  int next = 0;
  std::vector<int> stack;
  int node = 1;
  while (node <= nkeys || !stack.empty()) {
    while (node <= nkeys) {
      stack.push_back(node);
      node = 2 * node;
    }
    node = stack.back();
    stack.pop_back();
    tab.eytzinger[node] = tab.thresholds[next++];
    node = 2 * node + 1;
  }
  return tab;
}

// Start table for encoding by window bucket (encode.h: window_bucket):
//   starts[b] = #{thresholds t : window_bucket(t) < b},
// so #{thresholds < x} = starts[b] + (thresholds[starts[b]] < x) for x in bucket b (thresholds
// padded with +inf), because buckets follow the value order and no bucket holds two thresholds,
// which this checks. Thresholds of -0.0 count as +0.0 (the GPU tables store +0.0): a -0.0 would
// sit in a negative bucket yet not be below +0.0.
inline std::vector<uint8_t> make_window_starts(const EncodeTable& tab) {
  const int nthr = tab.num_values - 1;
  const auto bucket_of = [&](int k) {
    const float t = tab.thresholds[k] + 0.0f;
    uint32_t u;
    std::memcpy(&u, &t, 4);
    return window_bucket(u);
  };
  std::vector<uint8_t> starts(size_t(1) << kWindowBucketBits);
  int j = 0;  // thresholds in buckets below b
  for (uint32_t b = 0; b < starts.size(); ++b) {
    while (j < nthr && bucket_of(j) < b) ++j;
    starts[b] = static_cast<uint8_t>(j);  // at most 255 thresholds
    if (j + 1 < nthr && bucket_of(j) == b && bucket_of(j + 1) == b)
      throw std::logic_error("make_window_starts: two thresholds share a window bucket");
  }
  return starts;
}

// One lookup and one add per element on the CPU (FormatView::encode). A float's bits u become
//   x = u ^ (u < 0 ? flip : 0),
// which orders the floats of one sign as the codes go: flip = 0x7FFFFFFF where codes follow the
// values (x is then the order key of encode.h with its top bit flipped), 0 where codes are sign and
// magnitude (FP8: x orders each sign by magnitude). Floats sharing x's top 16 bits form a bucket;
// within one the code is c up to the bucket's threshold T (x's low bits) and c + 1 above it, so
//   code = ((entries[x >> 16] + x) >> 16) & 0xFF,  entries[b] = (c << 16) + (0xFFFF - T) - (b << 16):
// the entry's low half plus x's low bits carries into c exactly when they pass T, and its - (b << 16)
// cancels x's high half. A bucket without a threshold has T = 0xFFFF, which no low bits pass.
// Needs at most one threshold per bucket, no threshold of -0.0 (whose order key would split -0.0
// from +0.0) and codes that step by +1 across every threshold in one of the two orders: true for
// every built-in format, and checked. The encode looks up x + 0.0 (-0.0 becomes +0.0, nothing else
// changes), so no entry serves -0.0: FP8's threshold just below it (the smallest negative float
// encodes to -min's code, -0.0 to zero's) would otherwise step from zero's code 0 to 0x81.
struct KeyTable {
  std::vector<uint32_t> entries;  // 64Ki
  uint32_t flip = 0;
};
inline KeyTable make_key_table(const EncodeTable& tab) {
  // Per bucket of order keys (key >> 16): the code below and above its threshold and the
  // threshold's low key bits (0xFFFF: none).
  const int nthr = tab.num_values - 1;
  std::vector<uint8_t> below(1u << 16), above(1u << 16);
  std::vector<uint32_t> thr(1u << 16);
  int j = 0;  // thresholds below the current bucket
  for (uint32_t b = 0; b < (1u << 16); ++b) {
    while (j < nthr && (order_key_of(tab.thresholds[j]) >> 16) < b) ++j;
    below[b] = above[b] = tab.sorted_codes[j];
    thr[b] = 0xFFFFu;
    // A threshold with only -0.0 (key 0x7FFFFFFF) above it in its bucket separates nothing looked up.
    if (j < nthr && (order_key_of(tab.thresholds[j]) >> 16) == b && order_key_of(tab.thresholds[j]) != 0x7FFFFFFEu) {
      if (j + 1 < nthr && (order_key_of(tab.thresholds[j + 1]) >> 16) == b)
        throw std::logic_error("make_key_table: two thresholds share a 16-bit key bucket");
      if (order_key_of(tab.thresholds[j]) == 0x7FFFFFFFu)
        throw std::logic_error("make_key_table: a threshold of -0.0");
      above[b] = tab.sorted_codes[j + 1];
      thr[b] = order_key_of(tab.thresholds[j]) & 0xFFFFu;
    }
  }
  // Bucket b of x holds the key bucket b ^ 0x8000 in the key's order, but for a negative bucket
  // with flip 0: key bucket 0xFFFF - b, its order reversed (x's low bits are the key's complemented).
  for (const uint32_t flip : {0x7FFFFFFFu, 0u}) {
    KeyTable out{std::vector<uint32_t>(1u << 16), flip};
    bool fits = true;
    for (uint32_t b = 0; b < (1u << 16) && fits; ++b) {
      const bool reversed = flip == 0 && b >= 0x8000u;
      const uint32_t k = reversed ? 0xFFFFu - b : b ^ 0x8000u;
      uint32_t c = below[k], t = thr[k];
      if (t != 0xFFFFu) {
        // In x's order the codes are `below` up to t and `above` past it, or reversed: `above` up
        // to 0xFFFE - t (x's low bits <= 0xFFFE - t <=> the key's > t) and `below` past it.
        const uint32_t next = reversed ? below[k] : above[k];
        if (reversed) c = above[k], t = 0xFFFEu - t;
        fits = next == c + 1;
      }
      out.entries[b] = (c << 16) + (0xFFFFu - t) - (b << 16);
    }
    if (fits) return out;
  }
  throw std::logic_error("make_key_table: the codes step by more than one across a threshold in either order");
}

}  // namespace kernels
}  // namespace lowbit
