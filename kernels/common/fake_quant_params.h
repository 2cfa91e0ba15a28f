// Launch parameters of the fake-quant kernels (CPU and GPU take the same structs).
//
// Layout every kernel assumes: `n` contiguous elements split into n / group_size contiguous groups,
// one (scale, zero_point) per group. Per-tensor, per-channel, per-group and per-token granularities
// all become this after the binding layer moves the channel axis first (qat/fake_quant_config.h).
// The STE mask is bit-packed: element i is bit (i % 8) of byte i / 8; unused tail bits are 0.
#pragma once

#include <cstdint>

#include "quantize_params.h"  // ElemType

namespace lowbit {
namespace kernels {

struct FakeQuantParams {
  const void* input = nullptr;  // n elements of type
  ElemType type = ElemType::F32;
  int64_t n = 0;
  int64_t group_size = 1;       // divides n
  int bits = 8;                 // 2..8
  bool is_signed = true;        // intN or uintN
  bool dynamic = true;          // qparams from the input (written) or given (read)
  bool symmetric = true;        // dynamic only
  float eps = 1.1920929e-07f;   // dynamic only: the scale's floor (> 0)
  float* scale = nullptr;       // n / group_size floats
  float* zero_point = nullptr;  // n / group_size floats
  void* output = nullptr;       // n elements of type
  uint8_t* mask = nullptr;      // (n + 7) / 8 bytes
};

struct FakeQuantBackwardParams {
  const void* grad = nullptr;   // n elements of type
  ElemType type = ElemType::F32;
  int64_t n = 0;
  const uint8_t* mask = nullptr;
  void* grad_input = nullptr;   // n elements of type
};

// Dynamic float8 fake quantization (e4m3fn or e5m2), one scale per group (fake_quant_math.h).
struct Float8FakeQuantParams {
  const void* input = nullptr;  // n elements of type
  ElemType type = ElemType::F32;
  int64_t n = 0;
  int64_t group_size = 1;       // divides n
  bool e4m3 = true;             // else e5m2
  float eps = 1.1920929e-07f;
  float* scale = nullptr;       // n / group_size floats (written)
  void* output = nullptr;       // n elements of type
  uint8_t* mask = nullptr;      // (n + 7) / 8 bytes
};

// Block-scaled floats: MX (power-of-two scale per block of 32) or NVFP4 (e4m3 scale per block of 16
// times a float32 tensor scale), fake_quant_math.h.
struct BlockFloatParams {
  const void* input = nullptr;  // n elements of type
  ElemType type = ElemType::F32;
  int64_t n = 0;
  int64_t block = 32;           // divides n
  int elem_mantissa_bits = 1;   // the element format (fq_e2m1_format, fq_float8_format)
  int elem_min_exponent = 0;
  float elem_max = 6.0f;
  bool nvfp4 = false;           // else MX
  int mx_emax = 2;              // MX: exponent of the element format's largest power of two
  float eps = 1.1920929e-07f;   // NVFP4: the tensor scale's floor
  const float* tensor_amax = nullptr;  // NVFP4: max |x| over the tensor (one float, same device)
  float* scale = nullptr;       // n / block floats: each block's scale (NVFP4: the total scale)
  void* output = nullptr;
  uint8_t* mask = nullptr;      // (n + 7) / 8 bytes
};

// Learnable scale / zero point (LSQ, LSQ+): elementwise dx plus per-group sums of d scale, d zero.
struct LsqBackwardParams {
  const void* grad = nullptr;   // n elements of type
  const void* input = nullptr;  // n elements of type
  ElemType type = ElemType::F32;
  int64_t n = 0;
  int64_t group_size = 1;
  int bits = 8;
  bool is_signed = true;
  const float* scale = nullptr;
  const float* zero_point = nullptr;
  float grad_factor = 1.0f;     // LSQ's gradient scale g, applied to each group's sum
  void* grad_input = nullptr;
  float* grad_scale = nullptr;  // n / group_size floats
  float* grad_zero_point = nullptr;
};

}  // namespace kernels
}  // namespace lowbit
