// The blockwise quantization formats of optimizer state: ids, names, bit widths, default block sizes.
// Torch-free: shared by kernels, tensors/ and the CLI.
#pragma once

#include <cstdint>
#include <string>

namespace lowbit {

// Order is part of the checkpoint format: append only.
enum class QuantFormat : int32_t {
  Dyn8Signed = 0,       // dynamic tree map, signed, 0 at code 127, max +1
  Dyn8Unsigned = 1,     // dynamic tree map, unsigned, 0 at code 0
  DE4Signed = 2,        // dynamic exponent map with 3 exponent bits, 4 bits in all
  Linear4Unsigned = 3,  // (i+1)/16, no zero
  FP8E4M3 = 4,          // e4m3fn codes, scale absmax/448
  FP8E5M2 = 5,          // e5m2 codes, scale absmax/57344
};

constexpr int kNumQuantFormats = 6;

inline const char* format_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::Dyn8Signed: return "Dyn8Signed";
    case QuantFormat::Dyn8Unsigned: return "Dyn8Unsigned";
    case QuantFormat::DE4Signed: return "DE4Signed";
    case QuantFormat::Linear4Unsigned: return "Linear4Unsigned";
    case QuantFormat::FP8E4M3: return "FP8E4M3";
    case QuantFormat::FP8E5M2: return "FP8E5M2";
  }
  return "?";
}

inline bool is_valid_format(int32_t id) { return id >= 0 && id < kNumQuantFormats; }

// Bits per code: 4-bit formats pack two codes per byte (even element in the low nibble).
inline int format_bits(QuantFormat f) {
  return (f == QuantFormat::DE4Signed || f == QuantFormat::Linear4Unsigned) ? 4 : 8;
}

inline bool format_is_signed(QuantFormat f) {
  return f == QuantFormat::Dyn8Signed || f == QuantFormat::DE4Signed ||
         f == QuantFormat::FP8E4M3 || f == QuantFormat::FP8E5M2;
}

inline int64_t default_block_size(QuantFormat f) { return format_bits(f) == 4 ? 128 : 256; }

constexpr int64_t kMinBlockSize = 32;
constexpr int64_t kMaxBlockSize = 4096;

inline bool is_valid_block_size(int64_t b) {
  return b >= kMinBlockSize && b <= kMaxBlockSize && (b & (b - 1)) == 0;
}

// Bytes of codes for n elements.
inline int64_t code_bytes(QuantFormat f, int64_t n) { return format_bits(f) == 4 ? (n + 1) / 2 : n; }

inline int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

// Parses a name as printed by format_name (case-insensitive); returns false when unknown.
inline bool parse_format(const std::string& name, QuantFormat* out) {
  auto lower = [](std::string s) {
    for (auto& c : s) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
    return s;
  };
  const std::string want = lower(name);
  for (int i = 0; i < kNumQuantFormats; ++i) {
    const auto f = static_cast<QuantFormat>(i);
    if (lower(format_name(f)) == want) {
      *out = f;
      return true;
    }
  }
  return false;
}

// "Dyn8Signed, Dyn8Unsigned, ..." for error messages.
inline std::string all_format_names() {
  std::string s;
  for (int i = 0; i < kNumQuantFormats; ++i) {
    if (i) s += ", ";
    s += format_name(static_cast<QuantFormat>(i));
  }
  return s;
}

}  // namespace lowbit
