// How an optimizer stores each state tensor: FP32, BF16, or blockwise-quantized (Q8, Q4, FP8, C8).
#pragma once

#include <string>

#include "../kernels/common/format_table.h"

namespace lowbit {

// Order is part of the checkpoint format: append only.
enum class StateFormat : int32_t { FP32 = 0, BF16 = 1, Q8 = 2, Q4 = 3, FP8 = 4, C8 = 5 };

// Every state format, for loops over them (tests, benches, the CLI).
constexpr StateFormat kAllStateFormats[] = {StateFormat::FP32, StateFormat::BF16, StateFormat::Q8,
                                            StateFormat::Q4,   StateFormat::FP8,  StateFormat::C8};
constexpr int kNumStateFormats = 6;

inline const char* state_format_name(StateFormat f) {
  switch (f) {
    case StateFormat::FP32: return "FP32";
    case StateFormat::BF16: return "BF16";
    case StateFormat::Q8: return "Q8";
    case StateFormat::Q4: return "Q4";
    case StateFormat::FP8: return "FP8";
    case StateFormat::C8: return "C8";
  }
  return "?";
}

inline bool is_quantized(StateFormat f) {
  return f == StateFormat::Q8 || f == StateFormat::Q4 || f == StateFormat::FP8 || f == StateFormat::C8;
}

// The QuantFormat of a quantized state: first moments (signed) and second moments (unsigned) get
// the maps of DESIGN.md. FP8 stores signed states as E4M3 and unsigned ones in `fp8_unsigned`
// (E4M3 by default, E5M2 selectable; see optim/options.h). C8 is square-root companded 8-bit
// (kernels/common/compand.h), block 64.
inline QuantFormat quant_format_for(StateFormat f, bool is_signed,
                                    QuantFormat fp8_unsigned = QuantFormat::FP8E4M3) {
  switch (f) {
    case StateFormat::Q4: return is_signed ? QuantFormat::DE4Signed : QuantFormat::Linear4Unsigned;
    case StateFormat::FP8: return is_signed ? QuantFormat::FP8E4M3 : fp8_unsigned;
    case StateFormat::C8: return is_signed ? QuantFormat::Pow8Signed : QuantFormat::Pow8Unsigned;
    default: return is_signed ? QuantFormat::Dyn8Signed : QuantFormat::Dyn8Unsigned;
  }
}

// "FP32, BF16, Q8, Q4, FP8, C8" for error messages.
inline std::string all_state_format_names() {
  std::string s;
  for (const StateFormat f : kAllStateFormats) s += std::string(s.empty() ? "" : ", ") + state_format_name(f);
  return s;
}

inline bool parse_state_format(const std::string& s, StateFormat* out) {
  for (const StateFormat f : kAllStateFormats) {
    std::string name = state_format_name(f), low = s;
    for (auto& c : low) c = static_cast<char>(toupper(c));
    if (name == low) {
      *out = f;
      return true;
    }
  }
  return false;
}

}  // namespace lowbit
