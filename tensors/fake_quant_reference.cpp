// The reference fake-quant ops, written with ATen ops only, formula for formula as
// kernels/common/fake_quant_math.h. They are the test oracle and the CompositeExplicitAutograd
// kernels that serve any device without a dedicated one; the code ops of convert() live only here.
#include <torch/library.h>

#include "../kernels/common/fake_quant_math.h"  // fq_range

#include "blockwise_ops.h"  // first_true, pack_nibbles
#include "fake_quant_ops.h"
#include "float_code_tensors.h"  // round_to_float_format: the rounding convert() stores too

namespace lowbit {
namespace ops {
namespace {

// Every code of `codes` (uint8) within `bits` bits (one wait for a device: convert() runs once).
void check_codes_fit(const at::Tensor& codes, int64_t bits, const char* op) {
  if (bits >= 8 || codes.is_meta()) return;
  const at::Tensor flat = codes.reshape(-1);
  const int64_t i = first_true(at::bitwise_right_shift(flat, bits).ne(0));
  TORCH_CHECK(i < 0, op, ": codes[", i, "] is ", flat[i].item<int64_t>(), "; codes of ", bits,
              " bits are in [0, ", (int64_t(1) << bits) - 1, "]");
}

// A float32 tensor like `t` filled with v: dividing by a tensor (not a Scalar) keeps a true
// division on every device (CUDA turns division by a CPU scalar into a multiply by its reciprocal).
at::Tensor full_as(const at::Tensor& t, double v) { return at::full_like(t, v, t.options().dtype(at::kFloat)); }

// Packs a bool tensor of n elements into (n + 7) / 8 bytes, element i at bit i % 8 of byte i / 8.
at::Tensor pack_mask(const at::Tensor& inside) {
  const int64_t n = inside.numel();
  at::Tensor flat = inside.reshape(-1).to(at::kByte);
  const int64_t padded = mask_bytes(n) * 8;
  if (padded != n) flat = at::cat({flat, at::zeros({padded - n}, flat.options())});
  const at::Tensor weights = at::pow(2, at::arange(8, flat.options().dtype(at::kLong)));
  return (flat.view({-1, 8}).to(at::kLong) * weights).sum(1).to(at::kByte);
}

at::Tensor unpack_mask(const at::Tensor& mask, int64_t n) {
  const at::Tensor shifts = at::arange(8, mask.options().dtype(at::kLong));
  const at::Tensor bits = at::bitwise_and(at::bitwise_right_shift(mask.to(at::kLong).unsqueeze(1), shifts), 1);
  return bits.view(-1).narrow(0, 0, n).to(at::kBool);
}

// (output, mask) of x [ngroups, G] (float32) with per-group scale, zero point.
std::tuple<at::Tensor, at::Tensor> apply(const at::Tensor& xf, const at::Tensor& scale, const at::Tensor& zp,
                                         kernels::FakeQuantRange r) {
  const at::Tensor inv = at::reciprocal(scale).unsqueeze(1);
  const at::Tensor q = at::round(xf * inv) + zp.unsqueeze(1);
  const at::Tensor inside = at::logical_and(q >= r.qmin, q <= r.qmax);
  const at::Tensor y = (at::clamp(q, r.qmin, r.qmax) - zp.unsqueeze(1)) * scale.unsqueeze(1);
  return {y, inside};
}

// The qparams of ranges [min, max], checked by the caller; a NaN bound gives NaN qparams (the
// dynamic op's group that holds NaN or Inf turns NaN, as torchao's does).
std::tuple<at::Tensor, at::Tensor> qparams_of(const at::Tensor& min, const at::Tensor& max, int64_t bits,
                                              bool is_signed, bool symmetric, double eps) {
  const kernels::FakeQuantRange r = kernels::fq_range(int(bits), is_signed);
  const at::Tensor mn = min.to(at::kFloat), mx = max.to(at::kFloat);
  const at::Tensor zero = at::zeros_like(mn);
  const at::Tensor min_neg = at::minimum(mn, zero);
  const at::Tensor max_pos = at::maximum(mx, zero);
  const at::Tensor eps_t = full_as(mn, eps);
  if (symmetric) {
    const at::Tensor amax = at::maximum(-min_neg, max_pos);
    const at::Tensor scale = at::maximum(amax / full_as(mn, (r.qmax - r.qmin) / 2), eps_t);
    const double zp = double((int64_t(r.qmin) + int64_t(r.qmax) + 1) / 2);
    return {scale, full_as(mn, zp)};
  }
  const at::Tensor scale = at::maximum((max_pos - min_neg) / full_as(mn, r.qmax - r.qmin), eps_t);
  const at::Tensor zp = at::clamp(r.qmin - at::round(min_neg / scale), r.qmin, r.qmax);
  return {scale, zp};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fake_quant_qparams_reference(const at::Tensor& min, const at::Tensor& max,
                                                                int64_t bits, bool is_signed, bool symmetric,
                                                                double eps) {
  const char* op = "lowbit::fake_quant_qparams";
  TORCH_CHECK(bits >= 2 && bits <= 8, op, ": bits must be in [2, 8], got ", bits);
  check_eps(eps, op);
  TORCH_CHECK(min.sizes() == max.sizes(), op, ": min ", min.sizes(), " and max ", max.sizes(), " differ in shape");
  if (!min.is_meta() && !max.is_meta()) {
    // An observer's range: NaN or min > max has no scale (one wait for a device: observers run once
    // per calibration batch, not per element).
    const int64_t i = first_true((min > max) | min.isnan() | max.isnan());
    TORCH_CHECK(i < 0, op, ": min[", i, "] = ", min.reshape(-1)[i].item<double>(), " and max[", i,
                "] = ", max.reshape(-1)[i].item<double>(), "; need min <= max, neither NaN");
  }
  return qparams_of(min, max, bits, is_signed, symmetric, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fake_quant_dynamic_reference(
    const at::Tensor& input, int64_t group_size, int64_t bits, bool is_signed, bool symmetric, double eps) {
  const char* op = "lowbit::fake_quant_dynamic";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  check_eps(eps, op);
  const auto fopts = a.input.options().dtype(at::kFloat);
  if (a.ngroups == 0) {
    return {at::empty_like(a.input), at::zeros({0}, fopts.dtype(at::kByte)), at::empty({0}, fopts),
            at::empty({0}, fopts)};
  }
  const at::Tensor xf = a.input.reshape({a.ngroups, a.group_size}).to(at::kFloat);
  auto [scale, zp] = qparams_of(xf.amin(1), xf.amax(1), bits, is_signed, symmetric, eps);
  auto [y, inside] = apply(xf, scale, zp, kernels::fq_range(a.bits, a.is_signed));
  return {y.to(input.scalar_type()).view(input.sizes()), pack_mask(inside), scale, zp};
}

std::tuple<at::Tensor, at::Tensor> fake_quant_static_reference(const at::Tensor& input, const at::Tensor& scale,
                                                               const at::Tensor& zero_point, int64_t group_size,
                                                               int64_t bits, bool is_signed) {
  const char* op = "lowbit::fake_quant_static";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  auto [s, z] = check_qparams(a, scale, zero_point, op);
  if (a.ngroups == 0) return {at::empty_like(a.input), at::zeros({0}, a.input.options().dtype(at::kByte))};
  const at::Tensor xf = a.input.reshape({a.ngroups, a.group_size}).to(at::kFloat);
  auto [y, inside] = apply(xf, s, z, kernels::fq_range(a.bits, a.is_signed));
  return {y.to(input.scalar_type()).view(input.sizes()), pack_mask(inside)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_float8_reference(const at::Tensor& input, int64_t group_size,
                                                                          std::string_view format, double eps) {
  const char* op = "lowbit::fake_quant_float8";
  const bool e4m3 = parse_float8_format(format, op);
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, 8, true, op);
  check_eps(eps, op);
  const auto fopts = a.input.options().dtype(at::kFloat);
  if (a.ngroups == 0) return {at::empty_like(a.input), at::zeros({0}, fopts.dtype(at::kByte)), at::empty({0}, fopts)};
  const double fmax = e4m3 ? 448.0 : 57344.0;
  const at::Tensor xf = a.input.reshape({a.ngroups, a.group_size}).to(at::kFloat);
  const at::Tensor amax = xf.abs().amax(1);
  const at::Tensor scale = at::maximum(amax / full_as(amax, fmax), full_as(amax, eps));
  const at::Tensor xs = xf / scale.unsqueeze(1);
  const at::Tensor inside = xs.abs() <= fmax;
  const at::Tensor cast = at::clamp(xs, -fmax, fmax).to(e4m3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2).to(at::kFloat);
  const at::Tensor y = cast * scale.unsqueeze(1);
  return {y.to(input.scalar_type()).view(input.sizes()), pack_mask(inside), scale};
}


std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_block_float_reference(const at::Tensor& input,
                                                                               std::string_view format, double eps) {
  const char* op = "lowbit::fake_quant_block_float";
  const BlockFloatFormat f = parse_block_float_format(format, op);
  const FakeQuantArgs a = check_block_float_args(input, f, eps, op);
  const auto fopts = a.input.options().dtype(at::kFloat);
  if (a.ngroups == 0) return {at::empty_like(a.input), at::zeros({0}, fopts.dtype(at::kByte)), at::empty({0}, fopts)};
  const at::Tensor xf = a.input.reshape({a.ngroups, f.block}).to(at::kFloat);
  const at::Tensor amax = xf.abs().amax(1);
  at::Tensor scale;
  if (f.nvfp4) {
    const at::Tensor tamax = xf.abs().amax().reshape({1});
    const at::Tensor ts = at::maximum(tamax / full_as(tamax, 448.0 * 6.0), full_as(tamax, eps));
    const at::Tensor b = at::clamp((amax / full_as(amax, 6.0)) / ts, 0.015625, 448.0);
    scale = ts * b.to(at::kFloat8_e4m3fn).to(at::kFloat);
  } else {
    at::Tensor e = at::bitwise_and(at::bitwise_right_shift(amax.view(at::kInt), 23), 0xFF) - 127 - f.mx_emax;
    e = at::clamp(e, -127, 127);
    const at::Tensor pow2 = at::where(e >= -126, at::bitwise_left_shift(at::clamp_min(e, -126) + 127, 23).to(at::kInt),
                                      at::full_like(e, 0x00400000)).view(at::kFloat);
    scale = at::where(at::isfinite(amax), pow2, at::full_like(amax, NAN));
  }
  const at::Tensor xs = xf / scale.unsqueeze(1);
  const at::Tensor inside = at::logical_and(xs >= -f.max, xs <= f.max);
  const at::Tensor c = at::clamp(xs, -f.max, f.max);
  const at::Tensor r = f.mantissa_bits == 1 ? round_to_float_format(c, kernels::Float8Format{f.mantissa_bits, f.min_exponent, f.max})
                                             : c.to(f.mantissa_bits == 3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2).to(at::kFloat);
  const at::Tensor y = r * scale.unsqueeze(1);
  return {y.to(input.scalar_type()).view(input.sizes()), pack_mask(inside), scale};
}

at::Tensor fake_quant_backward_reference(const at::Tensor& grad, const at::Tensor& mask) {
  const at::Tensor m = check_mask(grad, mask, "lowbit::fake_quant_backward");
  if (grad.numel() == 0) return at::empty_like(grad, at::MemoryFormat::Contiguous);
  const at::Tensor inside = unpack_mask(m, grad.numel()).view(grad.sizes());
  return at::where(inside, grad, at::zeros_like(grad)).contiguous();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quant_lsq_backward_reference(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
    int64_t group_size, int64_t bits, bool is_signed, double grad_factor) {
  const char* op = "lowbit::fake_quant_lsq_backward";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  auto [s, z] = check_qparams(a, scale, zero_point, op);
  TORCH_CHECK(grad.sizes() == input.sizes() && grad.scalar_type() == input.scalar_type(), op, ": grad (",
              grad.sizes(), ", ", grad.scalar_type(), ") must match input (", input.sizes(), ", ",
              input.scalar_type(), ")");
  if (a.ngroups == 0) return {at::empty_like(a.input), at::zeros_like(s), at::zeros_like(z)};
  const kernels::FakeQuantRange r = kernels::fq_range(a.bits, a.is_signed);
  const at::Tensor xf = a.input.reshape({a.ngroups, a.group_size}).to(at::kFloat);
  const at::Tensor dy = grad.contiguous().reshape({a.ngroups, a.group_size}).to(at::kFloat);
  const at::Tensor xs = xf * at::reciprocal(s).unsqueeze(1);
  const at::Tensor rounded = at::round(xs);
  const at::Tensor q = rounded + z.unsqueeze(1);
  const at::Tensor inside = at::logical_and(q >= r.qmin, q <= r.qmax);
  const at::Tensor zeros = at::zeros_like(dy);
  const at::Tensor dx = at::where(inside, dy, zeros);
  const at::Tensor ds = dy * at::where(inside, rounded - xs, at::clamp(q, r.qmin, r.qmax) - z.unsqueeze(1));
  const at::Tensor dz = at::where(inside, zeros, dy * (-s).unsqueeze(1));
  const at::Tensor gs = ds.to(at::kDouble).sum(1).to(at::kFloat) * full_as(s, grad_factor);
  const at::Tensor gz = dz.to(at::kDouble).sum(1).to(at::kFloat) * full_as(z, grad_factor);
  return {dx.to(input.scalar_type()).view(input.sizes()), gs, gz};
}

at::Tensor quantize_codes_reference(const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
                                    int64_t group_size, int64_t bits, bool is_signed) {
  const char* op = "lowbit::quantize_codes";
  const FakeQuantArgs a = check_fake_quant_args(input, group_size, bits, is_signed, op);
  auto [s, z] = check_qparams(a, scale, zero_point, op);
  // A meta tensor has no values to check (shape inference, torch.compile).
  TORCH_CHECK(a.input.is_meta() || at::isfinite(a.input).all().item<bool>(), op,
              ": input holds NaN or Inf; codes cannot represent them");
  if (a.ngroups == 0) return at::empty(input.sizes(), a.input.options().dtype(at::kByte));
  const kernels::FakeQuantRange r = kernels::fq_range(a.bits, a.is_signed);
  const at::Tensor xf = a.input.reshape({a.ngroups, a.group_size}).to(at::kFloat);
  const at::Tensor q = at::clamp(at::round(xf * at::reciprocal(s).unsqueeze(1)) + z.unsqueeze(1), r.qmin, r.qmax);
  return (q - r.qmin).to(at::kByte).view(input.sizes());
}

at::Tensor dequantize_codes_reference(const at::Tensor& codes, const at::Tensor& scale, const at::Tensor& zero_point,
                                      int64_t group_size, int64_t bits, bool is_signed, at::ScalarType dtype) {
  const char* op = "lowbit::dequantize_codes";
  TORCH_CHECK(codes.scalar_type() == at::kByte, op, ": codes must be uint8, got ", codes.scalar_type());
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble, op,
              ": dtype must be a floating type, got ", dtype);
  TORCH_CHECK(bits >= 2 && bits <= 8, op, ": bits must be in [2, 8], got ", bits);
  TORCH_CHECK(group_size >= 1 && codes.numel() % group_size == 0, op, ": group_size ", group_size,
              " does not divide the ", codes.numel(), " codes");
  const int64_t ngroups = codes.numel() / group_size;
  TORCH_CHECK(scale.numel() == ngroups && zero_point.numel() == ngroups, op, ": scale and zero_point need ", ngroups,
              " values, got ", scale.numel(), " and ", zero_point.numel());
  if (ngroups == 0) return at::empty(codes.sizes(), codes.options().dtype(dtype));
  check_qparam_values(scale.to(at::kFloat), zero_point.to(at::kFloat), int(bits), is_signed, op);
  check_codes_fit(codes, bits, op);
  const kernels::FakeQuantRange r = kernels::fq_range(int(bits), is_signed);
  const at::Tensor q = codes.reshape({ngroups, group_size}).to(at::kFloat) + r.qmin;
  const at::Tensor y = (q - zero_point.to(at::kFloat).view({-1, 1})) * scale.to(at::kFloat).view({-1, 1});
  return y.to(dtype).view(codes.sizes());
}

at::Tensor pack_codes_reference(const at::Tensor& codes, int64_t bits) {
  TORCH_CHECK(codes.scalar_type() == at::kByte, "lowbit::pack_codes: codes must be uint8, got ", codes.scalar_type());
  TORCH_CHECK(bits >= 2 && bits <= 8, "lowbit::pack_codes: bits must be in [2, 8], got ", bits);
  const at::Tensor flat = codes.contiguous().view(-1);
  // A code of more bits would spill into its neighbour's half of the byte.
  check_codes_fit(flat, bits, "lowbit::pack_codes");
  return bits > 4 ? flat.clone() : pack_nibbles(flat);
}

at::Tensor unpack_codes_reference(const at::Tensor& packed, int64_t bits, int64_t numel) {
  TORCH_CHECK(packed.scalar_type() == at::kByte, "lowbit::unpack_codes: packed must be uint8, got ",
              packed.scalar_type());
  TORCH_CHECK(bits >= 2 && bits <= 8, "lowbit::unpack_codes: bits must be in [2, 8], got ", bits);
  TORCH_CHECK(numel >= 0, "lowbit::unpack_codes: numel must be >= 0, got ", numel);
  const int64_t want = bits > 4 ? numel : (numel + 1) / 2;
  TORCH_CHECK(packed.numel() == want, "lowbit::unpack_codes: numel ", numel, " (codes of ", bits, " bits) needs ", want,
              " packed bytes, got ", packed.numel());
  const at::Tensor flat = packed.contiguous().view(-1);
  return bits > 4 ? flat.clone() : unpack_nibbles(flat, numel).contiguous();
}

}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CompositeExplicitAutograd, m) {
  using namespace lowbit::ops;
  m.impl("fake_quant_dynamic", &fake_quant_dynamic_reference);
  m.impl("fake_quant_static", &fake_quant_static_reference);
  m.impl("fake_quant_float8", &fake_quant_float8_reference);
  m.impl("fake_quant_float8_reference", &fake_quant_float8_reference);
  m.impl("fake_quant_block_float", &fake_quant_block_float_reference);
  m.impl("fake_quant_block_float_reference", &fake_quant_block_float_reference);
  m.impl("fake_quant_backward", &fake_quant_backward_reference);
  m.impl("fake_quant_lsq_backward", &fake_quant_lsq_backward_reference);
  m.impl("fake_quant_qparams", &fake_quant_qparams_reference);
  m.impl("quantize_codes", &quantize_codes_reference);
  m.impl("dequantize_codes", &dequantize_codes_reference);
  m.impl("pack_codes", &pack_codes_reference);
  m.impl("unpack_codes", &unpack_codes_reference);
  m.impl("fake_quant_dynamic_reference", &fake_quant_dynamic_reference);
  m.impl("fake_quant_static_reference", &fake_quant_static_reference);
  m.impl("fake_quant_backward_reference", &fake_quant_backward_reference);
  m.impl("fake_quant_lsq_backward_reference", &fake_quant_lsq_backward_reference);
}
