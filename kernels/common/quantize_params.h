// Launch parameters of the blockwise quantize / dequantize kernels (every backend takes these).
#pragma once

#include <cstdint>

#include "format_table.h"

namespace lowbit {
namespace kernels {

enum class ElemType : int { F32 = 0, BF16 = 1, F16 = 2 };

struct QuantizeParams {
  const void* input = nullptr;  // n contiguous elements of input_type
  ElemType input_type = ElemType::F32;
  int64_t n = 0;
  int64_t block_size = 256;     // power of two in [32, 4096]
  QuantFormat format = QuantFormat::Dyn8Signed;
  uint8_t* codes = nullptr;     // code_bytes(format, n) bytes
  float* absmax = nullptr;      // num_blocks(n, block_size) floats, flagged per encode.h
};

struct DequantizeParams {
  const uint8_t* codes = nullptr;
  const float* absmax = nullptr;
  int64_t n = 0;
  int64_t block_size = 256;
  QuantFormat format = QuantFormat::Dyn8Signed;
  void* output = nullptr;       // n contiguous elements of output_type
  ElemType output_type = ElemType::F32;
};

}  // namespace kernels
}  // namespace lowbit
