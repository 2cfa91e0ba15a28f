// Bulk encode of a block (code_encoder.h): the hot loop of CPU quantization and of the optimizers'
// re-quantization. Normalizing is fused in: normalize(nz, x) is two multiplies on every backend.
#include <immintrin.h>

#include <mutex>

#include "block_ops.h"
#include "format_tables.h"

namespace lowbit {
namespace kernels {

FormatTables::FormatTables(QuantFormat fmt)
    : table_(make_encode_table(fmt)), entries_(make_key_table(table_)), codebook_(make_codebook(fmt)) {
  if (table_.bits == 4)
    for (int i = 1; i < 16; ++i) eytzinger_[i] = table_.eytzinger[i];
  for (size_t e = 0; e < codebook_.size() && e < 256; ++e)
    for (int k = 0; k < 4; ++k) planes_[256 * k + e] = static_cast<uint8_t>(f32_bits(codebook_[e]) >> (8 * k));
}

FormatView FormatTables::view() const {
  return FormatView{entries_.data(), codebook_.data(), eytzinger_, table_.sorted_codes, planes_, table_.bits};
}

FormatView format_tables(QuantFormat fmt) {
  static const FormatTables* tables[kNumQuantFormats] = {};
  static std::once_flag once[kNumQuantFormats];
  const int i = static_cast<int>(fmt);
  std::call_once(once[i], [&] { tables[i] = new FormatTables(fmt); });
  return tables[i]->view();
}

namespace {

void encode_scalar(FormatView enc, Normalizer nz, const float* v, int64_t len, uint8_t* out) {
  for (int64_t i = 0; i < len; ++i) out[i] = enc.encode(normalize(nz, v[i]));
}

void encode_packed4_scalar(FormatView enc, Normalizer nz, const float* v, int64_t len, uint8_t* out) {
  for (int64_t i = 0; i + 1 < len; i += 2)
    out[i / 2] = static_cast<uint8_t>(enc.encode(normalize(nz, v[i])) | (enc.encode(normalize(nz, v[i + 1])) << 4));
  if (len % 2) out[len / 2] = enc.encode(normalize(nz, v[len - 1]));
}

#if defined(__x86_64__)
// 16 lanes: two multiplies, the order key, one dword gather of the packed entry, one unsigned
// compare, a blend, and a truncating narrow (the code is the entry's low byte, or its next byte).
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m128i encode16(const uint32_t* table, __m512 x, __m512 pre,
                                                                   __m512 inv) {
  const __m512i u = _mm512_castps_si512(_mm512_mul_ps(_mm512_mul_ps(x, pre), inv));
  const __m512i key =
      _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), _mm512_set1_epi32(INT32_MIN)));
  const __m512i e = _mm512_i32gather_epi32(_mm512_srli_epi32(key, 16), table, 4);
  const __mmask16 up =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(key, _mm512_set1_epi32(0xFFFF)), _mm512_srli_epi32(e, 16));
  return _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(up, e, _mm512_srli_epi32(e, 8)));
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void encode_avx512(FormatView enc, Normalizer nz, const float* v,
                                                               int64_t len, uint8_t* out) {
  const __m512 pre = _mm512_set1_ps(nz.pre), inv = _mm512_set1_ps(nz.inv);
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), encode16(enc.key_entries, _mm512_loadu_ps(v + i), pre, inv));
  if (i < len) {
    const __mmask16 m = static_cast<__mmask16>((1u << (len - i)) - 1u);
    const __m128i c = encode16(enc.key_entries, _mm512_maskz_loadu_ps(m, v + i), pre, inv);
    _mm_mask_storeu_epi8(out + i, m, c);
  }
}

// Two 4-bit codes per byte: as 16-bit words the codes are (even | odd << 8); (w | w >> 4) has the
// packed byte low, and a saturating narrow of the masked words writes 8 bytes.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m128i pack_nibbles(__m128i c) {
  const __m128i w = _mm_and_si128(_mm_or_si128(c, _mm_srli_epi16(c, 4)), _mm_set1_epi16(0xFF));
  return _mm_packus_epi16(w, w);
}

// 4-bit: #{thresholds < x} by descending the 15-node tree held in one register (four permutes and
// compares), then the code of that count from a 16-entry table, also in a register.
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m128i encode16_tree4(__m512 tree, __m512i codes,
                                                                                  __m512 x, __m512 pre, __m512 inv) {
  const __m512 n = _mm512_mul_ps(_mm512_mul_ps(x, pre), inv);
  const __m512i one = _mm512_set1_epi32(1);
  __m512i i = one;
  for (int level = 0; level < 4; ++level) {
    const __mmask16 right = _mm512_cmp_ps_mask(_mm512_permutexvar_ps(i, tree), n, _CMP_LT_OQ);
    i = _mm512_add_epi32(i, i);
    i = _mm512_mask_add_epi32(i, right, i, one);
  }
  return _mm512_cvtepi32_epi8(_mm512_permutexvar_epi32(i, codes));  // i - 16 == i mod 16
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void encode_packed4_avx512(const FormatView& enc, Normalizer nz,
                                                                               const float* v, int64_t len,
                                                                               uint8_t* out) {
  const __m512 pre = _mm512_set1_ps(nz.pre), inv = _mm512_set1_ps(nz.inv);
  const __m512 tree = _mm512_loadu_ps(enc.eytzinger);
  const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(enc.sorted_codes)));
  int64_t i = 0;
  for (; i + 16 <= len; i += 16)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 2),
                     pack_nibbles(encode16_tree4(tree, codes, _mm512_loadu_ps(v + i), pre, inv)));
  if (i < len) {
    // Lanes past the end become 0, so an odd last element leaves its high nibble 0.
    const __mmask16 m = static_cast<__mmask16>((1u << (len - i)) - 1u);
    const __m128i c = _mm_maskz_mov_epi8(m, encode16_tree4(tree, codes, _mm512_maskz_loadu_ps(m, v + i), pre, inv));
    _mm_mask_storeu_epi8(out + i / 2, static_cast<__mmask16>((1u << ((len - i + 1) / 2)) - 1u), pack_nibbles(c));
  }
}

// Whole blocks of fp32 input in one function: scan, absmax, normalize and encode per block with no
// call in between (the per-block calls cost as much as encoding a 128-element block).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_blocks_avx512(
    const FormatView& enc, bool format_signed, const float* x, int64_t n, int64_t block, int64_t b0, int64_t b1,
    uint8_t* codes, float* absmax) {
  const __m512 tree = _mm512_loadu_ps(enc.eytzinger);
  const __m512i tree_codes =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(enc.sorted_codes)));
  const bool four_bit = enc.bits == 4;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * block;
    const int64_t len = n - begin < block ? n - begin : block;
    const float* v = x + begin;
    const int64_t ahead = begin + 4 * block;
    if (ahead < n) {
      const int64_t bytes = 4 * (n - ahead < block ? n - ahead : block);
      prefetch_range(x + ahead, bytes);
    }
    // The scan of block_ops' scan_block: largest |x| bit pattern, and any negative value.
    __m512i max_bits = _mm512_setzero_si512();
    __mmask16 negative = 0;
    for (int64_t i = 0; i < len; i += 16) {
      const __mmask16 m = len - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (len - i)) - 1u);
      const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(m, v + i));
      max_bits = _mm512_max_epu32(max_bits, _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)));
      negative |= _mm512_mask_cmpgt_epu32_mask(m, u, _mm512_set1_epi32(INT32_MIN));
    }
    const float am = block_absmax_from_bits(_mm512_reduce_max_epu32(max_bits), negative != 0, format_signed);
    absmax[b] = am;
    const Normalizer nz = make_normalizer(am);
    const __m512 pre = _mm512_set1_ps(nz.pre), inv = _mm512_set1_ps(nz.inv);
    if (four_bit) {
      uint8_t* out = codes + begin / 2;  // blocks hold an even number of elements
      int64_t i = 0;
      for (; i + 16 <= len; i += 16)
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i / 2),
                         pack_nibbles(encode16_tree4(tree, tree_codes, _mm512_loadu_ps(v + i), pre, inv)));
      if (i < len) {
        const __mmask16 m = static_cast<__mmask16>((1u << (len - i)) - 1u);
        const __m128i c =
            _mm_maskz_mov_epi8(m, encode16_tree4(tree, tree_codes, _mm512_maskz_loadu_ps(m, v + i), pre, inv));
        _mm_mask_storeu_epi8(out + i / 2, static_cast<__mmask16>((1u << ((len - i + 1) / 2)) - 1u), pack_nibbles(c));
      }
    } else {
      uint8_t* out = codes + begin;
      int64_t i = 0;
      for (; i + 16 <= len; i += 16)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), encode16(enc.key_entries, _mm512_loadu_ps(v + i), pre, inv));
      if (i < len) {
        const __mmask16 m = static_cast<__mmask16>((1u << (len - i)) - 1u);
        _mm_mask_storeu_epi8(out + i, m, encode16(enc.key_entries, _mm512_maskz_loadu_ps(m, v + i), pre, inv));
      }
    }
  }
}

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
}
#endif

}  // namespace

void encode_codes(const FormatView& enc, Normalizer nz, const float* v, int64_t len, uint8_t* out,
                  bool vector_path) {
#if defined(__x86_64__)
  if (vector_path && cpu_has_avx512()) return encode_avx512(enc, nz, v, len, out);
#endif
  encode_scalar(enc, nz, v, len, out);
}

bool quantize_blocks_f32(const FormatView& enc, bool format_signed, const float* x, int64_t n, int64_t block,
                         int64_t first_block, int64_t end_block, uint8_t* codes, float* absmax) {
#if defined(__x86_64__)
  if (cpu_has_avx512()) {
    quantize_blocks_avx512(enc, format_signed, x, n, block, first_block, end_block, codes, absmax);
    return true;
  }
#endif
  return false;
}

void encode_codes_packed4(const FormatView& enc, Normalizer nz, const float* v, int64_t len, uint8_t* out,
                          bool vector_path) {
#if defined(__x86_64__)
  if (vector_path && cpu_has_avx512()) return encode_packed4_avx512(enc, nz, v, len, out);
#endif
  encode_packed4_scalar(enc, nz, v, len, out);
}

}  // namespace kernels
}  // namespace lowbit
