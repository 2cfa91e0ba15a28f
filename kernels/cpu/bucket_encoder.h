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

  int count_below(float x) const {
    const int s = start[order_key(x) >> 16];
    if (scan == 1) return s + (thr[s] < x ? 1 : 0);  // every built-in format: one compare
    int c = s;
    for (int k = 0; k < scan; ++k) c += thr[s + k] < x ? 1 : 0;
    return c;
  }
  uint8_t encode(float normalized) const { return codes[count_below(normalized)]; }
};

class BucketEncoder {
 public:
  static constexpr int kKeyBits = 16;  // 64 KiB of starts: one compare per element (measured best)

  explicit BucketEncoder(QuantFormat fmt) : table_(make_encode_table(fmt)) {
    start_ = make_bucket_starts(table_, kKeyBits, &scan_);
    // Thresholds padded with +inf so the fixed-length scan never reads past the end.
    thr_.assign(table_.thresholds, table_.thresholds + table_.num_values - 1);
    thr_.resize(table_.num_values - 1 + scan_ + 1, INFINITY);
  }

  BucketView view() const { return BucketView{start_.data(), thr_.data(), table_.sorted_codes, scan_}; }
  int count_below(float x) const { return view().count_below(x); }
  uint8_t encode(float normalized) const { return view().encode(normalized); }
  const EncodeTable& table() const { return table_; }
  int scan_length() const { return scan_; }

 private:
  EncodeTable table_;
  std::vector<uint8_t> start_;
  std::vector<float> thr_;
  int scan_ = 0;
};

// One encoder per format, built on first use (thread-safe static init).
const BucketEncoder& bucket_encoder(QuantFormat fmt);

}  // namespace kernels
}  // namespace lowbit
