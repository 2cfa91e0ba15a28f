// Per-element and per-group math of integer fake quantization (QAT), shared by the CPU loops, the
// CUDA/HIP kernels and (formula for formula) the ATen reference in tensors/fake_quant_reference.cpp.
//
// Conventions, each matching torch.ao / torchao so users' numbers carry over:
//  * Everything is computed in float32, whatever the input dtype (torchao QAT's default
//    scale_precision=torch.float32); the output is rounded once, to the input dtype, at the end.
//  * Ranges: intN  -> [-2^(N-1), 2^(N-1)-1], uintN -> [0, 2^N-1], N in 2..8
//    (torchao quant_primitives._DTYPE_TO_QVALUE_BOUNDS).
//  * qparams from (min, max) of a group, torchao `choose_qparams_affine` (MappingType.SYMMETRIC /
//    ASYMMETRIC, preserve_zero=True, ZeroPointDomain.INT) and torch.ao
//    `ObserverBase._calculate_qparams`:
//      min_neg = min(min, 0), max_pos = max(max, 0)
//      symmetric:  scale = max(-min_neg, max_pos) / ((qmax - qmin) / 2); scale = max(scale, eps)
//                  zero_point = (qmin + qmax + 1) / 2 in integer division: 0 for intN, 2^(N-1)
//                  for uintN (torchao: int((quant_max + quant_min + 1) / 2); torch.ao: 128 for quint8)
//      asymmetric: scale = (max_pos - min_neg) / (qmax - qmin); scale = max(scale, eps)
//                  zero_point = clamp(qmin - round(min_neg / scale), qmin, qmax)
//    The divisions are true float32 divisions (never a multiply by a reciprocal), so every backend
//    rounds them the same way. eps defaults to FLT_EPSILON (torch.finfo(torch.float32).eps, the
//    torchao default): an all-zero group gets scale = eps and quantizes to exactly 0, never NaN.
//  * Fake quantization, torchao `_fake_quantize_affine` = quantize_affine + dequantize_affine, and
//    torch.ao `fake_quantize_per_tensor_affine_cachemask`:
//      q    = round_half_even(x * (1 / scale)) + zero_point     (note: x * inv, not x / scale)
//      mask = qmin <= q <= qmax                                 (before the clamp)
//      y    = (clamp(q, qmin, qmax) - zero_point) * scale
//  * Backward: straight-through inside the clamp range, zero outside (clipped STE):
//      dx = mask ? dy : 0                         (torchao _GenericFakeQuantize.backward)
//  * Learnable step size (LSQ, Esser et al. 2019) with LSQ+ offset (Bhalgat et al. 2020), the
//    zero point taken as a float: per element, with g the gradient scale the caller chooses
//    (LSQ: 1 / sqrt(group_numel * qmax)):
//      d scale      = g * dy * (inside ? round(x * inv) - x * inv : clamp(q) - zero_point)
//      d zero_point = g * dy * (inside ? 0 : -scale)
//    (inside the range y = round(x * inv) * scale; outside it y = (qbound - zp) * scale.)
//  * Non-finite input: a NaN gives NaN out and a zero gradient (mask 0). With dynamic qparams a
//    NaN or an Inf in a group makes that group's scale non-finite and the whole group's output NaN
//    (min/max propagate NaN like torch.amin/amax). With static qparams, +-Inf clamps to the range
//    end (mask 0). Every backend does exactly this; tests pin it (a NaN's sign and payload are left
//    open, as IEEE leaves them: ATen's vectorized max and a scalar max may return different NaNs).
#pragma once

#include <cstdint>

#include "float_convert.h"  // f32_bits, f32_from_bits
#include "host_device.h"

#if !defined(__CUDA_ARCH__) && !defined(__HIP_DEVICE_COMPILE__)
#include <cmath>
#endif

namespace lowbit {
namespace kernels {

struct FakeQuantRange {
  float qmin, qmax;
};

// qmin / qmax of intN (is_signed) or uintN. The binding checks 2 <= bits <= 8.
LOWBIT_HD FakeQuantRange fq_range(int bits, bool is_signed) {
  if (is_signed) return {-static_cast<float>(1 << (bits - 1)), static_cast<float>((1 << (bits - 1)) - 1)};
  return {0.0f, static_cast<float>((1 << bits) - 1)};
}

LOWBIT_HD bool fq_isnan(float v) { return v != v; }

// min / max that propagate NaN from either side, like at::minimum / at::maximum and torch.amin.
LOWBIT_HD float fq_min(float a, float b) { return (a < b || fq_isnan(a)) ? a : b; }
LOWBIT_HD float fq_max(float a, float b) { return (a > b || fq_isnan(a)) ? a : b; }

// Like at::clamp: NaN stays NaN.
LOWBIT_HD float fq_clamp(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Round half to even, like torch.round (default floating-point environment). On the host, the
// 2^23 trick instead of nearbyint (a libm call on baseline x86-64) so CPU loops vectorize: below
// 2^23, |v| + 2^23 rounds to an integer under round-to-nearest-even and subtracting 2^23 is exact;
// from 2^23 up (and Inf, NaN) v is its own rounding. copysign keeps -0.0 for -0.5 < v <= -0.
LOWBIT_HD float fq_round(float v) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return rintf(v);
#else
  const float a = std::fabs(v);
  return a < 0x1p23f ? std::copysign((a + 0x1p23f) - 0x1p23f, v) : v;
#endif
}

struct AffineQParams {
  float scale, zero_point;
};

// scale and zero point of a group whose smallest / largest values are mn / mx (see the header).
LOWBIT_HD AffineQParams fq_qparams(float mn, float mx, FakeQuantRange r, bool symmetric, float eps) {
  const float min_neg = fq_min(mn, 0.0f);
  const float max_pos = fq_max(mx, 0.0f);
  AffineQParams p;
  if (symmetric) {
    const float amax = fq_max(-min_neg, max_pos);
    p.scale = fq_max(amax / ((r.qmax - r.qmin) / 2.0f), eps);
    p.zero_point = static_cast<float>((static_cast<int>(r.qmin) + static_cast<int>(r.qmax) + 1) / 2);
  } else {
    p.scale = fq_max((max_pos - min_neg) / (r.qmax - r.qmin), eps);
    p.zero_point = fq_clamp(r.qmin - fq_round(min_neg / p.scale), r.qmin, r.qmax);
  }
  return p;
}

// 1 / scale, the factor every backend multiplies by (torchao: input * (1.0 / scale)).
LOWBIT_HD float fq_inv_scale(float scale) { return 1.0f / scale; }

// The unclamped integer value q = round(x * inv) + zero_point.
LOWBIT_HD float fq_unclamped(float x, float inv_scale, float zero_point) { return fq_round(x * inv_scale) + zero_point; }

// `&`, not `&&`: no branch, so CPU loops vectorize.
LOWBIT_HD bool fq_inside(float q, FakeQuantRange r) { return (q >= r.qmin) & (q <= r.qmax); }

// Fake-quantized value of x; *inside receives the STE mask bit.
LOWBIT_HD float fq_apply(float x, float scale, float inv_scale, float zero_point, FakeQuantRange r, bool* inside) {
  const float q = fq_unclamped(x, inv_scale, zero_point);
  *inside = fq_inside(q, r);
  return (fq_clamp(q, r.qmin, r.qmax) - zero_point) * scale;
}

// LSQ / LSQ+ per-element contributions to d scale and d zero_point (before the gradient scale).
struct LsqGrad {
  float dx, dscale, dzero;
};

LOWBIT_HD LsqGrad fq_lsq_grad(float dy, float x, float scale, float inv_scale, float zero_point, FakeQuantRange r) {
  const float xs = x * inv_scale;
  const float q = fq_round(xs) + zero_point;
  LsqGrad g;
  if (fq_inside(q, r)) {
    g.dx = dy;
    g.dscale = dy * (fq_round(xs) - xs);
    g.dzero = 0.0f;
  } else {
    g.dx = 0.0f;
    g.dscale = dy * (fq_clamp(q, r.qmin, r.qmax) - zero_point);
    g.dzero = dy * -scale;
  }
  return g;
}

// ---- float8 (e4m3fn, e5m2), per tensor or per row ------------------------------------------------
// torchao `choose_qparams_affine_float8` / `_quantize_affine_float8` / `_dequantize_affine_float8`:
//   scale = max(amax / fmax, eps)        (fmax: 448 for e4m3fn, 57344 for e5m2; true division;
//                                         the eps floor is ours: an all-zero row gives 0, not NaN)
//   xs    = x / scale                    (true division, as torchao writes it for float8)
//   y     = float8_round(clamp(xs, -fmax, fmax)) * scale,  mask = |xs| <= fmax
// float8_round is the cast to the float8 type, round to nearest even (torch's .to(float8_e4m3fn)).

struct Float8Format {
  int mantissa_bits;  // 3 (e4m3fn) or 2 (e5m2)
  int min_exponent;   // exponent of the smallest normal: -6 or -14
  float max_value;    // 448 or 57344
};

LOWBIT_HD Float8Format fq_float8_format(bool e4m3) {
  return e4m3 ? Float8Format{3, -6, 448.0f} : Float8Format{2, -14, 57344.0f};
}

// Nearest float8 value of v (|v| <= max_value or NaN), ties to even: v rounded at the spacing of its
// binade (or of the smallest normal binade, for subnormals). Power-of-two scalings are exact.
LOWBIT_HD float fq_float8_round(float v, Float8Format f) {
  const float a = v < 0 ? -v : v;
  int e = static_cast<int>((f32_bits(a) >> 23) & 0xFFu) - 127;
  e = e < f.min_exponent ? f.min_exponent : e;
  const float quantum = f32_from_bits(static_cast<uint32_t>(e - f.mantissa_bits + 127) << 23);
  const float r = fq_round(a / quantum) * quantum;
  return v < 0 ? -r : r;
}

LOWBIT_HD float fq_float8_scale(float amax, Float8Format f, float eps) { return fq_max(amax / f.max_value, eps); }

LOWBIT_HD float fq_float8_apply(float x, float scale, Float8Format f, bool* inside) {
  const float xs = x / scale;
  *inside = (xs >= -f.max_value) & (xs <= f.max_value);
  return fq_float8_round(fq_clamp(xs, -f.max_value, f.max_value), f) * scale;
}

// ---- block-scaled 4-bit floats (MXFP4, NVFP4) -----------------------------------------------------
// Element values: float4 e2m1 {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives (fq_float8_round with
// 1 mantissa bit, smallest normal exponent 0, max 6: the same nearest-even rounding).
//  * MX (OCP Microscaling v1.0; torchao mx_formats `to_mx`, ScaleCalculationMode.FLOOR), blocks of
//    32: shared exponent = floor(log2(amax)) - emax_elem (e2m1: 2; e4m3: 8; e5m2: 15), clamped to
//    [-127, 127], scale = 2^that (an e8m0 value); xs = x / scale, y = round(clamp(xs, +-max)) * scale.
//    amax = 0 (or subnormal) takes floor(log2) = -127, so an all-zero block gives 0.
//  * NVFP4 (torchao nvfp4_tensor `nvfp4_quantize` with a per-tensor scale), blocks of 16:
//    tensor_scale = max(amax_tensor / (448 * 6), eps); block = clamp((amax_block / 6) / tensor_scale,
//    2^-6, 448) cast to e4m3fn; total = tensor_scale * block; xs = x / total;
//    y = round_e2m1(clamp(xs, +-6)) * total.
//  A NaN or Inf in a block makes its scale and the whole block's output NaN (as for the other formats);
//  for NVFP4 one anywhere in the tensor makes the tensor scale, so the whole output, NaN.

LOWBIT_HD Float8Format fq_e2m1_format() { return Float8Format{1, 0, 6.0f}; }

// MX shared scale 2^(floor(log2(amax)) - emax) of a block (NaN for a NaN / Inf amax).
LOWBIT_HD float fq_mx_scale(float amax, int emax) {
  if (!(amax - amax == 0.0f)) return amax - amax;  // NaN or Inf: NaN
  int e = static_cast<int>((f32_bits(amax) >> 23) & 0xFFu) - 127 - emax;
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  // 2^e for e in [-127, 127]; 2^-127 is a float32 subnormal.
  return e >= -126 ? f32_from_bits(static_cast<uint32_t>(e + 127) << 23) : f32_from_bits(0x00400000u);
}

LOWBIT_HD float fq_nvfp4_tensor_scale(float amax, float eps) { return fq_max(amax / (448.0f * 6.0f), eps); }

// NVFP4 total scale of a block: tensor_scale * (the block scale rounded to e4m3fn).
LOWBIT_HD float fq_nvfp4_total_scale(float block_amax, float tensor_scale) {
  const float b = fq_clamp((block_amax / 6.0f) / tensor_scale, 0.015625f, 448.0f);
  return tensor_scale * fq_float8_round(b, fq_float8_format(true));
}

// Element of a block-scaled format: round(clamp(x / scale, +-max)) * scale, mask = |x / scale| <= max.
LOWBIT_HD float fq_block_apply(float x, float scale, Float8Format elem, bool* inside) {
  return fq_float8_apply(x, scale, elem, inside);
}

}  // namespace kernels
}  // namespace lowbit
