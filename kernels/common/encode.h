// Per-element encode/decode and per-block scale rules, shared by the CPU loops and GPU kernels.
#pragma once

#include <cfloat>
#include <cstdint>

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

// The value a block's elements are divided by. An all-zero block has absmax 0: every element is
// encoded as normalized 0 and decodes to codebook[code] * 0 = 0, for every format.
LOWBIT_HD float normalize(float x, float absmax) { return absmax > 0.0f ? x / absmax : 0.0f; }

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

LOWBIT_HD void scan_merge(BlockScan& s, const BlockScan& o) {
  s.nonfinite |= o.nonfinite;
  s.negative |= o.negative;
  s.amax = o.amax > s.amax ? o.amax : s.amax;
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

}  // namespace kernels
}  // namespace lowbit
