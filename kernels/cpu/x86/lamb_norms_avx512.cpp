// LAMB's first pass over one block on AVX-512 (optim_step_parts.h), adding in the scalar pass's
// order. Compiled with the AVX-512 flags: all here but the entry point has internal
// linkage (optim_step_avx512.cpp says why).
#include "vec16.h"  // first: the rules of optim_rules.h see its overloads

#include <immintrin.h>

#include <algorithm>

#include "../../common/optim_rules.h"
#include "../optim_step_parts.h"
#include "lanes16.h"

namespace lowbit {
namespace kernels {

// lamb_norms_cpu.cpp's lamb_norms_block on 16 lanes: lane j of the two double registers per sum is
// partial sum j. Lanes past the block's end hold p = g = state = 0 and r is masked to 0 (its 0 /
// eps is NaN with eps 0), so they add +0.0 (a no-op on these sums).
void lamb_norms_block_avx512(const ParamTask& t, int64_t block, float grad_scale, float* buf, double* sums) {
  const LambBlock lb = decode_lamb_block(t, block, buf);
  const int64_t begin = lb.begin, len = lb.len;
  float* const* s = lb.s;
  const Hyper h = t.hyper;
  const __m512 scale = _mm512_set1_ps(grad_scale);
  __m512d pp_lo = _mm512_setzero_pd(), pp_hi = pp_lo, rr_lo = pp_lo, rr_hi = pp_lo;
  for (int64_t i = 0; i < len; i += 16) {
    const __mmask16 m = lanes_below(len - i);
    const __m512 p = load16(t.param, t.param_type, begin + i, m);
    __m512 g = load16(t.grad, t.grad_type, begin + i, m);
    if (grad_scale != 1.0f) g = _mm512_mul_ps(g, scale);
    f32x16 gv = (f32x16)g;
    if (h.maximize) gv = -gv;
    const f32x16 st[2] = {(f32x16)load16_ps(s[0] + i, m), (f32x16)load16_ps(s[1] + i, m)};
    f32x16 mn, vn;
    const __m512 r = _mm512_maskz_mov_ps(m, (__m512)lamb_direction(h, gv, (f32x16)p, st, &mn, &vn));
    const __m512d p_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(p));
    const __m512d p_hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1)));
    const __m512d r_lo = _mm512_cvtps_pd(_mm512_castps512_ps256(r));
    const __m512d r_hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(r), 1)));
    // A float's square is exact in double (48 significant bits): the multiply never rounded, so a
    // fused multiply-add rounds the sum exactly as the separate add did, in one op.
    pp_lo = _mm512_fmadd_pd(p_lo, p_lo, pp_lo);
    pp_hi = _mm512_fmadd_pd(p_hi, p_hi, pp_hi);
    rr_lo = _mm512_fmadd_pd(r_lo, r_lo, rr_lo);
    rr_hi = _mm512_fmadd_pd(r_hi, r_hi, rr_hi);
  }
  alignas(64) double pp[kLambLanes], rr[kLambLanes];
  _mm512_store_pd(pp, pp_lo);
  _mm512_store_pd(pp + 8, pp_hi);
  _mm512_store_pd(rr, rr_lo);
  _mm512_store_pd(rr + 8, rr_hi);
  add_lamb_partials(pp, rr, sums);
}

}  // namespace kernels
}  // namespace lowbit
