// 8 lanes of quantized state for the AVX2 loops: decode (codebook[code] * absmax), the block scan
// behind the new absmax, and encode to the nearest code (format_tables.h). Same bits as the
// scalar paths: encode computes the key table's answer, #{thresholds t : key(t) < key(x)} over
// the order keys of encode.h, for every input (NaN included: see Pow8Codec).
//   4-bit: no table in memory: the 15 thresholds' keys as a search tree in two registers
//          (four permutes and compares), the codes by rank and the codebook in two more each.
//   8-bit: any format by one dword gather of the packed key table (encode) and one of the
//          codebook (decode) per 8 lanes; FP8 decodes and Pow8 (C8) decodes and encodes by
//          arithmetic instead (below).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../../common/compand.h"
#include "../../common/encode.h"
#include "../format_tables.h"
#include "vec8.h"  // its check that the includer is compiled for AVX2

namespace lowbit {
namespace kernels {
namespace {  // internal linkage, as vec8.h's helpers

// ---- decode ---------------------------------------------------------------------------------------

// 8 codes of an 8-bit format from 8 bytes.
inline __m256 decode8x8(const float* codebook, const uint8_t* codes, __m256 amax) {
  const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  return _mm256_mul_ps(_mm256_i32gather_ps(codebook, idx, 4), amax);
}

// A 16-entry table of floats or dwords in two registers, looked up by 8 indices 0..15.
struct Table16 {
  __m256 lo, hi;
  static Table16 load(const void* p) {
    const float* f = static_cast<const float*>(p);
    return Table16{_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
  }
  __m256 operator()(__m256i idx) const {
    // blendv picks by each lane's sign bit: bit 3 of the index moved there.
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                            _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
  }
};

// 8 codes of a 4-bit format from 4 bytes (element 2j the low nibble of byte j).
inline __m256 decode4x8(const Table16& codebook, const uint8_t* codes, __m256 amax) {
  int32_t word;
  std::memcpy(&word, codes, 4);
  const __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                       _mm256_set1_epi32(0xF));
  return _mm256_mul_ps(codebook(idx), amax);
}

// ---- 8-bit codecs without gathers ----------------------------------------------------------------
// Gathers are slow on AMD (vpgatherdd: about 9 cycles for 8 lanes on Zen 3), and the 8-bit loop
// would take four per 8 elements. The formats with structure decode (and Pow8 also encodes) by
// arithmetic that gives the codebook's exact values; the dynamic tree map keeps its gathers (a
// search of its 255 thresholds held in registers costs more: about 30 compares for 16 slices,
// then 60 permutes and blends to search the slice).

// The 8 codes of 8 bytes as dwords.
inline __m256i code_lanes(const uint8_t* codes) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
}

// FP8 (e4m3fn, e5m2) decode: codebook[c] = fp8(c) / max, and for codes of one mantissa m that
// division scales with the exponent exactly (all values are normal floats), so codebook[c] =
// +-2^(e - 1) * codebook[(1 << mbits) | m] for e >= 1 and +-codebook[m] (subnormal fp8) for e = 0:
// the 2^mbits mantissas of each kind from a 16-entry table in registers, times a power of two built
// from the bits, the sign or-ed in. Codes of Inf or NaN decode to the codebook's NaN.
struct Float8Decoder {
  Table16 mant;        // [0, 2^mbits): e = 1, [8, 8 + 2^mbits): e = 0
  __m128i mbits;       // mantissa bits (shift count)
  __m256i mmask, emask, special_e, special_m;  // special: e == special_e and (m & special_m) == special_m
  __m256 nan;

  static Float8Decoder make(const FormatView& f, QuantFormat fmt) {
    const FormatSpec& spec = format_spec(fmt);
    const int mb = spec.mantissa_bits, eb = spec.exponent_bits;
    alignas(32) float t[16] = {};
    for (int m = 0; m < (1 << mb); ++m) {
      t[m] = f.codebook[(1 << mb) | m];
      t[8 + m] = f.codebook[m];
    }
    Float8Decoder d;
    d.mant = Table16::load(t);
    d.mbits = _mm_cvtsi32_si128(mb);
    d.mmask = _mm256_set1_epi32((1 << mb) - 1);
    d.emask = _mm256_set1_epi32((1 << eb) - 1);
    d.special_e = _mm256_set1_epi32((1 << eb) - 1);
    // e4m3fn: only S.1111.111 is NaN; IEEE-like e5m2: the top exponent is Inf or NaN.
    d.special_m = _mm256_set1_epi32(spec.ieee_special ? 0 : (1 << mb) - 1);
    d.nan = _mm256_set1_ps(__builtin_nanf(""));
    return d;
  }

  __m256 operator()(__m256i c) const {
    const __m256i m = _mm256_and_si256(c, mmask);
    const __m256i e = _mm256_and_si256(_mm256_srl_epi32(c, mbits), emask);
    const __m256i sub = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
    const __m256 v = mant(_mm256_or_si256(m, _mm256_and_si256(sub, _mm256_set1_epi32(8))));
    // 2^(e - 1) for e >= 1, 1 for e = 0: exponent field e + 126, or 127.
    const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, sub), _mm256_set1_epi32(126)), 23);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(c, _mm256_set1_epi32(0x80)), 24);
    const __m256 x = _mm256_or_ps(_mm256_mul_ps(v, _mm256_castsi256_ps(pow2)), _mm256_castsi256_ps(sign));
    const __m256i special = _mm256_and_si256(_mm256_cmpeq_epi32(e, special_e),
                                             _mm256_cmpeq_epi32(_mm256_and_si256(m, special_m), special_m));
    return _mm256_blendv_ps(x, nan, _mm256_castsi256_ps(special));
  }
};

// Pow8 (compand.h): pow8_decode and pow8_encode on 8 lanes, the same float operations in the same
// order but for pow8_step's square root, which takes vrsqrtps's estimate (pow8_sqrt_estimate says why
// the codes are the same; checked on all 2^32 floats, both formats). A NaN encodes as the key table
// has it (a positive NaN above every threshold, a negative one below), where pow8_encode gives 0.
struct Pow8Codec {
  bool is_signed;
  __m256 m, inv_sq;
  __m256i nan_pos, nan_neg;

  static Pow8Codec make(const FormatView& f, QuantFormat fmt) {
    Pow8Codec p;
    p.is_signed = format_is_signed(fmt);
    p.m = _mm256_set1_ps(p.is_signed ? kPow8SignedMax : kPow8UnsignedMax);
    p.inv_sq = _mm256_set1_ps(p.is_signed ? kPow8SignedInvSq : kPow8UnsignedInvSq);
    p.nan_pos = _mm256_set1_epi32(f.encode(f32_from_bits(0x7FC00000u)));
    p.nan_neg = _mm256_set1_epi32(f.encode(f32_from_bits(0xFFC00000u)));
    return p;
  }

  __m256 decode(__m256i code) const {
    __m256 c;
    if (is_signed) {
      c = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_min_epi32(code, _mm256_set1_epi32(254))), _mm256_set1_ps(127.0f));
      c = _mm256_mul_ps(c, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), c));  // c * |c|
    } else {
      c = _mm256_cvtepi32_ps(code);
      c = _mm256_mul_ps(c, c);
    }
    return _mm256_mul_ps(c, inv_sq);  // integers below 2^22 convert exactly (small_uint_to_float)
  }

  static __m256 sel(__m256 mask, __m256 a, __m256 b) { return _mm256_blendv_ps(b, a, mask); }  // mask ? a : b
  __m256 threshold(__m256 c) const {
    const __m256 h = _mm256_add_ps(c, _mm256_set1_ps(0.5f));
    return _mm256_mul_ps(_mm256_mul_ps(h, h), inv_sq);
  }
  // pow8_step, its square root estimated: vrsqrtps and a multiply instead of the divider's vsqrtps.
  __m256 step(__m256 a) const {
    const __m256 floor40 = _mm256_set1_ps(0x1p-40f), one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    const __m256 r = sel(_mm256_cmp_ps(a, floor40, _CMP_GT_OQ), a, floor40);
    const __m256 e = _mm256_mul_ps(r, _mm256_rsqrt_ps(r));
    const __m256 big = _mm256_set1_ps(12582912.0f);
    __m256 c = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(e, m), big), big);
    c = sel(_mm256_cmp_ps(c, m, _CMP_LT_OQ), c, m);
    const __m256 up = _mm256_and_ps(_mm256_cmp_ps(a, threshold(c), _CMP_GT_OQ), one);
    const __m256 down = _mm256_and_ps(_mm256_cmp_ps(a, threshold(_mm256_sub_ps(c, one)), _CMP_LE_OQ), one);
    c = _mm256_add_ps(c, _mm256_sub_ps(up, down));
    return sel(_mm256_cmp_ps(c, zero, _CMP_GT_OQ), sel(_mm256_cmp_ps(c, m, _CMP_LT_OQ), c, m), zero);
  }
  __m256i encode(__m256 y) const {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    __m256 code;
    if (is_signed) {
      const __m256 abs_y = sel(_mm256_cmp_ps(y, zero, _CMP_LT_OQ), _mm256_sub_ps(zero, y), y);  // -y: exact
      __m256 c = step(sel(_mm256_cmp_ps(abs_y, one, _CMP_LT_OQ), abs_y, one));
      c = sel(_mm256_cmp_ps(c, one, _CMP_GE_OQ), c, _mm256_and_ps(_mm256_cmp_ps(abs_y, zero, _CMP_GT_OQ), one));
      const __m256 mid = _mm256_set1_ps(127.0f);
      code = sel(_mm256_cmp_ps(y, zero, _CMP_LT_OQ), _mm256_sub_ps(mid, c), _mm256_add_ps(mid, c));
    } else {
      const __m256 a = sel(_mm256_cmp_ps(y, zero, _CMP_GT_OQ), sel(_mm256_cmp_ps(y, one, _CMP_LT_OQ), y, one), zero);
      const __m256 c = step(a);
      code = sel(_mm256_cmp_ps(c, one, _CMP_GE_OQ), c, _mm256_and_ps(_mm256_cmp_ps(y, zero, _CMP_GT_OQ), one));
    }
    __m256i r = _mm256_cvttps_epi32(code);  // a small integer held exactly
    const __m256i u = _mm256_castps_si256(y);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
    const __m256i nan_code = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(nan_pos), _mm256_castsi256_ps(nan_neg), _mm256_castsi256_ps(u)));  // by the sign
    r = _mm256_blendv_epi8(r, nan_code, nan);
    return r;
  }
};

// ---- the block scan -------------------------------------------------------------------------------

// block_ops' scan_block on 8 lanes: the largest |x| bit pattern and the largest raw bit pattern
// (above 0x80000000 exactly when some lane held a negative value; -0.0 is not one).
struct Scan8 {
  __m256i max_abs = _mm256_setzero_si256();
  __m256i max_raw = _mm256_setzero_si256();
  void add(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    max_abs = _mm256_max_epu32(max_abs, _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)));
    max_raw = _mm256_max_epu32(max_raw, u);
  }
  // Horizontal maximum of 8 unsigned lanes.
  static uint32_t reduce(__m256i v) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
    return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
  }
  uint32_t abs_bits() const { return reduce(max_abs); }
  uint32_t raw_bits() const { return reduce(max_raw); }
};

// ---- encode ---------------------------------------------------------------------------------------

// normalize(nz, x) of encode.h: two multiplies.
inline __m256 normalize8(__m256 x, __m256 pre, __m256 inv) { return _mm256_mul_ps(_mm256_mul_ps(x, pre), inv); }

// 8-bit by the key table (format_tables.h: FormatView::encode): -0.0 made +0.0, x = u ^ (sign &
// flip), one gather of the entries, one add; the code is byte 2.
inline __m256i encode8x8(const uint32_t* table, __m256i flip, __m256 n) {
  const __m256i u = _mm256_castps_si256(_mm256_add_ps(n, _mm256_setzero_ps()));  // -0.0 as +0.0
  const __m256i x = _mm256_xor_si256(u, _mm256_and_si256(_mm256_srai_epi32(u, 31), flip));
  const __m256i e = _mm256_i32gather_epi32(reinterpret_cast<const int*>(table), _mm256_srli_epi32(x, 16), 4);
  return _mm256_srli_epi32(_mm256_add_epi32(e, x), 16);
}

// 8 dword codes (each < 256) to 8 bytes, in order: each 128-bit half gathers its four low bytes
// (the upper half into bytes 4..7), and the halves are or-ed.
inline uint64_t pack_bytes8(__m256i c) {
  const __m256i b = _mm256_shuffle_epi8(
      c, _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                          -1, -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i q = _mm_or_si128(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(q));
}

// 8 dword codes (each < 16) to 4 bytes, two per byte, even element low.
inline uint32_t pack_nibbles8(__m256i c) {
  const __m256i w = _mm256_or_si256(c, _mm256_srli_epi64(c, 28));  // byte 0 of each qword: c[2j] | c[2j+1] << 4
  const __m256i b = _mm256_shuffle_epi8(
      w, _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                          -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i q = _mm_or_si128(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(q));
}

// The order key of encode.h as a signed integer (key ^ 0x80000000): signed compares order floats
// as the unsigned keys do, -0.0 below +0.0.
inline __m256i signed_key(__m256i u) {
  return _mm256_xor_si256(u, _mm256_and_si256(_mm256_srai_epi32(u, 31), _mm256_set1_epi32(0x7FFFFFFF)));
}

// 4-bit: the 15 thresholds' signed keys breadth-first (node i at lane i of nodes[0..1], i = 1..15),
// the codes by rank; #{thresholds below} by descending the tree, then the code of that rank.
struct Tree4 {
  __m256i top, bottom;  // nodes 0..7 (node 0 unused), nodes 8..15
  __m256i root;
  Table16 codes;        // dword codes by rank

  static Tree4 make(const FormatView& f) {
    alignas(32) int32_t nodes[16] = {};
    alignas(32) int32_t by_rank[16];
    for (int i = 1; i < 16; ++i) {
      uint32_t u;
      std::memcpy(&u, &f.eytzinger[i], 4);
      // Padding (+inf: fewer than 15 thresholds) is no threshold at all: the largest key, which no
      // input's key exceeds (the key table counts real thresholds only).
      nodes[i] = u == 0x7F800000u ? INT32_MAX : static_cast<int32_t>(u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) & 0x7FFFFFFFu));
    }
    for (int i = 0; i < 16; ++i) by_rank[i] = f.sorted_codes[i];
    Tree4 t;
    t.top = _mm256_load_si256(reinterpret_cast<const __m256i*>(nodes));
    t.bottom = _mm256_load_si256(reinterpret_cast<const __m256i*>(nodes + 8));
    t.root = _mm256_set1_epi32(nodes[1]);
    t.codes = Table16::load(by_rank);
    return t;
  }

  __m256i encode(__m256 n) const {
    const __m256i k = signed_key(_mm256_castps_si256(n));
    // i = 2 i + (key > node i): a true compare is -1, so 2 i - mask.
    __m256i i = _mm256_sub_epi32(_mm256_set1_epi32(2), _mm256_cmpgt_epi32(k, root));
    i = _mm256_sub_epi32(_mm256_add_epi32(i, i), _mm256_cmpgt_epi32(k, _mm256_permutevar8x32_epi32(top, i)));
    i = _mm256_sub_epi32(_mm256_add_epi32(i, i), _mm256_cmpgt_epi32(k, _mm256_permutevar8x32_epi32(top, i)));
    i = _mm256_sub_epi32(_mm256_add_epi32(i, i), _mm256_cmpgt_epi32(k, _mm256_permutevar8x32_epi32(bottom, i)));
    return _mm256_castps_si256(codes(i));  // i - 16 == i mod 16: the permutes read its low bits
  }
};

// A block's codes from its new values v (len of them) with the block's normalizer; lanes past the
// end encode as 0, so an odd last 4-bit element leaves its high nibble 0.
// enc(normalized) gives 8 dword codes: the key table's (encode8x8) or a codec's.
template <typename Enc>
inline void encode_block8_with(Enc enc, Normalizer nz, const float* v, int64_t len, uint8_t* out) {
  const __m256 pre = _mm256_set1_ps(nz.pre), inv = _mm256_set1_ps(nz.inv);
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const uint64_t c = pack_bytes8(enc(normalize8(_mm256_loadu_ps(v + i), pre, inv)));
    std::memcpy(out + i, &c, 8);
  }
  if (i < len) {
    alignas(32) float tail[8] = {};
    std::memcpy(tail, v + i, (len - i) * sizeof(float));
    const uint64_t c = pack_bytes8(enc(normalize8(_mm256_load_ps(tail), pre, inv)));
    std::memcpy(out + i, &c, len - i);
  }
}

inline void encode_block8_avx2(const uint32_t* table, uint32_t flip, Normalizer nz, const float* v, int64_t len,
                               uint8_t* out) {
  const __m256i f = _mm256_set1_epi32(static_cast<int>(flip));
  encode_block8_with([table, f](__m256 n) { return encode8x8(table, f, n); }, nz, v, len, out);
}

inline void encode_block4_avx2(const Tree4& tree, Normalizer nz, const float* v, int64_t len, uint8_t* out) {
  const __m256 pre = _mm256_set1_ps(nz.pre), inv = _mm256_set1_ps(nz.inv);
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    const uint32_t c = pack_nibbles8(tree.encode(normalize8(_mm256_loadu_ps(v + i), pre, inv)));
    std::memcpy(out + i / 2, &c, 4);
  }
  if (i < len) {
    alignas(32) float tail[8] = {};
    std::memcpy(tail, v + i, (len - i) * sizeof(float));
    const __m256i live = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(len - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const uint32_t c = pack_nibbles8(_mm256_and_si256(live, tree.encode(normalize8(_mm256_load_ps(tail), pre, inv))));
    std::memcpy(out + i / 2, &c, (len - i + 1) / 2);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace lowbit
