// Per-block loops shared by the CPU quantizer and the fused optimizer step (block_ops.h).
#include "block_ops.h"

#include <vector>

#include "../common/code_tables.h"

namespace lowbit {
namespace kernels {

// Scan of one block: copies it to fp32 in v and returns (through the pointers) the largest |x|
// bit pattern and whether a negative value occurs. On the bit patterns, so the reduction vectorizes
// without fast-math: for non-NaN floats |x| orders like its bits; any bits >= Inf's are Inf or NaN;
// sign set with a nonzero magnitude is a negative value (-0.0 is not). Cloned for AVX-512 / AVX2:
// baseline x86-64 has no 32-bit integer max.
#define LOWBIT_SCAN_BLOCK(T)                                                                            \
  __attribute__((target_clones("avx512f", "avx2", "default"))) void scan_block(                         \
      const T* __restrict__ x, int64_t len, float* __restrict__ v, uint32_t* max_out, uint32_t* neg_out) { \
    uint32_t max_bits = 0, neg = 0;                                                                      \
    for (int64_t i = 0; i < len; ++i) {                                                                  \
      const float xi = to_f32(x[i]);                                                                     \
      v[i] = xi;                                                                                         \
      const uint32_t u = f32_bits(xi);                                                                   \
      const uint32_t a = u & 0x7FFFFFFFu;                                                                \
      max_bits = a > max_bits ? a : max_bits;                                                            \
      neg |= u > 0x80000000u ? 1u : 0u;                                                                  \
    }                                                                                                    \
    *max_out = max_bits;                                                                                 \
    *neg_out = neg;                                                                                      \
  }
LOWBIT_SCAN_BLOCK(float)
LOWBIT_SCAN_BLOCK(bf16_t)
LOWBIT_SCAN_BLOCK(f16_t)
#undef LOWBIT_SCAN_BLOCK

__attribute__((target_clones("avx512f", "avx2", "default"))) void scan_block(const float* __restrict__ x,
                                                                             int64_t len, uint32_t* max_out,
                                                                             uint32_t* neg_out) {
  uint32_t max_bits = 0, neg = 0;
  for (int64_t i = 0; i < len; ++i) {
    const uint32_t u = f32_bits(x[i]);
    const uint32_t a = u & 0x7FFFFFFFu;
    max_bits = a > max_bits ? a : max_bits;
    neg |= u > 0x80000000u ? 1u : 0u;
  }
  *max_out = max_bits;
  *neg_out = neg;
}

float encode_scanned_block(const FormatView& fmt, bool format_signed, const float* v, int64_t len, uint32_t max_bits,
                           uint32_t negative, uint8_t* out) {
  const float am = block_absmax_from_bits(max_bits, negative, format_signed);
  if (fmt.bits == 4) {
    // Blocks hold an even number of elements, so a byte never straddles two blocks.
    encode_codes_packed4(fmt, make_normalizer(am), v, len, out);
  } else {
    encode_codes(fmt, make_normalizer(am), v, len, out);
  }
  return am;
}

}  // namespace kernels
}  // namespace lowbit
