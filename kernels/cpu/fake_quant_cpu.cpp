// Fake quantization on the CPU: one fused pass per tile of groups (min/max scan, qparams, quantize,
// mask bits) while the tile is in cache. Results do not depend on the thread count: each group's
// qparams come from its own elements only, and the per-element math is kernels/common's.
#include "fake_quant_cpu.h"

#include <omp.h>

#include <algorithm>
#include <type_traits>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
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

// min / max of g values in float32, NaN for both if any value is NaN (what fq_min / fq_max chains
// give; which of +-0 wins a tie does not matter: the qparams map both to the same scale and zero
// point). Eight independent lanes (SSE min / max for float32 input), so the scan vectorizes.
template <typename T>
void scan_minmax(const T* x, int64_t g, float* mn_out, float* mx_out) {
  float mn = to_f32(x[0]), mx = mn;
  bool nan = false;
  int64_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>) {
    __m128 vmn0 = _mm_set1_ps(mn), vmx0 = vmn0, vmn1 = vmn0, vmx1 = vmn0, vnan = _mm_setzero_ps();
    for (; i + 8 <= g; i += 8) {
      const __m128 a = _mm_loadu_ps(x + i), b = _mm_loadu_ps(x + i + 4);
      vmn0 = _mm_min_ps(vmn0, a), vmx0 = _mm_max_ps(vmx0, a);
      vmn1 = _mm_min_ps(vmn1, b), vmx1 = _mm_max_ps(vmx1, b);
      vnan = _mm_or_ps(vnan, _mm_or_ps(_mm_cmpunord_ps(a, a), _mm_cmpunord_ps(b, b)));
    }
    alignas(16) float lo[4], hi[4];
    _mm_store_ps(lo, _mm_min_ps(vmn0, vmn1));
    _mm_store_ps(hi, _mm_max_ps(vmx0, vmx1));
    for (int k = 0; k < 4; ++k) mn = lo[k] < mn ? lo[k] : mn, mx = hi[k] > mx ? hi[k] : mx;
    nan = _mm_movemask_ps(vnan) != 0;
  }
#endif
  for (; i < g; ++i) {
    const float v = to_f32(x[i]);
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
    nan |= v != v;
  }
  if (nan || mn != mn) mn = mx = std::numeric_limits<float>::quiet_NaN();
  *mn_out = mn;
  *mx_out = mx;
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
          float mn, mx;
          scan_minmax(xg, G, &mn, &mx);
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
