// How an optimizer stores each state tensor: FP32, BF16, or blockwise-quantized (Q8, Q4, FP8).
#pragma once

#include <string>

#include <lowbit/kernels/common/quant_format.h>

namespace lowbit {

enum class StateFormat : int32_t { FP32 = 0, BF16 = 1, Q8 = 2, Q4 = 3, FP8 = 4 };

inline const char* state_format_name(StateFormat f) {
  switch (f) {
    case StateFormat::FP32: return "FP32";
    case StateFormat::BF16: return "BF16";
    case StateFormat::Q8: return "Q8";
    case StateFormat::Q4: return "Q4";
    case StateFormat::FP8: return "FP8";
  }
  return "?";
}

inline bool is_quantized(StateFormat f) { return f == StateFormat::Q8 || f == StateFormat::Q4 || f == StateFormat::FP8; }

// The QuantFormat of a quantized state: first moments (signed) and second moments (unsigned) get
// the maps of DESIGN.md. FP8 stores signed states as E4M3 and unsigned ones in `fp8_unsigned`
// (E4M3 by default, E5M2 selectable; see optim/options.h).
inline QuantFormat quant_format_for(StateFormat f, bool is_signed,
                                    QuantFormat fp8_unsigned = QuantFormat::FP8E4M3) {
  switch (f) {
    case StateFormat::Q4: return is_signed ? QuantFormat::DE4Signed : QuantFormat::Linear4Unsigned;
    case StateFormat::FP8: return is_signed ? QuantFormat::FP8E4M3 : fp8_unsigned;
    default: return is_signed ? QuantFormat::Dyn8Signed : QuantFormat::Dyn8Unsigned;
  }
}

inline bool parse_state_format(const std::string& s, StateFormat* out) {
  for (int i = 0; i <= 4; ++i) {
    const auto f = static_cast<StateFormat>(i);
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
