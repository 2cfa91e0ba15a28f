// Per-element encode/decode and per-block scale rules, shared by the CPU loops and GPU kernels.
#pragma once

#include <cfloat>
#include <cstdint>

#include "float_convert.h"
#include "host_device.h"

namespace lowbit {
namespace kernels {

// Number of thresholds below x, descending the perfect BST stored breadth-first in eytz[1..2^D-1].
// The result equals #{i : thresholds[i] < x} for the sorted thresholds (see code_tables.h).
template <int DEPTH>
LOWBIT_HD int count_below_eytzinger(const float* eytz, float x) {
  int i = 1;
LOWBIT_UNROLL
  for (int level = 0; level < DEPTH; ++level) i = 2 * i + (eytz[i] < x ? 1 : 0);
  return i - (1 << DEPTH);
}

// x / absmax as every backend computes it: one division per block, then a multiply per element,
//   normalized = (x * pre) * inv,   inv = 1 / (absmax * pre),
// where pre (a power of two, so x * pre is exact) keeps inv a normal float for tiny or huge absmax.
// An all-zero block has inv = 0: its elements normalize to 0 and decode to codebook[code] * 0 = 0,
// in every format.
struct Normalizer {
  float pre;
  float inv;
};

LOWBIT_HD Normalizer make_normalizer(float absmax) {
  if (!(absmax > 0.0f)) return {1.0f, 0.0f};
  const float pre = absmax < 0x1p-64f ? 0x1p64f : (absmax > 0x1p64f ? 0x1p-64f : 1.0f);
  return {pre, 1.0f / (absmax * pre)};
}

LOWBIT_HD float normalize(const Normalizer& n, float x) { return (x * n.pre) * n.inv; }

// Order-preserving integer key of a float's bits (NaN aside); branch-free, since half of a signed
// tensor is negative and a mispredicted branch per element costs more than the whole encode.
LOWBIT_HD uint32_t order_key_bits(uint32_t u) {
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

// Encode by window bucket (the GPU kernels; tables from code_tables.h: make_window_starts). A
// float's bucket is its sign and 15 magnitude bits (8 exponent, 7 fraction bits: the CPU's 16-bit
// key buckets, where no built-in format has two thresholds) over the 64 exponents of 2^-62 .. 2^1;
// smaller magnitudes share the lowest bucket of their sign, larger ones (and Inf, NaN) the highest.
// Buckets follow the value order: negatives 0 .. 0x1FFF (most negative first), positives 0x2000 ..
// 0x3FFF. With at most one threshold per bucket, #{thresholds < x} is starts[bucket] plus one
// compare with the threshold at that index: 16 KiB of starts instead of 64 KiB of key entries.
constexpr int kWindowBucketBits = 14;
constexpr uint32_t kWindowLowKey = 65u << 7;  // magnitude key (exponent << 7 | 7 fraction bits) of 2^-62
constexpr uint32_t kWindowTop = (1u << (kWindowBucketBits - 1)) - 1u;

LOWBIT_HD uint32_t window_bucket(uint32_t u) {
  const uint32_t sign = static_cast<uint32_t>(static_cast<int32_t>(u) >> 31);  // 0 or all ones
  const uint32_t key = (u & 0x7FFFFFFFu) >> 16;
  uint32_t idx = key > kWindowLowKey ? key - kWindowLowKey : 0u;
  idx = idx < kWindowTop ? idx : kWindowTop;
  // Negative: kWindowTop - idx (idx ^ ~0 == -idx - 1), so larger magnitudes sort first.
  return (kWindowTop + 1u) + (idx ^ sign);
}

LOWBIT_HD float decode_value(const float* codebook, uint8_t code, float absmax) {
  return codebook[code] * absmax;
}

// Per-block scan state: |x| max, and whether anything is not finite or negative.
struct BlockScan {
  float amax = 0.0f;
  bool nonfinite = false;
  bool negative = false;
};

LOWBIT_HD void scan_add(BlockScan& s, float x) {
  const float a = x < 0.0f ? -x : x;
  s.nonfinite |= !(a <= FLT_MAX);  // true for Inf and NaN
  s.negative |= x < 0.0f;
  s.amax = a > s.amax ? a : s.amax;
}

// The absmax stored for a block. Invalid blocks are flagged in-band, so one reduction over absmax
// finds them without a second pass over the input:
//   NaN        the block holds NaN or Inf;
//   negative   an unsigned format got a negative value.
// The binding layer refuses such input with an error naming the block; a valid absmax is >= 0.
LOWBIT_HD float block_absmax(const BlockScan& s, bool format_signed) {
  if (s.nonfinite) return __builtin_nanf("");
  if (s.negative && !format_signed) return -(s.amax > FLT_MIN ? s.amax : FLT_MIN);
  return s.amax;
}

// The same from a scan kept as bit patterns, as the vector loops keep it: the largest |x| bit
// pattern (at or above Inf's exactly when something is Inf or NaN) and whether a value was negative
// (some raw bit pattern above 0x80000000; -0.0 is not negative).
LOWBIT_HD float block_absmax_from_bits(uint32_t max_abs_bits, uint32_t negative, bool format_signed) {
  BlockScan scan;
  scan.nonfinite = max_abs_bits >= 0x7F800000u;
  scan.negative = negative != 0;
  scan.amax = scan.nonfinite ? 0.0f : f32_from_bits(max_abs_bits);
  return block_absmax(scan, format_signed);
}

}  // namespace kernels
}  // namespace lowbit
