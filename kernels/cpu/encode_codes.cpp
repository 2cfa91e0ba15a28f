// Bulk encode of a block (code_encoder.h): the hot loop of CPU quantization and of the optimizers'
// re-quantization. Normalizing is fused in: normalize(nz, x) is two multiplies on every backend.
#include <immintrin.h>

#include <mutex>

#include "block_ops.h"
#include "cpu_features.h"
#include "encode_avx512.h"
#include "format_tables.h"

namespace lowbit {
namespace kernels {

FormatTables::FormatTables(QuantFormat fmt)
    : table_(make_encode_table(fmt)), keys_(make_key_table(table_)), codebook_(make_codebook(fmt)) {
  if (table_.bits == 4) {
    for (int i = 1; i < 16; ++i) eytzinger_[i] = table_.eytzinger[i];
    // The evenly spaced 4-bit codebook's thresholds, as the encode by formula assumes them.
    linear4_ = table_.num_values == 16;
    for (int k = 0; k < 15; ++k)
      linear4_ &= table_.thresholds[k] == static_cast<float>(2 * k + 3) / 32.0f && table_.sorted_codes[k] == k;
    linear4_ &= table_.sorted_codes[15] == 15;
  }
  for (size_t e = 0; e < codebook_.size() && e < 256; ++e)
    for (int k = 0; k < 4; ++k) planes_[256 * k + e] = static_cast<uint8_t>(f32_bits(codebook_[e]) >> (8 * k));
}

FormatView FormatTables::view() const {
  return FormatView{keys_.entries.data(), codebook_.data(), eytzinger_, table_.thresholds, table_.sorted_codes, planes_,
                    keys_.flip, table_.bits, linear4_};
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
__attribute__((target("avx512f,avx512bw,avx512vl"))) void encode_avx512(const FormatView& enc, Normalizer nz,
                                                                       const float* v, int64_t len, uint8_t* out) {
  encode_block8(enc.key_entries, enc.key_flip, nz, v, len, out);
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void encode_packed4_avx512(const FormatView& enc, Normalizer nz,
                                                                               const float* v, int64_t len,
                                                                               uint8_t* out) {
  const __m512i tree = tree4_keys(enc.eytzinger);
  const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(enc.sorted_codes)));
  encode_block4_packed(tree, codes, nz, v, len, out);
}

// Whole blocks of fp32 input in one function: scan, absmax, normalize and encode per block with no
// call in between (the per-block calls cost as much as encoding a 128-element block).
__attribute__((target("avx512f,avx512bw,avx512vl"))) void quantize_blocks_avx512(
    const FormatView& enc, bool format_signed, const float* x, int64_t n, int64_t block, int64_t b0, int64_t b1,
    uint8_t* codes, float* absmax) {
  const __m512i tree = tree4_keys(enc.eytzinger);
  const __m512i tree_codes =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(enc.sorted_codes)));
  const bool four_bit = enc.bits == 4;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * block;
    const int64_t len = n - begin < block ? n - begin : block;
    const float* v = x + begin;
    const int64_t ahead = begin + kPrefetchBlocks * block;
    if (ahead < n) {
      const int64_t bytes = 4 * (n - ahead < block ? n - ahead : block);
      prefetch_range(x + ahead, bytes);
    }
    // The scan of block_ops' scan_block: largest |x| bit pattern, and any negative value.
    __m512i max_bits = _mm512_setzero_si512();
    __mmask16 negative = 0;
    for (int64_t i = 0; i < len; i += 16) {
      const __mmask16 m = len - i >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << (len - i)) - 1u);
      scan16(_mm512_maskz_loadu_ps(m, v + i), m, max_bits, negative);
    }
    const float am = block_absmax_from_bits(_mm512_reduce_max_epu32(max_bits), negative != 0, format_signed);
    absmax[b] = am;
    const Normalizer nz = make_normalizer(am);
    if (four_bit) {
      encode_block4_packed(tree, tree_codes, nz, v, len, codes + begin / 2);  // even-sized blocks
    } else {
      encode_block8(enc.key_entries, enc.key_flip, nz, v, len, codes + begin);
    }
  }
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
