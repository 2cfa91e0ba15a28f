// LAMB's first pass over one block on AVX2 (optim_step_parts.h), adding in the scalar pass's
// order: partial sum j takes elements j, j + 16, ... (kLambLanes), so each round of 16 elements
// is two halves of 8 lanes and the block's last len % 16 elements go through the scalar functions
// into the same partial sums. Compiled with the AVX2 flags: all here but the entry point has
// internal linkage (optim_step_avx2.cpp says why).
#include "vec8.h"  // first: the rules of optim_rules.h see its overloads

#include <immintrin.h>

#include <algorithm>

#include "../../common/optim_rules.h"
#include "../optim_step_parts.h"
#include "lanes8.h"

namespace lowbit {
namespace kernels {
namespace {

// The squares of 8 floats, in double, added to the partial sums of their lanes (lo: lanes 0-3).
inline void add_squares(__m256 x, __m256d* lo, __m256d* hi) {
  const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  *lo = _mm256_add_pd(*lo, _mm256_mul_pd(a, a));
  *hi = _mm256_add_pd(*hi, _mm256_mul_pd(b, b));
}

}  // namespace

void lamb_norms_block_avx2(const ParamTask& t, int64_t block, float grad_scale, float* buf, double* sums) {
  const LambBlock lb = decode_lamb_block(t, block, buf);
  const int64_t begin = lb.begin, len = lb.len;
  float* const* s = lb.s;
  const Hyper h = t.hyper;
  const __m256 scale = _mm256_set1_ps(grad_scale);
  __m256d pp[kLambLanes / 4], rr[kLambLanes / 4];  // 4 partial sums each
  for (int q = 0; q < kLambLanes / 4; ++q) pp[q] = rr[q] = _mm256_setzero_pd();
  const int64_t whole = len - len % kLambLanes;
  for (int64_t i = 0; i < whole; i += kLambLanes)
    for (int half = 0; half < 2; ++half) {
      const int64_t j = i + 8 * half;
      const __m256 p = load8(t.param, t.param_type, begin + j);
      __m256 g = load8(t.grad, t.grad_type, begin + j);
      if (grad_scale != 1.0f) g = _mm256_mul_ps(g, scale);
      f32x8 gv = (f32x8)g;
      if (h.maximize) gv = -gv;
      const f32x8 st[2] = {(f32x8)_mm256_loadu_ps(s[0] + j), (f32x8)_mm256_loadu_ps(s[1] + j)};
      f32x8 mn, vn;
      const __m256 r = (__m256)lamb_direction(h, gv, (f32x8)p, st, &mn, &vn);
      add_squares(p, &pp[2 * half], &pp[2 * half + 1]);
      add_squares(r, &rr[2 * half], &rr[2 * half + 1]);
    }
  alignas(32) double ps[kLambLanes], rs[kLambLanes];
  for (int q = 0; q < kLambLanes / 4; ++q) {
    _mm256_store_pd(ps + 4 * q, pp[q]);
    _mm256_store_pd(rs + 4 * q, rr[q]);
  }
  for (int64_t i = whole; i < len; ++i) {
    float p, g;
    load_block(t.param, t.param_type, begin + i, 1, &p);
    load_block(t.grad, t.grad_type, begin + i, 1, &g);
    if (grad_scale != 1.0f) g *= grad_scale;
    if (h.maximize) g = -g;
    const float st[2] = {s[0][i], s[1][i]};
    float m, v;
    const float r = lamb_direction(h, g, p, st, &m, &v);
    ps[i % kLambLanes] += static_cast<double>(p) * p;
    rs[i % kLambLanes] += static_cast<double>(r) * r;
  }
  add_lamb_partials(ps, rs, sums);
}

}  // namespace kernels
}  // namespace lowbit
