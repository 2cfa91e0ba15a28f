// The CPU encoder: nearest code (ties to the lower code) of a normalized value with one table
// lookup and one integer compare per element (make_key_table in code_tables.h).
#pragma once

#include <cstdint>
#include <vector>

#include "../common/code_tables.h"
#include "../common/encode.h"
#include "../common/float_convert.h"

namespace lowbit {
namespace kernels {

// Raw pointer to a format's 64Ki packed entries, copied into a loop's registers: stores through
// uint8_t* may alias anything, so a member pointer would be reloaded on every element.
struct KeyTableView {
  const uint32_t* entries;

  uint8_t encode(float normalized) const {
    const uint32_t key = order_key_bits(f32_bits(normalized));
    const uint32_t e = entries[key >> 16];
    return static_cast<uint8_t>((key & 0xFFFFu) > (e >> 16) ? e >> 8 : e);
  }
};

class CodeEncoder {
 public:
  explicit CodeEncoder(QuantFormat fmt) : entries_(make_key_table(make_encode_table(fmt))) {}
  KeyTableView view() const { return KeyTableView{entries_.data()}; }
  uint8_t encode(float normalized) const { return view().encode(normalized); }

 private:
  std::vector<uint32_t> entries_;  // 256 KiB; the entries a tensor touches are a small hot part
};

// One encoder per format, built on first use (thread-safe).
const CodeEncoder& code_encoder(QuantFormat fmt);

// out[i] = code of normalize(nz, v[i]), one code per byte. AVX-512 (16 lanes, one gather each)
// where the CPU has it, the scalar lookup elsewhere; `vector_path = false` forces the scalar one
// (tests compare the two).
void encode_codes(const KeyTableView& enc, Normalizer nz, const float* v, int64_t len, uint8_t* out,
                  bool vector_path = true);

// The same for 4-bit formats, two codes per byte (even element in the low nibble; an odd last
// element leaves the high nibble 0): (len + 1) / 2 bytes.
void encode_codes_packed4(const KeyTableView& enc, Normalizer nz, const float* v, int64_t len, uint8_t* out,
                          bool vector_path = true);

}  // namespace kernels
}  // namespace lowbit
