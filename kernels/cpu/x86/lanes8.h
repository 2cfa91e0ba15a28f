// 8 lanes of the AVX2 loops to and from memory: parameters, gradients and bf16 state (fp32, bf16,
// fp16) loaded as fp32, fp32 stored as bf16 rounded to nearest or stochastically, and the
// master-weight corrections, with the bits of float_convert.h, stochastic_round.h and
// master_weight.h. Whole chunks only: the loops run a block's last len % 8 elements through the
// scalar functions themselves.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "../../common/quantize_params.h"  // ElemType
#include "vec8.h"                          // its check that the includer is compiled for AVX2

namespace lowbit {
namespace kernels {
namespace {  // internal linkage, as vec8.h's helpers

// to_f32(f16_t) on 8 lanes: vcvtph2ps is exact (subnormals included) but quiets a signaling NaN,
// which to_f32 keeps as it is: NaN lanes take to_f32's bits.
inline __m256 f16x8_to_f32(__m128i h) {
  const __m256i u = _mm256_cvtepu16_epi32(h);
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFF));
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7C00));
  const __m256i bits = _mm256_or_si256(
      _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x8000)), 16), _mm256_set1_epi32(0x7F800000)),
      _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x3FF)), 13));
  return _mm256_blendv_ps(_mm256_cvtph_ps(h), _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
}

inline __m256 bf16x8_to_f32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 whole lanes from element i.
inline __m256 load8(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::F32: return _mm256_loadu_ps(static_cast<const float*>(p) + i);
    case ElemType::BF16:
      return bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    case ElemType::F16:
      return f16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
  }
  return _mm256_setzero_ps();
}

// 8 dwords that hold 16-bit values to 8 words.
inline __m128i narrow16(__m256i r) {
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

// from_f32<bf16_t>: round to nearest even on the bits, NaN to 0x7FC0; the 8 results in dwords.
inline __m256i bf16_nearest_bits(__m256i u) {
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i nan =
      _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}

inline void store8_bf16(uint16_t* out, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), narrow16(bf16_nearest_bits(_mm256_castps_si256(x))));
}

// sr_noise of stochastic_round.h on 8 lanes: elements index0 .. index0 + 7 (the low halves carry
// into the high ones where they wrap).
inline __m256i sr_noise8(uint64_t seed, uint64_t index0) {
  const __m256i lo0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0)));
  const __m256i lo = _mm256_add_epi32(lo0, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);  // unsigned lo < lo0 as a signed compare
  const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(lo0, flip), _mm256_xor_si256(lo, flip));
  const __m256i hi = _mm256_sub_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0 >> 32))), carry);
  const __m256i s_lo = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed)));
  const __m256i s_hi = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed >> 32)));
  __m256i x = _mm256_add_epi32(_mm256_xor_si256(lo, s_lo), _mm256_mullo_epi32(_mm256_xor_si256(hi, s_hi),
                                                                              _mm256_set1_epi32(static_cast<int>(0x9E3779B9u))));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7FEB352D));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846CA68Bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  return _mm256_srli_epi32(x, 16);
}

// bf16_stochastic of stochastic_round.h on 8 lanes: elements index0 .. index0 + 7.
inline void store8_bf16_stochastic(uint16_t* out, __m256 x, uint64_t seed, uint64_t index0) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i exp = _mm256_set1_epi32(0x7F800000);
  const __m256i r = _mm256_add_epi32(u, sr_noise8(seed, index0));
  // Past the largest finite value: clamp to it, keeping the sign.
  const __m256i over = _mm256_cmpeq_epi32(_mm256_and_si256(r, exp), exp);
  __m256i b = _mm256_blendv_epi8(_mm256_srli_epi32(r, 16),
                                 _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x7F7F)), over);
  // Inf and NaN round to nearest, as from_f32 does.
  const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(u, exp), exp);
  if (!_mm256_testz_si256(special, special)) b = _mm256_blendv_epi8(b, bf16_nearest_bits(u), special);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), narrow16(b));
}

// ---- master weights (master_weight.h) ------------------------------------------------------------

// master_from16 / master_from8: (b << 16) + c, c = the int16 correction or 256 times the int8 one.
inline __m256 master8_from16(const uint16_t* b, const int16_t* c) {
  const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))), 16);
  const __m256i lo = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
  return _mm256_castsi256_ps(_mm256_add_epi32(hi, lo));
}

inline __m256 master8_from8(const uint16_t* b, const int8_t* c) {
  const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))), 16);
  const __m256i lo = _mm256_slli_epi32(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c))), 8);
  return _mm256_castsi256_ps(_mm256_add_epi32(hi, lo));
}

// master_to16 / master_to8 on 8 lanes: NaN masters store the canonical NaN, sign kept, and 0.
inline __m256i master_nan_lanes(__m256i u) {
  return _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
}
inline __m256i master_nan_bits(__m256i u) {
  return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
                         _mm256_set1_epi32(0x7FC0));
}

inline void master8_to16(__m256 x, uint16_t* b, int16_t* c) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i nan = master_nan_lanes(u);
  __m256i hi = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x8000)), 16);
  __m256i lo = _mm256_sub_epi32(u, _mm256_slli_epi32(hi, 16));  // in [-32768, 32767]
  hi = _mm256_blendv_epi8(hi, master_nan_bits(u), nan);
  lo = _mm256_andnot_si256(nan, lo);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b), narrow16(hi));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(c),
                   _mm_packs_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
}

inline void master8_to8(__m256 x, uint16_t* b, int8_t* c) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i nan = master_nan_lanes(u);
  const __m256i q = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x80)), 8);
  __m256i hi = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x8080)), 16);
  __m256i lo = _mm256_sub_epi32(q, _mm256_slli_epi32(hi, 8));  // in [-128, 127]
  hi = _mm256_blendv_epi8(hi, master_nan_bits(u), nan);
  lo = _mm256_andnot_si256(nan, lo);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(b), narrow16(hi));
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(c), _mm_packs_epi16(w, w));
}

}  // namespace
}  // namespace kernels
}  // namespace lowbit
