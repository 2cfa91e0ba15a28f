// 16 lanes of the AVX-512 loops to and from memory: a chunk's mask, parameters and gradients (fp32,
// bf16, fp16) loaded as fp32, fp32 stored as bf16 rounded to nearest or stochastically, and master
// weights rebuilt from and split into (bf16, correction), with the bits of float_convert.h,
// stochastic_round.h and master_weight.h.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "../../common/quantize_params.h"  // ElemType
#include "vec16.h"                         // its check that the includer is compiled for AVX-512

namespace lowbit {
namespace kernels {
namespace {  // internal linkage, as vec16.h's helpers

// The lanes of a 16-lane chunk that lie before the end (remaining elements left).
inline __mmask16 lanes_below(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << remaining) - 1u);
}

// A chunk's lanes of 4, 2 or 1 bytes: a whole chunk by a plain load, a short one by a zeroing masked
// load (the same lanes either way). Streamed from memory, the masked load is about 1.5x slower than
// the plain one on Zen 5 (arrays of 2^24 floats, one thread; masked stores cost nothing extra), so
// the loops pay it only on a parameter's last chunk.
inline __m512 load16_ps(const float* p, __mmask16 m) {
  return m == __mmask16(0xFFFF) ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
inline __m256i load16_epi16(const void* p, __mmask16 m) {
  return m == __mmask16(0xFFFF) ? _mm256_loadu_si256(static_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
}
inline __m128i load16_epi8(const void* p, __mmask16 m) {
  return m == __mmask16(0xFFFF) ? _mm_loadu_si128(static_cast<const __m128i*>(p)) : _mm_maskz_loadu_epi8(m, p);
}

inline __m512 load16(const void* p, ElemType t, int64_t i, __mmask16 m) {
  switch (t) {
    case ElemType::F32: return load16_ps(static_cast<const float*>(p) + i, m);
    case ElemType::BF16: {
      const __m256i h = load16_epi16(static_cast<const uint16_t*>(p) + i, m);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case ElemType::F16:
      return _mm512_cvtph_ps(load16_epi16(static_cast<const uint16_t*>(p) + i, m));
  }
  return _mm512_setzero_ps();
}

// from_f32<bf16_t> on 16 lanes: round to nearest even on the bits, NaN to 0x7FC0.
inline void store16_bf16(uint16_t* out, __m512 x, __mmask16 m) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(out, m, _mm512_cvtepi32_epi16(r));
}

// sr_noise of stochastic_round.h on 16 lanes: elements index0 .. index0 + 15 (the low halves
// carry into the high ones where they wrap).
inline __m512i sr_noise16(uint64_t seed, uint64_t index0) {
  const __m512i lo0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0)));
  const __m512i lo = _mm512_add_epi32(lo0, _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
  const __mmask16 carry = _mm512_cmplt_epu32_mask(lo, lo0);
  const __m512i hi0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(index0 >> 32)));
  const __m512i hi = _mm512_mask_add_epi32(hi0, carry, hi0, _mm512_set1_epi32(1));
  const __m512i s_lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed)));
  const __m512i s_hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(seed >> 32)));
  __m512i x = _mm512_add_epi32(_mm512_xor_si512(lo, s_lo),
                               _mm512_mullo_epi32(_mm512_xor_si512(hi, s_hi), _mm512_set1_epi32(static_cast<int>(0x9E3779B9u))));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7FEB352D));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846CA68Bu)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  return _mm512_srli_epi32(x, 16);
}

// bf16_stochastic of stochastic_round.h on 16 lanes: elements index0 .. index0 + 15.
inline void store16_bf16_stochastic(uint16_t* out, __m512 x, __mmask16 m, uint64_t seed,
                                                  uint64_t index0) {
  const __m512i noise = sr_noise16(seed, index0);
  const __m512i u = _mm512_castps_si512(x);
  const __m512i exp = _mm512_set1_epi32(0x7F800000);
  const __m512i r = _mm512_add_epi32(u, noise);
  // Past the largest finite value: clamp to it, keeping the sign.
  __m512i b = _mm512_srli_epi32(r, 16);
  const __mmask16 over = _mm512_cmpeq_epi32_mask(_mm512_and_si512(r, exp), exp);
  b = _mm512_mask_mov_epi32(b, over, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x7F7F)));
  // Inf and NaN round to nearest, as from_f32 does.
  const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp), exp);
  if (special) {
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i nearest = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), exp);
    nearest = _mm512_mask_mov_epi32(nearest, nan, _mm512_set1_epi32(0x7FC0));
    b = _mm512_mask_mov_epi32(b, special, nearest);
  }
  _mm256_mask_storeu_epi16(out, m, _mm512_cvtepi32_epi16(b));
}

// ---- master weights (master_weight.h) ------------------------------------------------------------

// master_from16 / master_from8 on 16 lanes: (b << 16) + c, c the int16 correction or 256 times the
// int8 one.
inline __m512 master16_from16(const uint16_t* b, const int16_t* c, __mmask16 m) {
  const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(load16_epi16(b, m)), 16);
  const __m512i lo = _mm512_cvtepi16_epi32(load16_epi16(c, m));
  return _mm512_castsi512_ps(_mm512_add_epi32(hi, lo));
}

inline __m512 master16_from8(const uint16_t* b, const int8_t* c, __mmask16 m) {
  const __m512i hi = _mm512_slli_epi32(_mm512_cvtepu16_epi32(load16_epi16(b, m)), 16);
  const __m512i lo = _mm512_slli_epi32(_mm512_cvtepi8_epi32(load16_epi8(c, m)), 8);
  return _mm512_castsi512_ps(_mm512_add_epi32(hi, lo));
}

// master_to16 / master_to8 on 16 lanes: NaN masters store the canonical NaN, sign kept, and 0.
inline __mmask16 master_nan16(__m512i u) {
  return _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
}
inline __m512i master_nan_bits16(__m512i u) {
  return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)),
                         _mm512_set1_epi32(0x7FC0));
}

inline void master16_to16(__m512 x, uint16_t* b, int16_t* c, __mmask16 m) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan = master_nan16(u);
  __m512i hi = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x8000)), 16);
  __m512i lo = _mm512_sub_epi32(u, _mm512_slli_epi32(hi, 16));  // in [-32768, 32767]
  hi = _mm512_mask_mov_epi32(hi, nan, master_nan_bits16(u));
  lo = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nan), lo);
  _mm256_mask_storeu_epi16(b, m, _mm512_cvtepi32_epi16(hi));
  _mm256_mask_storeu_epi16(c, m, _mm512_cvtepi32_epi16(lo));
}

inline void master16_to8(__m512 x, uint16_t* b, int8_t* c, __mmask16 m) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan = master_nan16(u);
  const __m512i q = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x80)), 8);
  __m512i hi = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x8080)), 16);
  __m512i lo = _mm512_sub_epi32(q, _mm512_slli_epi32(hi, 8));  // in [-128, 127]
  hi = _mm512_mask_mov_epi32(hi, nan, master_nan_bits16(u));
  lo = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nan), lo);
  _mm256_mask_storeu_epi16(b, m, _mm512_cvtepi32_epi16(hi));
  _mm_mask_storeu_epi8(c, m, _mm512_cvtepi32_epi8(lo));
}

}  // namespace
}  // namespace kernels
}  // namespace lowbit
