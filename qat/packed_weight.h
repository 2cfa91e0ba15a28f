// How qat::convert stores a [rows, cols] weight: integer codes (qat/quantized_modules.h) or the
// float formats' codes + scales, packed for real, and the packing of 4-bit codes two per byte.
//   float8 (e4m3fn / e5m2): one byte per weight + a float32 scale per group (tensor, row or group)
//   MXFP4: two e2m1 codes per byte + one e8m0 byte per 32 weights              (4.25 bits / weight)
//   NVFP4: two e2m1 codes per byte + one e4m3 byte per 16 weights + a float32 tensor scale (4.5)
// Decoding gives back exactly what the fake quantizer produced: the codes are the values the
// fake-quant kernels rounded to (tensors/float_code_tensors.h), and value * scale is the same float32 product.
#pragma once

#include <torch/torch.h>

#include <string>

#include "fake_quant_config.h"

namespace lowbit {
namespace qat {

// Row-wise packing of uint8 codes [rows, cols]: each row packs on its own (a 4-bit row of odd
// length gets a zero tail nibble), so rows can be selected from the packed tensor.
at::Tensor pack_rows(const at::Tensor& codes, int64_t bits);
at::Tensor unpack_rows(const at::Tensor& packed, int64_t bits, int64_t cols);
int64_t packed_row_bytes(int64_t cols, int64_t bits);

// Elements per scale of a row-major weight [rows, cols] under config c (integer or float format);
// refuses what convert() cannot store, naming `who` and the value.
int64_t weight_group_size(const FakeQuantConfig& c, int64_t rows, int64_t cols, const std::string& who);

// A float-format weight's storage; tensor_scale is defined for NVFP4 only.
struct PackedFloatWeight {
  at::Tensor packed;        // uint8 [rows, packed_row_bytes(cols, code bits)]
  at::Tensor scale;         // float8: float32 per group; MXFP4: uint8 e8m0 per 32; NVFP4: uint8 e4m3 per 16
  at::Tensor tensor_scale;  // NVFP4: float32 [1]
};

bool is_float_format(const FakeQuantConfig& c);
// 8 (float8) or 4 (MXFP4, NVFP4).
int64_t float_code_bits(const FakeQuantConfig& c);
// Zero-filled storage of the right sizes and dtypes (a module to load into).
PackedFloatWeight empty_float_weight(const FakeQuantConfig& c, int64_t rows, int64_t cols, int64_t group_size);
// The codes and scales of what the fake quantizer of config c makes of w [rows, cols] (finite).
PackedFloatWeight pack_float_weight(const at::Tensor& w, const FakeQuantConfig& c, int64_t group_size,
                                    const std::string& who);
// float32 [rows, cols]: decoded values times their scales; rows = packed.size(0) (any row subset).
at::Tensor unpack_float_weight(const PackedFloatWeight& p, const FakeQuantConfig& c, int64_t cols, int64_t group_size);
// The bytes the format promises for [rows, cols]: codes, scales, tensor scale.
int64_t float_weight_bytes(const FakeQuantConfig& c, int64_t rows, int64_t cols, int64_t group_size);

}  // namespace qat
}  // namespace lowbit
