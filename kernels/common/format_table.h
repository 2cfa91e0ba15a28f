// The blockwise quantization formats of optimizer state, as one table: id, name, bit width,
// signedness, codebook recipe, scale and default block size per format. Everything else (the CPU,
// GPU and ATen encode tables, checkpoints, the CLI) reads this table, so a new format is one entry.
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
  Pow8Signed = 6,       // sign(c) (c/127)^2, c = code - 127: square-root companding (compand.h)
  Pow8Unsigned = 7,     // (code/255)^2: square-root companding, a positive value never encodes to 0
};

constexpr int kNumQuantFormats = 8;

// How a format's codebook is made (kernels/common/code_tables.h: make_codebook).
enum class CodebookKind : int32_t {
  DynamicTree,  // Dettmers et al.'s dynamic map with `exponent_bits` decades (arXiv 2110.02861)
  Linear,       // (i + 1) / 2^bits for code i: evenly spaced, zero excluded
  Float8,       // the values of an 8-bit float, divided by its largest finite value
  Power,        // squares of an even grid, encoded arithmetically (compand.h), no table needed
};

struct FormatSpec {
  const char* name;
  int bits;                 // 4: two codes per byte, even element in the low nibble
  bool is_signed;
  int64_t default_block;    // elements per absmax
  CodebookKind codebook;
  int exponent_bits;        // DynamicTree: decades; Float8: exponent bits
  int mantissa_bits;        // Float8
  int exponent_bias;        // Float8
  bool ieee_special;        // Float8: exponent all ones is Inf/NaN (e5m2); else only S.1111.111 is NaN (e4m3fn)
  double max_value;         // Float8: largest finite value (the codebook is value / max_value)
};

// Indexed by QuantFormat.
constexpr FormatSpec kFormatSpecs[kNumQuantFormats] = {
    {"Dyn8Signed", 8, true, 256, CodebookKind::DynamicTree, 7, 0, 0, false, 1.0},
    {"Dyn8Unsigned", 8, false, 256, CodebookKind::DynamicTree, 7, 0, 0, false, 1.0},
    {"DE4Signed", 4, true, 128, CodebookKind::DynamicTree, 3, 0, 0, false, 1.0},
    {"Linear4Unsigned", 4, false, 128, CodebookKind::Linear, 0, 0, 0, false, 1.0},
    {"FP8E4M3", 8, true, 256, CodebookKind::Float8, 4, 3, 7, false, 448.0},
    {"FP8E5M2", 8, true, 256, CodebookKind::Float8, 5, 2, 15, true, 57344.0},
    // Block 64: the fp32 absmax costs what FlashOptim's 16-bit scale per 32 costs (1/16 B per
    // element), and a block spans less dynamic range than 256 would.
    {"Pow8Signed", 8, true, 64, CodebookKind::Power, 0, 0, 0, false, 1.0},
    {"Pow8Unsigned", 8, false, 64, CodebookKind::Power, 0, 0, 0, false, 1.0},
};

inline bool is_valid_format(int32_t id) { return id >= 0 && id < kNumQuantFormats; }
inline const FormatSpec& format_spec(QuantFormat f) { return kFormatSpecs[static_cast<int>(f)]; }
inline const char* format_name(QuantFormat f) {
  return is_valid_format(static_cast<int32_t>(f)) ? format_spec(f).name : "?";
}
inline int format_bits(QuantFormat f) { return format_spec(f).bits; }
inline bool format_is_signed(QuantFormat f) { return format_spec(f).is_signed; }
inline int64_t default_block_size(QuantFormat f) { return format_spec(f).default_block; }
// Encoded and decoded by arithmetic (compand.h) where a kernel wants no table.
inline bool is_arithmetic_format(QuantFormat f) { return format_spec(f).codebook == CodebookKind::Power; }

constexpr int64_t kMinBlockSize = 32;
constexpr int64_t kMaxBlockSize = 4096;

inline bool is_valid_block_size(int64_t b) {
  return b >= kMinBlockSize && b <= kMaxBlockSize && (b & (b - 1)) == 0;
}

// Bytes of codes for n elements.
inline int64_t code_bytes(QuantFormat f, int64_t n) { return format_bits(f) == 4 ? (n + 1) / 2 : n; }

inline int64_t num_blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }

inline std::string ascii_lower(std::string s) {
  for (auto& c : s) c = (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c;
  return s;
}

// Parses a name as printed by format_name (case-insensitive); returns false when unknown.
inline bool parse_format(const std::string& name, QuantFormat* out) {
  const std::string want = ascii_lower(name);
  for (int i = 0; i < kNumQuantFormats; ++i) {
    if (ascii_lower(kFormatSpecs[i].name) == want) {
      *out = static_cast<QuantFormat>(i);
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
    s += kFormatSpecs[i].name;
  }
  return s;
}

}  // namespace lowbit
