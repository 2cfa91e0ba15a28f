// Bulk encode of normalized values (see bucket_encoder.h): the hot loop of CPU quantization and of
// the optimizers' re-quantization. The AVX-512 version does the bucket lookup with gathers.
#include <immintrin.h>

#include "bucket_encoder.h"

namespace lowbit {
namespace kernels {
namespace {

void encode_scalar(const BucketView& enc, const float* v, int64_t len, uint8_t* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = enc.encode(v[i]);
}

#if defined(__x86_64__)
// #{thresholds < x} for 16 lanes without gathers: 15 compares against the coarse thresholds give
// the group c of 16; 15 in-register permutes (fine[j][c]) and compares count inside the group.
// 4-bit formats have only the 15 coarse thresholds.
__attribute__((target("avx512f,avx512bw"))) void encode_avx512(const BucketView& enc, const float* v, int64_t len,
                                                               uint8_t* out) {
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i low_byte = _mm512_set1_epi32(0xFF);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m512 x = _mm512_loadu_ps(v + i);
    // Four independent partial counts: a single chain of 15 dependent adds would bound the loop.
    __m512i a[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
    for (int k = 0; k < 15; ++k)
      a[k & 3] = _mm512_mask_add_epi32(a[k & 3], _mm512_cmp_ps_mask(_mm512_set1_ps(enc.coarse[k]), x, _CMP_LT_OQ),
                                       a[k & 3], one);
    const __m512i c = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
    __m512i idx = c;
    if (enc.eight_bit) {
      __m512i f[4] = {_mm512_slli_epi32(c, 4), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
      for (int j = 0; j < 15; ++j) {
        const __m512 t = _mm512_permutexvar_ps(c, _mm512_load_ps(enc.fine + 16 * j));
        f[j & 3] = _mm512_mask_add_epi32(f[j & 3], _mm512_cmp_ps_mask(t, x, _CMP_LT_OQ), f[j & 3], one);
      }
      idx = _mm512_add_epi32(_mm512_add_epi32(f[0], f[1]), _mm512_add_epi32(f[2], f[3]));
    }
    __m512i code = idx;
    if (enc.sign_magnitude > 0) {
      const __m512i n = _mm512_set1_epi32(enc.sign_magnitude);
      const __mmask16 neg = _mm512_cmp_epi32_mask(idx, n, _MM_CMPINT_LT);
      code = _mm512_mask_sub_epi32(_mm512_sub_epi32(idx, n), neg, _mm512_add_epi32(n, _mm512_set1_epi32(0x80)), idx);
    } else if (!enc.identity_codes) {
      if (enc.eight_bit) {
        code = _mm512_and_si512(_mm512_i32gather_epi32(idx, enc.codes, 1), low_byte);
      } else {
        // 16-entry code table as dwords, looked up in-register.
        alignas(64) int32_t t16[16];
        for (int k = 0; k < 16; ++k) t16[k] = enc.codes[k];
        code = _mm512_permutexvar_epi32(idx, _mm512_load_si512(t16));
      }
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm512_cvtepi32_epi8(code));
  }
  encode_scalar(enc, v + i, len - i, out + i);
}

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
}
#endif

}  // namespace

void encode_codes(const BucketView& enc, const float* v, int64_t len, uint8_t* out) {
#if defined(__x86_64__)
  if (cpu_has_avx512()) return encode_avx512(enc, v, len, out);
#endif
  encode_scalar(enc, v, len, out);
}

}  // namespace kernels
}  // namespace lowbit
