// AVX-512 block scan and encode of normalized blocks (format_tables.h), shared by the quantizer and
// the fused optimizer step so both inline them into their block loops. Internal linkage: each file
// that includes this gets its own copy, compiled for AVX-512 only where its callers are.
#pragma once
#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>

#include "../common/encode.h"

namespace lowbit {
namespace kernels {

#define LOWBIT_AVX512_ENCODE __attribute__((target("avx512f,avx512bw,avx512vl"))) static inline

// The block scan of block_ops' scan_block on 16 lanes (m: the lanes in the block): the largest
// |x| bit pattern so far, and whether any lane held a negative value (-0.0 is not).
LOWBIT_AVX512_ENCODE void scan16(__m512 x, __mmask16 m, __m512i& max_bits, __mmask16& negative) {
  const __m512i u = _mm512_castps_si512(x);
  max_bits = _mm512_mask_max_epu32(max_bits, m, max_bits, _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)));
  negative |= _mm512_mask_cmpgt_epu32_mask(m, u, _mm512_set1_epi32(INT32_MIN));
}

// normalize (encode.h) on 16 lanes. The 16-lane encodes below take its result.
LOWBIT_AVX512_ENCODE __m512 normalize16(__m512 x, __m512 pre, __m512 inv) {
  return _mm512_mul_ps(_mm512_mul_ps(x, pre), inv);
}

// 16 normalized lanes by the key table (format_tables.h: FormatView::encode): -0.0 made +0.0, x in
// one ternary-logic op (u ^ (sign & flip)), one dword gather of the entries, one add, and the code, byte 2 of each
// lane, moved to the low 16 bytes (a byte shuffle within 128-bit lanes, then a dword permute).
LOWBIT_AVX512_ENCODE __m128i encode16(const uint32_t* table, __m512i flip, __m512 n) {
  const __m512i u = _mm512_castps_si512(_mm512_add_ps(n, _mm512_setzero_ps()));  // -0.0 as +0.0
  const __m512i x = _mm512_ternarylogic_epi32(u, _mm512_srai_epi32(u, 31), flip, 0x78);  // a ^ (b & c)
  const __m512i e = _mm512_add_epi32(_mm512_i32gather_epi32(_mm512_srli_epi32(x, 16), table, 4), x);
  const __m512i b = _mm512_shuffle_epi8(e, _mm512_set4_epi32(-1, -1, -1, 0x0E0A0602));
  return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), b));
}

// An 8-bit block: one code per byte, a masked tail.
LOWBIT_AVX512_ENCODE void encode_block8(const uint32_t* table, uint32_t flip, Normalizer nz, const float* v,
                                        int64_t len, uint8_t* out) {
  const __m512 pre = _mm512_set1_ps(nz.pre), inv = _mm512_set1_ps(nz.inv);
  const __m512i f = _mm512_set1_epi32(static_cast<int>(flip));
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), encode16(table, f, normalize16(_mm512_loadu_ps(v + i), pre, inv)));
  if (i < len) {
    const __mmask16 m = static_cast<__mmask16>((1u << (len - i)) - 1u);
    _mm_mask_storeu_epi8(out + i, m, encode16(table, f, normalize16(_mm512_maskz_loadu_ps(m, v + i), pre, inv)));
  }
}

// Two 4-bit codes per byte: as 16-bit words the codes are (even | odd << 8); (w | w >> 4) has the
// packed byte low, and a saturating narrow of the masked words writes 8 bytes.
LOWBIT_AVX512_ENCODE __m128i pack_nibbles(__m128i c) {
  const __m128i w = _mm_and_si128(_mm_or_si128(c, _mm_srli_epi16(c, 4)), _mm_set1_epi16(0xFF));
  return _mm_packus_epi16(w, w);
}

// The 4-bit search tree as order keys (encode.h's order_key_bits, as signed integers: the float
// order with -0.0 below +0.0 and NaNs by sign at either end), so the tree gives the key table's
// answer for every input (NaN included), as the scalar and AVX2 paths do. Padding (+Inf: fewer
// than 15 thresholds) becomes the largest key, which no input exceeds.
LOWBIT_AVX512_ENCODE __m512i signed_keys16(__m512i u) {
  return _mm512_xor_si512(u, _mm512_and_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32(0x7FFFFFFF)));
}
LOWBIT_AVX512_ENCODE __m512i tree4_keys(const float* eytzinger) {
  const __m512i u = _mm512_loadu_si512(eytzinger);
  return _mm512_mask_mov_epi32(signed_keys16(u), _mm512_cmpeq_epi32_mask(u, _mm512_set1_epi32(0x7F800000)),
                               _mm512_set1_epi32(INT32_MAX));
}

// 4-bit: #{thresholds < x} by descending the 15-node tree held in one register (four permutes and
// compares of keys), then the code of that count from a 16-entry table, also in a register.
LOWBIT_AVX512_ENCODE __m128i encode16_tree4(__m512i tree, __m512i codes, __m512 n) {
  const __m512i k = signed_keys16(_mm512_castps_si512(n));
  const __m512i one = _mm512_set1_epi32(1);
  __m512i i = one;
  for (int level = 0; level < 4; ++level) {
    const __mmask16 right = _mm512_cmpgt_epi32_mask(k, _mm512_permutexvar_epi32(i, tree));
    i = _mm512_add_epi32(i, i);
    i = _mm512_mask_add_epi32(i, right, i, one);
  }
  return _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(i, codes));  // i - 16 == i mod 16
}

// The same count for values known to be finite (a block whose absmax is finite), with float compares
// (there the floats' order is the keys': no threshold is -0.0, and -0.0 and +0.0 fall on the same
// side of every other), as a rank: steps of 8, 4, 2 and 1, each adding its step where the value is
// above the sorted threshold at rank + step - 1, read from the thresholds shifted by step - 1 (the
// first step's is one threshold). Three ops a step where the tree's descent takes four.
struct Rank4 {
  __m512 at7;            // t[7] in every lane
  __m512 by4, by2, by1;  // lane j: t[j + 3], t[j + 1], t[j]
};
LOWBIT_AVX512_ENCODE Rank4 rank4_tables(const float* sorted) {  // 16 ascending, padded with +Inf
  const __m512 t = _mm512_loadu_ps(sorted);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i last = _mm512_set1_epi32(15);
  return {_mm512_set1_ps(sorted[7]),
          _mm512_permutexvar_ps(_mm512_min_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(3)), last), t),
          _mm512_permutexvar_ps(_mm512_min_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(1)), last), t), t};
}
LOWBIT_AVX512_ENCODE __m128i encode16_rank4_finite(const Rank4& r, __m512i codes, __m512 n) {
  __m512i rank = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(n, r.at7, _CMP_GT_OQ), _mm512_set1_epi32(8));
  rank = _mm512_mask_add_epi32(rank, _mm512_cmp_ps_mask(n, _mm512_permutexvar_ps(rank, r.by4), _CMP_GT_OQ), rank,
                               _mm512_set1_epi32(4));
  rank = _mm512_mask_add_epi32(rank, _mm512_cmp_ps_mask(n, _mm512_permutexvar_ps(rank, r.by2), _CMP_GT_OQ), rank,
                               _mm512_set1_epi32(2));
  rank = _mm512_mask_add_epi32(rank, _mm512_cmp_ps_mask(n, _mm512_permutexvar_ps(rank, r.by1), _CMP_GT_OQ), rank,
                               _mm512_set1_epi32(1));
  return _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(rank, codes));
}

// A 4-bit block, packed: (len + 1) / 2 bytes; lanes past the end encode as 0, so an odd last
// element leaves its high nibble 0.
LOWBIT_AVX512_ENCODE void encode_block4_packed(__m512i tree, __m512i codes, Normalizer nz, const float* v,
                                               int64_t len, uint8_t* out) {
  const __m512 pre = _mm512_set1_ps(nz.pre), inv = _mm512_set1_ps(nz.inv);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 2),
                     pack_nibbles(encode16_tree4(tree, codes, normalize16(_mm512_loadu_ps(v + i), pre, inv))));
  if (i < len) {
    const __mmask16 m = static_cast<__mmask16>((1u << (len - i)) - 1u);
    const __m128i c = _mm_maskz_mov_epi8(m, encode16_tree4(tree, codes, normalize16(_mm512_maskz_loadu_ps(m, v + i), pre, inv)));
    _mm_mask_storeu_epi8(out + i / 2, static_cast<__mmask16>((1u << ((len - i + 1) / 2)) - 1u), pack_nibbles(c));
  }
}

#undef LOWBIT_AVX512_ENCODE

}  // namespace kernels
}  // namespace lowbit

#endif
