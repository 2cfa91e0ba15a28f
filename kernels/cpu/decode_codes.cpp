// Bulk decode of 8-bit codes (format_tables.h): codebook[code] * absmax. With AVX-512 VBMI, 64
// codes at a time without gathers: each of the four bytes of the codebook's floats is a 256-entry
// byte table looked up with two two-register byte permutes (bit 7 picks which), then the four byte
// planes are interleaved into floats, by unpacks that work within 128-bit lanes; the codes are
// put in the order that makes those unpacks give the elements in order (one byte permute instead of
// a transpose of 128-bit lanes after them). Elsewhere a plain loop (the compiler's gather).
#include <immintrin.h>

#include "cpu_features.h"
#include "format_tables.h"

namespace lowbit {
namespace kernels {
namespace {

__attribute__((target_clones("avx512f", "avx2", "default"))) void decode8_loop(const float* __restrict__ cb,
                                                                               const uint8_t* __restrict__ c,
                                                                               int64_t len, float amax,
                                                                               float* __restrict__ out) {
  for (int64_t i = 0; i < len; ++i) out[i] = cb[c[i]] * amax;
}

#if defined(__x86_64__)
#define LOWBIT_VBMI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))

// The unpacks of store_planes leave register q's 128-bit lane L holding the four elements at code
// positions 16 L + 4 q .. + 3; position 16 L + 4 q + j therefore takes element 16 q + 4 L + j,
// so that register q holds elements 16 q .. 16 q + 15 in order.
struct UnpackOrder {
  alignas(64) uint8_t at[64];
  constexpr UnpackOrder() : at() {
    for (int p = 0; p < 64; ++p) at[p] = static_cast<uint8_t>(16 * ((p >> 2) & 3) + 4 * (p >> 4) + (p & 3));
  }
};
constexpr UnpackOrder kUnpackOrder;

// For 64 packed 4-bit codes held as [32 low nibbles | 32 high nibbles] (element 2 j's code is low
// nibble j, element 2 j + 1's high nibble j): the byte that kUnpackOrder's position p takes.
struct NibbleOrder {
  alignas(64) uint8_t at[64];
  constexpr NibbleOrder() : at() {
    for (int p = 0; p < 64; ++p) {
      const int e = kUnpackOrder.at[p];
      at[p] = static_cast<uint8_t>((e & 1) * 32 + e / 2);
    }
  }
};
constexpr NibbleOrder kNibbleOrder;

// The last step of both decodes: the four byte planes b[k] (byte k of each element's float, the
// elements in kUnpackOrder) interleaved within 128-bit lanes into floats, register q holding code
// positions 16 L + 4 q .. + 3 in lane L, which hold elements 16 q + 4 L .. + 3, so elements 16 q ..
// 16 q + 15 in order; times absmax; n (<= 64) of them stored.
LOWBIT_VBMI __attribute__((always_inline)) inline void store_planes(const __m512i b[4], __m512 a, int64_t n, float* out) {
  const __m512i w01lo = _mm512_unpacklo_epi8(b[0], b[1]), w01hi = _mm512_unpackhi_epi8(b[0], b[1]);
  const __m512i w23lo = _mm512_unpacklo_epi8(b[2], b[3]), w23hi = _mm512_unpackhi_epi8(b[2], b[3]);
  const __m512i o[4] = {_mm512_unpacklo_epi16(w01lo, w23lo), _mm512_unpackhi_epi16(w01lo, w23lo),
                        _mm512_unpacklo_epi16(w01hi, w23hi), _mm512_unpackhi_epi16(w01hi, w23hi)};
  for (int q = 0; q < 4 && 16 * q < n; ++q) {
    const __m512 v = _mm512_mul_ps(_mm512_castsi512_ps(o[q]), a);
    if (n - 16 * q >= 16) {
      _mm512_storeu_ps(out + 16 * q, v);
    } else {
      _mm512_mask_storeu_ps(out + 16 * q, static_cast<__mmask16>((1u << (n - 16 * q)) - 1u), v);
    }
  }
}

LOWBIT_VBMI void decode8_vbmi(const uint8_t* planes, const uint8_t* c, int64_t len, float amax, float* out) {
  // planes: byte k of codebook[e] at planes[256 k + e]; four 64-byte registers per plane.
  __m512i t[16];
  for (int k = 0; k < 16; ++k) t[k] = _mm512_loadu_si512(planes + 64 * k);
  const __m512 a = _mm512_set1_ps(amax);
  const __m512i to_lanes = _mm512_load_si512(kUnpackOrder.at);
  for (int64_t i = 0; i < len; i += 64) {
    const int64_t n = len - i < 64 ? len - i : 64;
    const __mmask64 m = n == 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1;
    // A whole run by a plain load: a masked one streams slower (lanes16.h, load16_ps).
    const __m512i codes = n == 64 ? _mm512_loadu_si512(c + i) : _mm512_maskz_loadu_epi8(m, c + i);
    const __m512i idx = _mm512_permutexvar_epi8(to_lanes, codes);
    const __mmask64 upper = _mm512_movepi8_mask(idx);  // code >= 128
    __m512i b[4];
    for (int k = 0; k < 4; ++k)
      b[k] = _mm512_mask_blend_epi8(upper, _mm512_permutex2var_epi8(t[4 * k], idx, t[4 * k + 1]),
                                    _mm512_permutex2var_epi8(t[4 * k + 2], idx, t[4 * k + 3]));
    store_planes(b, a, n, out + i);
  }
}

// The same for a 4-bit format, 64 codes from 32 bytes: the nibbles split, then put in the
// unpacks' order by one byte permute; each byte plane of the 16-entry codebook is one permute.
LOWBIT_VBMI void decode4_vbmi(const uint8_t* planes, const uint8_t* c, int64_t len, float amax, float* out) {
  __m512i t[4];
  for (int k = 0; k < 4; ++k) t[k] = _mm512_loadu_si512(planes + 256 * k);  // entries 0..15 used
  const __m512 a = _mm512_set1_ps(amax);
  const __m512i order = _mm512_load_si512(kNibbleOrder.at);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < len; i += 64) {
    const int64_t n = len - i < 64 ? len - i : 64;
    const int64_t bytes = (n + 1) / 2;
    const __mmask32 m = bytes >= 32 ? ~__mmask32(0) : (__mmask32(1) << bytes) - 1;
    const __m256i packed = bytes >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i / 2))
                                       : _mm256_maskz_loadu_epi8(m, c + i / 2);  // as decode8_vbmi
    const __m256i lo = _mm256_and_si256(packed, low4), hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4);
    const __m512i idx = _mm512_permutexvar_epi8(order, _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    __m512i b[4];
    for (int k = 0; k < 4; ++k) b[k] = _mm512_permutexvar_epi8(idx, t[k]);
    store_planes(b, a, n, out + i);
  }
}

#endif

__attribute__((target_clones("avx512f", "avx2", "default"))) void decode4_loop(const float* __restrict__ cb,
                                                                               const uint8_t* __restrict__ c,
                                                                               int64_t len, float amax,
                                                                               float* __restrict__ out) {
  for (int64_t j = 0; j < len / 2; ++j) {
    out[2 * j] = cb[c[j] & 0xF] * amax;
    out[2 * j + 1] = cb[c[j] >> 4] * amax;
  }
  if (len % 2) out[len - 1] = cb[c[len / 2] & 0xF] * amax;
}

}  // namespace

bool decode_codes4_fast() {
#if defined(__x86_64__)
  return cpu_has_avx512_vbmi();
#else
  return false;
#endif
}

void decode_codes4(const FormatView& f, const uint8_t* codes, int64_t len, float absmax, float* out,
                   bool vector_path) {
#if defined(__x86_64__)
  if (vector_path && cpu_has_avx512_vbmi()) return decode4_vbmi(f.planes, codes, len, absmax, out);
#endif
  decode4_loop(f.codebook, codes, len, absmax, out);
}

void decode_codes8(const FormatView& f, const uint8_t* codes, int64_t len, float absmax, float* out,
                   bool vector_path) {
#if defined(__x86_64__)
  if (vector_path && cpu_has_avx512_vbmi()) return decode8_vbmi(f.planes, codes, len, absmax, out);
#endif
  decode8_loop(f.codebook, codes, len, absmax, out);
}

}  // namespace kernels
}  // namespace lowbit
