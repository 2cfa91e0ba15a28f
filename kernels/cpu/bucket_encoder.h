// A fast CPU encoder: #{thresholds < x} through a 64Ki-entry table indexed by the top 16 bits of
// x's order-preserving integer key, then a few compares. Same answer as the Eytzinger descent.
#pragma once

#include <cstdint>
#include <vector>

#include "../common/code_tables.h"
#include "../common/encode.h"
#include "../common/float_convert.h"

namespace lowbit {
namespace kernels {

inline uint32_t order_key(float x) { return order_key_bits(f32_bits(x)); }

// Raw-pointer view of an encoder, copied into a loop's registers: stores through uint8_t* may alias
// anything, so member pointers would be reloaded on every element.
struct BucketView {
  const uint8_t* start;
  const float* thr;
  const uint8_t* codes;
  int scan;
  // For the SIMD encoder (encode_codes.cpp): thresholds as a two-level table.
  const float* coarse;   // 15 thresholds: 8-bit formats thr[16k + 15]; 4-bit formats all 15
  const float* fine;     // 8-bit formats: fine[16 j + c] = thr[16 c + j], j < 15
  bool eight_bit;
  bool identity_codes;   // sorted_codes[i] == i (the dynamic maps): no final lookup needed
  int sign_magnitude;    // > 0: fp8-style codes, code(i) = i < N ? 0x80 + N - i : i - N, N = this

  int count_below(float x) const {
    const int s = start[order_key(x) >> 16];
    if (scan == 1) return s + (thr[s] < x ? 1 : 0);  // every built-in format: one compare
    int c = s;
    for (int k = 0; k < scan; ++k) c += thr[s + k] < x ? 1 : 0;
    return c;
  }
  uint8_t encode(float normalized) const { return codes[count_below(normalized)]; }
};

// Encodes len normalized values into one code per byte: AVX-512 gathers (16 lanes) where the CPU
// has them, the scalar lookup elsewhere. Both compute #{thresholds < x} exactly.
void encode_codes(const BucketView& enc, const float* v, int64_t len, uint8_t* out);

class BucketEncoder {
 public:
  static constexpr int kKeyBits = 16;  // 64 KiB of starts: one compare per element (measured best)

  explicit BucketEncoder(QuantFormat fmt) : table_(make_encode_table(fmt)) {
    start_ = make_bucket_starts(table_, kKeyBits, &scan_);
    // Thresholds padded with +inf so the fixed-length scan never reads past the end.
    thr_.assign(table_.thresholds, table_.thresholds + table_.num_values - 1);
    thr_.resize(table_.num_values - 1 + scan_ + 1, INFINITY);
    // Padding: the vector path reads 4 bytes at a byte index (a dword gather).
    start_.resize(start_.size() + 4, 0);
    for (int i = 0; i < 256; ++i) codes_[i] = table_.sorted_codes[i];
    identity_ = true;
    for (int i = 0; i < table_.num_values; ++i) identity_ &= table_.sorted_codes[i] == i;
    // fp8 codes sorted by value: the negatives from the most negative down, then 0, 1, 2, ...
    int negatives = 0;
    while (negatives < table_.num_values && (table_.sorted_codes[negatives] & 0x80)) ++negatives;
    bool sm = negatives > 0 && table_.bits == 8;
    for (int i = 0; sm && i < table_.num_values; ++i)
      sm = table_.sorted_codes[i] == (i < negatives ? 0x80 + negatives - i : i - negatives);
    sign_magnitude_ = sm ? negatives : 0;
    // table_.thresholds holds 256 entries, +inf past the real ones.
    for (int k = 0; k < 15; ++k) coarse_[k] = table_.bits == 8 ? table_.thresholds[16 * k + 15] : table_.thresholds[k];
    for (int j = 0; j < 16; ++j)
      for (int c = 0; c < 16; ++c) fine_[16 * j + c] = table_.thresholds[16 * c + j];
  }

  BucketView view() const {
    return BucketView{start_.data(), thr_.data(), codes_, scan_, coarse_, fine_, table_.bits == 8, identity_,
                      sign_magnitude_};
  }
  int count_below(float x) const { return view().count_below(x); }
  uint8_t encode(float normalized) const { return view().encode(normalized); }
  const EncodeTable& table() const { return table_; }
  int scan_length() const { return scan_; }

 private:
  EncodeTable table_;
  std::vector<uint8_t> start_;
  std::vector<float> thr_;
  uint8_t codes_[256 + 4] = {};
  alignas(64) float coarse_[16] = {};
  alignas(64) float fine_[256] = {};
  bool identity_ = false;
  int sign_magnitude_ = 0;
  int scan_ = 0;
};

// One encoder per format, built on first use (thread-safe static init).
const BucketEncoder& bucket_encoder(QuantFormat fmt);

}  // namespace kernels
}  // namespace lowbit
