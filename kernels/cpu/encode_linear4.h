// Linear4Unsigned's codes by a formula, on 16 lanes (AVX-512) and 8 (AVX2): the CPU step's
// encode of Q4's second moment, where the other 4-bit format descends a search tree.
//
// The codebook is (c + 1) / 16, so the thresholds are (2k + 3) / 32 and the codes are in value
// order (FormatView::linear4 checks both against the tables), and for a normalized value n
//   #{k < 15 : (2k + 3) / 32 < n} = clamp(ceil(16 n - 1.5), 0, 15).
// 16 n is exact, and so is 16 n - 1.5 wherever the ceiling can land on 1..14 (16 n below 2^23,
// where 1.5 is a multiple of its ulp); elsewhere the clamp decides. A NaN is placed as the key
// table places it (encode.h's order keys): 0 with its sign set, 15 without. Both equal the key
// table on every float (test_codebooks). Internal linkage, as encode_avx512.h.
#pragma once
#if defined(__x86_64__)

#include <immintrin.h>

namespace lowbit {
namespace kernels {

// n already normalized; 16 byte codes.
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m128i encode16_linear4(__m512 n) {
  const __m512 z = _mm512_sub_ps(_mm512_mul_ps(n, _mm512_set1_ps(16.0f)), _mm512_set1_ps(1.5f));
  // max(z, 0) is 0 for a NaN z (the second operand); a NaN without its sign is set to 15. Then the
  // ceiling, in the conversion.
  __m512 c = _mm512_min_ps(_mm512_max_ps(z, _mm512_setzero_ps()), _mm512_set1_ps(15.0f));
  const __mmask16 nan = _mm512_cmp_ps_mask(n, n, _CMP_UNORD_Q);
  c = _mm512_mask_mov_ps(c, _mm512_mask_cmpge_epi32_mask(nan, _mm512_castps_si512(n), _mm512_setzero_si512()),
                         _mm512_set1_ps(15.0f));
  return _mm512_cvtepi32_epi8(_mm512_cvt_roundps_epi32(c, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC));
}

// n already normalized; 8 dword codes (as Tree4::encode gives them).
__attribute__((target("avx2"))) static inline __m256i encode8_linear4(__m256 n) {
  const __m256 z = _mm256_sub_ps(_mm256_mul_ps(n, _mm256_set1_ps(16.0f)), _mm256_set1_ps(1.5f));
  __m256 c = _mm256_min_ps(_mm256_max_ps(z, _mm256_setzero_ps()), _mm256_set1_ps(15.0f));
  // The sign bit of (NaN mask and not n): a NaN without its sign.
  const __m256 nan_unsigned = _mm256_andnot_ps(n, _mm256_cmp_ps(n, n, _CMP_UNORD_Q));
  c = _mm256_blendv_ps(c, _mm256_set1_ps(15.0f), nan_unsigned);
  return _mm256_cvtps_epi32(_mm256_ceil_ps(c));
}

}  // namespace kernels
}  // namespace lowbit

#endif
