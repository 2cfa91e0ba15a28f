// Fake quantization on the CPU: one fused pass per tile of groups (min/max scan, qparams, quantize,
// mask bits) while the tile is in cache. Results do not depend on the thread count: each group's
// qparams come from its own elements only, and the per-element math is kernels/common's.
#include "fake_quant_cpu.h"

#include <omp.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "../common/fake_quant_math.h"
#include "../common/float_convert.h"

namespace lowbit {
namespace kernels {
namespace {

constexpr int64_t kTileElems = 8192;  // about what stays in L1/L2 between the scan and the quantize

// Groups per tile: a whole number of groups whose element count is a multiple of 8, so a tile owns
// whole mask bytes and tiles run in parallel without sharing a byte.
int64_t groups_per_tile(int64_t group_size) {
  int64_t t = 1;
  while ((t * group_size) % 8 != 0) ++t;  // at most 8
  const int64_t mult = std::max<int64_t>(1, kTileElems / (t * group_size));
  return t * mult;
}

template <typename T>
void fake_quant_impl(const FakeQuantParams& p) {
  const T* x = static_cast<const T*>(p.input);
  T* y = static_cast<T*>(p.output);
  const FakeQuantRange r = fq_range(p.bits, p.is_signed);
  const int64_t G = p.group_size;
  const int64_t ngroups = p.n / G;
  const int64_t per_tile = groups_per_tile(G);
  const int64_t ntiles = (ngroups + per_tile - 1) / per_tile;
#pragma omp parallel
  {
    // One byte per element of the tile, packed into mask bits after the tile's elementwise loops,
    // so those loops carry no bit shuffling and vectorize.
    std::vector<uint8_t> inside(per_tile * G);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < ntiles; ++t) {
      const int64_t g_begin = t * per_tile, g_end = std::min(ngroups, (t + 1) * per_tile);
      for (int64_t g = g_begin; g < g_end; ++g) {
        const T* xg = x + g * G;
        if (p.dynamic) {
          // Eight independent lanes of plain selects plus a NaN flag, so the scan vectorizes; the
          // same min / max as fq_min / fq_max whenever the group holds no NaN, and NaN when it does.
          float mn8[8], mx8[8];
          bool nan = false;
          for (int k = 0; k < 8; ++k) mn8[k] = mx8[k] = to_f32(xg[0]);
          int64_t i = 0;
          for (; i + 8 <= G; i += 8) {
            for (int k = 0; k < 8; ++k) {
              const float v = to_f32(xg[i + k]);
              mn8[k] = v < mn8[k] ? v : mn8[k];
              mx8[k] = v > mx8[k] ? v : mx8[k];
              nan |= v != v;
            }
          }
          for (; i < G; ++i) {
            const float v = to_f32(xg[i]);
            mn8[0] = v < mn8[0] ? v : mn8[0];
            mx8[0] = v > mx8[0] ? v : mx8[0];
            nan |= v != v;
          }
          float mn = mn8[0], mx = mx8[0];
          for (int k = 1; k < 8; ++k) mn = mn8[k] < mn ? mn8[k] : mn, mx = mx8[k] > mx ? mx8[k] : mx;
          if (nan) mn = mx = std::numeric_limits<float>::quiet_NaN();
          const AffineQParams qp = fq_qparams(mn, mx, r, p.symmetric, p.eps);
          p.scale[g] = qp.scale;
          p.zero_point[g] = qp.zero_point;
        }
        const float scale = p.scale[g], zp = p.zero_point[g];
        const float inv = fq_inv_scale(scale);
        T* yg = y + g * G;
        uint8_t* ins = inside.data() + (g - g_begin) * G;
        for (int64_t i = 0; i < G; ++i) {
          bool in;
          yg[i] = from_f32<T>(fq_apply(to_f32(xg[i]), scale, inv, zp, r, &in));
          ins[i] = in;
        }
      }
      // The tile starts on a mask byte (groups_per_tile); only the tensor's last byte can be partial.
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

template <typename T>
void backward_impl(const FakeQuantBackwardParams& p) {
  const T* dy = static_cast<const T*>(p.grad);
  T* dx = static_cast<T*>(p.grad_input);
  const T zero = from_f32<T>(0.0f);
  const int64_t nbytes = (p.n + 7) / 8;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < nbytes; ++b) {
    const uint32_t m = p.mask[b];
    const int64_t end = std::min<int64_t>(8, p.n - b * 8);
    for (int64_t k = 0; k < end; ++k) dx[b * 8 + k] = (m >> k) & 1u ? dy[b * 8 + k] : zero;
  }
}

template <typename T>
void lsq_backward_impl(const LsqBackwardParams& p) {
  const T* dy = static_cast<const T*>(p.grad);
  const T* x = static_cast<const T*>(p.input);
  T* dx = static_cast<T*>(p.grad_input);
  const FakeQuantRange r = fq_range(p.bits, p.is_signed);
  const int64_t G = p.group_size;
  const int64_t ngroups = p.n / G;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < ngroups; ++g) {
    const float scale = p.scale[g], zp = p.zero_point[g];
    const float inv = fq_inv_scale(scale);
    // Summed in double: the result is a reduction, compared with the reference to a tolerance.
    double ds = 0.0, dz = 0.0;
    for (int64_t i = g * G; i < (g + 1) * G; ++i) {
      const LsqGrad lg = fq_lsq_grad(to_f32(dy[i]), to_f32(x[i]), scale, inv, zp, r);
      dx[i] = from_f32<T>(lg.dx);
      ds += lg.dscale;
      dz += lg.dzero;
    }
    p.grad_scale[g] = static_cast<float>(ds) * p.grad_factor;
    p.grad_zero_point[g] = static_cast<float>(dz) * p.grad_factor;
  }
}

template <template <typename> class F, typename P>
void by_type(ElemType t, const P& p) {
  switch (t) {
    case ElemType::F32: return F<float>::run(p);
    case ElemType::BF16: return F<bf16_t>::run(p);
    case ElemType::F16: return F<f16_t>::run(p);
  }
}

template <typename T> struct Forward { static void run(const FakeQuantParams& p) { fake_quant_impl<T>(p); } };
template <typename T> struct Backward { static void run(const FakeQuantBackwardParams& p) { backward_impl<T>(p); } };
template <typename T> struct Lsq { static void run(const LsqBackwardParams& p) { lsq_backward_impl<T>(p); } };

}  // namespace

void fake_quant_cpu(const FakeQuantParams& p) {
  if (p.n == 0) return;
  by_type<Forward>(p.type, p);
}

void fake_quant_backward_cpu(const FakeQuantBackwardParams& p) {
  if (p.n == 0) return;
  by_type<Backward>(p.type, p);
}

void fake_quant_lsq_backward_cpu(const LsqBackwardParams& p) {
  if (p.n == 0) return;
  by_type<Lsq>(p.type, p);
}

}  // namespace kernels
}  // namespace lowbit
