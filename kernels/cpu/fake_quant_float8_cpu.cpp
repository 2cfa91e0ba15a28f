// Dynamic float8 fake quantization on the CPU (OpenMP over tiles of whole mask bytes, as in
// fake_quant_cpu.cpp): per group, the absmax scan, the scale, then cast-and-back of each element.
#include <omp.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "../common/fake_quant_math.h"
#include "fake_quant_cpu.h"

namespace lowbit {
namespace kernels {
namespace {

template <typename T>
void float8_impl(const Float8FakeQuantParams& p) {
  const T* x = static_cast<const T*>(p.input);
  T* y = static_cast<T*>(p.output);
  const Float8Format f = fq_float8_format(p.e4m3);
  const int64_t G = p.group_size, ngroups = p.n / G;
  int64_t per_tile = 1;
  while ((per_tile * G) % 8 != 0) ++per_tile;  // a tile owns whole mask bytes
  per_tile *= std::max<int64_t>(1, 8192 / (per_tile * G));
  const int64_t ntiles = (ngroups + per_tile - 1) / per_tile;
#pragma omp parallel
  {
    std::vector<uint8_t> inside(per_tile * G);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t g_begin = t * per_tile, g_end = std::min(ngroups, (t + 1) * per_tile);
      for (int64_t g = g_begin; g < g_end; ++g) {
        const T* xg = x + g * G;
        float amax = 0.0f;
        bool nan = false;
        for (int64_t i = 0; i < G; ++i) {
          const float a = std::abs(to_f32(xg[i]));
          amax = a > amax ? a : amax;
          nan |= a != a;
        }
        if (nan) amax = std::numeric_limits<float>::quiet_NaN();  // torch.amax propagates NaN
        const float scale = fq_float8_scale(amax, f, p.eps);
        p.scale[g] = scale;
        T* yg = y + g * G;
        uint8_t* ins = inside.data() + (g - g_begin) * G;
        for (int64_t i = 0; i < G; ++i) {
          bool in;
          yg[i] = from_f32<T>(fq_float8_apply(to_f32(xg[i]), scale, f, &in));
          ins[i] = in;
        }
      }
      const int64_t e_begin = g_begin * G, count = (g_end - g_begin) * G;
      for (int64_t b = 0; b < (count + 7) / 8; ++b) {
        uint32_t bits = 0;
        const int64_t end = std::min<int64_t>(8, count - b * 8);
        for (int64_t k = 0; k < end; ++k) bits |= uint32_t(inside[b * 8 + k]) << k;
        p.mask[e_begin / 8 + b] = static_cast<uint8_t>(bits);
      }
    }
  }
}

}  // namespace

void fake_quant_float8_cpu(const Float8FakeQuantParams& p) {
  if (p.n == 0) return;
  switch (p.type) {
    case ElemType::F32: return float8_impl<float>(p);
    case ElemType::BF16: return float8_impl<bf16_t>(p);
    case ElemType::F16: return float8_impl<f16_t>(p);
  }
}

}  // namespace kernels
}  // namespace lowbit
