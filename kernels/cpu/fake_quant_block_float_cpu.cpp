// Block-scaled float fake quantization (MXFP4 / MXFP8, NVFP4) on the CPU: OpenMP over blocks (a
// block of 16 or 32 elements owns whole mask bytes), per block the absmax, the scale, and the
// element rounding of kernels/common/fake_quant_math.h.
#include <omp.h>

#include <cmath>
#include <limits>

#include "../common/fake_quant_math.h"
#include "fake_quant_cpu.h"

namespace lowbit {
namespace kernels {
namespace {

template <typename T>
void block_float_impl(const BlockFloatParams& p) {
  const T* x = static_cast<const T*>(p.input);
  T* y = static_cast<T*>(p.output);
  const Float8Format elem{p.elem_mantissa_bits, p.elem_min_exponent, p.elem_max};
  const int64_t B = p.block, nblocks = p.n / B;
  const float tensor_scale = p.nvfp4 ? fq_nvfp4_tensor_scale(*p.tensor_amax, p.eps) : 0.0f;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    const T* xb = x + b * B;
    float amax = 0.0f;
    bool nan = false;
    for (int64_t i = 0; i < B; ++i) {
      const float a = std::abs(to_f32(xb[i]));
      amax = a > amax ? a : amax;
      nan |= a != a;
    }
    if (nan) amax = std::numeric_limits<float>::quiet_NaN();
    const float scale = p.nvfp4 ? fq_nvfp4_total_scale(amax, tensor_scale) : fq_mx_scale(amax, p.mx_emax);
    p.scale[b] = scale;
    uint32_t bits = 0;
    for (int64_t i = 0; i < B; ++i) {
      bool in;
      y[b * B + i] = from_f32<T>(fq_block_apply(to_f32(xb[i]), scale, elem, &in));
      bits |= uint32_t(in) << (i & 7);
      if ((i & 7) == 7) {
        p.mask[(b * B + i) >> 3] = static_cast<uint8_t>(bits);
        bits = 0;
      }
    }
  }
}

}  // namespace

void fake_quant_block_float_cpu(const BlockFloatParams& p) {
  if (p.n == 0) return;
  switch (p.type) {
    case ElemType::F32: return block_float_impl<float>(p);
    case ElemType::BF16: return block_float_impl<bf16_t>(p);
    case ElemType::F16: return block_float_impl<f16_t>(p);
  }
}

}  // namespace kernels
}  // namespace lowbit
