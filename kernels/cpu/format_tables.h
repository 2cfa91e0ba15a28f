// Per-format tables of the CPU kernels, built once per process, and the raw-pointer view a kernel
// resolves once per call (not per block): the codebook for decoding, and for encoding (nearest
// code, ties to the lower code) the packed key table of make_key_table (one lookup and one add per
// element) and the 4-bit formats' thresholds as a 15-node search tree.
#pragma once

#include <cstdint>
#include <vector>

#include "../common/code_tables.h"
#include "../common/encode.h"
#include "../common/float_convert.h"

namespace lowbit {
namespace kernels {

// Copied into a loop's registers: stores through uint8_t* may alias anything, so pointers held in
// a shared object would be reloaded on every element.
struct FormatView {
  const uint32_t* key_entries;   // 64Ki packed entries (code_tables.h: make_key_table)
  const float* codebook;         // 2^bits values; decode = codebook[code] * absmax
  const float* eytzinger;        // 16 floats, index 1..15 (4-bit formats)
  const float* thresholds;       // ascending, padded with +Inf (make_encode_table's)
  const uint8_t* sorted_codes;   // code of the i-th smallest value
  const uint8_t* planes;         // 8-bit formats: byte k of codebook[e] at planes[256 k + e]
  uint32_t key_flip;             // the key table's x = u ^ (u < 0 ? key_flip : 0)
  int bits;
  bool linear4;                  // thresholds (2k + 3) / 32, codes in value order: encoded by formula

  uint8_t encode(float normalized) const {
    const uint32_t u = f32_bits(normalized + 0.0f);  // -0.0 as +0.0 (make_key_table)
    const uint32_t x = u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) & key_flip);
    return static_cast<uint8_t>((key_entries[x >> 16] + x) >> 16);
  }
};

class FormatTables {
 public:
  explicit FormatTables(QuantFormat fmt);
  FormatView view() const;

 private:
  EncodeTable table_;
  KeyTable keys_;  // 256 KiB; the entries a tensor touches are a small hot part
  std::vector<float> codebook_;
  bool linear4_ = false;
  alignas(64) float eytzinger_[16] = {};
  alignas(64) uint8_t planes_[4 * 256] = {};
};

// The tables of a format, built on first use (thread-safe).
FormatView format_tables(QuantFormat fmt);

// out[i] = code of normalize(nz, v[i]), one code per byte. AVX-512 (16 lanes, one gather each)
// where the CPU has it, the scalar lookup elsewhere; `vector_path = false` forces the scalar one
// (tests compare the two).
void encode_codes(const FormatView& f, Normalizer nz, const float* v, int64_t len, uint8_t* out,
                  bool vector_path = true);

// The same for 4-bit formats, two codes per byte (even element in the low nibble; an odd last
// element leaves the high nibble 0): (len + 1) / 2 bytes. The vector path searches the 15
// thresholds in registers (no gather).
void encode_codes_packed4(const FormatView& f, Normalizer nz, const float* v, int64_t len, uint8_t* out,
                          bool vector_path = true);

// Quantizes blocks [first_block, end_block) of n fp32 values in one call (scan, absmax with
// encode.h's flags, encode), where the CPU has AVX-512; returns false (doing nothing) elsewhere.
bool quantize_blocks_f32(const FormatView& f, bool format_signed, const float* x, int64_t n, int64_t block,
                         int64_t first_block, int64_t end_block, uint8_t* codes, float* absmax);

// out[i] = codebook[codes[i]] * absmax for an 8-bit format: byte permutes with AVX-512 VBMI (no
// gathers), a plain loop elsewhere; `vector_path = false` forces the loop.
void decode_codes8(const FormatView& f, const uint8_t* codes, int64_t len, float absmax, float* out,
                   bool vector_path = true);

// The same for a 4-bit format's packed codes (element i's code in nibble i % 2 of byte i / 2):
// byte permutes with AVX-512 VBMI, where decode_codes4_fast() says so, a plain loop elsewhere.
// (A function of this file, so that the AVX-512 loops ask without inlining cpu_features.h's
// functions into their objects: x86_objects_isolated.)
bool decode_codes4_fast();
void decode_codes4(const FormatView& f, const uint8_t* codes, int64_t len, float absmax, float* out,
                   bool vector_path = true);

}  // namespace kernels
}  // namespace lowbit
