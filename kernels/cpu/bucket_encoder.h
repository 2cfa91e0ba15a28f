// A fast CPU encoder: #{thresholds < x} through a 64Ki-entry table indexed by the top 16 bits of
// x's order-preserving integer key, then a few compares. Same answer as the Eytzinger descent.
#pragma once

#include <cstdint>
#include <vector>

#include "../common/code_tables.h"
#include "../common/float_convert.h"

namespace lowbit {
namespace kernels {

// Maps a float's bits to an unsigned key that sorts like the float (NaN aside).
inline uint32_t order_key(float x) {
  // Branch-free: half of a signed tensor is negative, and a mispredicted branch per element
  // costs more than the whole encode.
  const uint32_t u = f32_bits(x);
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

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
  explicit BucketEncoder(QuantFormat fmt) : table_(make_encode_table(fmt)), start_(1u << 16) {
    const int nthr = table_.num_values - 1;
    // Thresholds padded with +inf so the fixed-length scan never reads past the end.
    thr_.assign(table_.thresholds, table_.thresholds + nthr);
    int j = 0;
    int widest = 0;
    for (uint32_t b = 0; b < (1u << 16); ++b) {
      const uint32_t lo = b << 16;
      while (j < nthr && order_key(thr_[j]) < lo) ++j;
      start_[b] = static_cast<uint8_t>(j);  // at most 255 thresholds
      int k = j;
      const uint32_t hi = lo | 0xFFFFu;
      while (k < nthr && order_key(thr_[k]) <= hi) ++k;
      widest = std::max(widest, k - j);
    }
    scan_ = widest;
    thr_.resize(nthr + scan_ + 1, INFINITY);
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
