// ATen-only optimizer step (optim_ops.h): the CompositeExplicitAutograd kernel of
// lowbit::optim_step_ and grad_stats, the test oracle of the fused kernels, and the path of devices
// without one. Mirrors kernels/common/optim_rules.h operation for operation (no fused multiply-add);
// every scalar is rounded to float first, as the kernels hold it, and every tensor op is a single
// IEEE operation, so on the CPU it matches the fused step bit for bit, quantized state included.
// bf16 parameters are rounded stochastically where asked, with the kernels' hash (ATen int64 ops).
#include <torch/library.h>

#include <cmath>

#include "blockwise_ops.h"
#include "optim_ops.h"

namespace lowbit {
namespace ops {
namespace {

using at::Tensor;

Tensor tmul(const Tensor& a, float s) { return at::mul(a, static_cast<double>(s)); }
Tensor tadd(const Tensor& a, const Tensor& b) { return at::add(a, b); }
Tensor tadd(const Tensor& a, float s) { return at::add(a, static_cast<double>(s)); }
Tensor tsub(const Tensor& a, const Tensor& b) { return at::sub(a, b); }
// Correctly rounded float sqrt (as sqrtf): ATen's vectorized float sqrt is not (it differs in the
// last bit for some inputs); a double sqrt rounded to float is.
Tensor fsqrt(const Tensor& a) { return at::sqrt(a.to(at::kDouble)).to(at::kFloat); }
// s * t + u * w, rounded as the kernels do: two products, then the sum.
Tensor ema(const Tensor& s, float a, const Tensor& g, float b) { return tadd(tmul(s, a), tmul(g, b)); }

// LAMB's trust ratio ||p|| / ||r||: squares summed in double per block of `block` elements in the
// fused kernel's order (element i into partial sum i mod 16, the 16 partials added in order), the
// block sums added in block order.
float lamb_trust(const Tensor& p, const Tensor& r, int64_t block) {
  auto block_sums = [&](const Tensor& x) {
    const int64_t n = x.numel(), nb = (n + block - 1) / block;
    Tensor padded = at::zeros({nb * block}, x.options().dtype(at::kDouble));
    padded.narrow(0, 0, n).copy_(x);
    const Tensor sq = (padded * padded).view({nb, block}).cpu();
    double total = 0.0;
    const double* d = sq.data_ptr<double>();
    for (int64_t b = 0; b < nb; ++b) {
      double lanes[16] = {};
      for (int64_t i = 0; i < block; ++i) lanes[i % 16] += d[b * block + i];
      double part = 0.0;
      for (double l : lanes) part += l;
      total += part;
    }
    return total;
  };
  const double pn = std::sqrt(block_sums(p)), rn = std::sqrt(block_sums(r));
  return (pn > 0.0 && rn > 0.0) ? static_cast<float>(pn / rn) : 1.0f;
}

void rule_step(kernels::Rule rule, const kernels::Hyper& h, Tensor& p, Tensor g, std::vector<Tensor>& s,
               int64_t block) {
  using kernels::Rule;
  if (h.maximize) g = at::neg(g);
  switch (rule) {
    case Rule::Adam:
    case Rule::AdamW: {
      if (rule == Rule::AdamW) p = tmul(p, h.decay);
      else if (h.weight_decay != 0.0f) g = tadd(g, tmul(p, h.weight_decay));
      s[0] = ema(s[0], h.beta1, g, h.one_minus_beta1);
      s[1] = ema(s[1], h.beta2, at::mul(g, g), h.one_minus_beta2);
      Tensor v = s[1];
      if (h.amsgrad) {
        s[2] = at::maximum(s[2], s[1]);
        v = s[2];
      }
      const Tensor denom = tadd(tmul(fsqrt(v), h.inv_bias2_sqrt), h.eps);
      p = tsub(p, tmul(at::div(s[0], denom), h.step_size));
      return;
    }
    case Rule::SGD: {
      if (h.weight_decay != 0.0f) g = tadd(g, tmul(p, h.weight_decay));
      if (h.momentum != 0.0f) {
        s[0] = h.first_step ? g.clone() : ema(s[0], h.momentum, g, h.one_minus_dampening);
        g = h.nesterov ? tadd(g, tmul(s[0], h.momentum)) : s[0];
      }
      p = tsub(p, tmul(g, h.lr));
      return;
    }
    case Rule::Lion: {
      const Tensor c = ema(s[0], h.beta1, g, h.one_minus_beta1);
      p = tsub(tmul(p, h.decay), tmul(at::sign(c), h.lr));
      s[0] = ema(s[0], h.beta2, g, h.one_minus_beta2);
      return;
    }
    case Rule::RMSprop: {
      if (h.weight_decay != 0.0f) g = tadd(g, tmul(p, h.weight_decay));
      s[0] = ema(s[0], h.alpha, at::mul(g, g), h.one_minus_alpha);
      Tensor avg;
      if (h.centered) {
        s[2] = ema(s[2], h.alpha, g, h.one_minus_alpha);
        avg = tadd(fsqrt(at::clamp_min(tsub(s[0], at::mul(s[2], s[2])), 0.0)), h.eps);
      } else {
        avg = tadd(fsqrt(s[0]), h.eps);
      }
      if (h.momentum > 0.0f) {
        s[1] = tadd(tmul(s[1], h.momentum), at::div(g, avg));
        p = tsub(p, tmul(s[1], h.lr));
      } else {
        p = tsub(p, tmul(at::div(g, avg), h.lr));
      }
      return;
    }
    case Rule::Adagrad: {
      if (h.weight_decay != 0.0f) g = tadd(g, tmul(p, h.weight_decay));
      s[0] = tadd(s[0], at::mul(g, g));
      p = tsub(p, tmul(at::div(g, tadd(fsqrt(s[0]), h.eps)), h.step_size));
      return;
    }
    case Rule::LAMB: {
      s[0] = ema(s[0], h.beta1, g, h.one_minus_beta1);
      s[1] = ema(s[1], h.beta2, at::mul(g, g), h.one_minus_beta2);
      const Tensor denom = tadd(tmul(fsqrt(s[1]), h.inv_bias2_sqrt), h.eps);
      const Tensor r = tadd(at::div(tmul(s[0], h.inv_bias1), denom), tmul(p, h.weight_decay));
      const float step = h.lr * lamb_trust(p, r, block);
      p = tsub(p, tmul(r, step));
      return;
    }
    case Rule::AdEMAMix: {
      s[0] = ema(s[0], h.beta1, g, h.one_minus_beta1);
      s[1] = ema(s[1], h.beta3, g, h.one_minus_beta3);
      s[2] = ema(s[2], h.beta2, at::mul(g, g), h.one_minus_beta2);
      const Tensor denom = tadd(tmul(fsqrt(s[2]), h.inv_bias2_sqrt), h.eps);
      const Tensor update = at::div(tadd(tmul(s[0], h.inv_bias1), tmul(s[1], h.alpha)), denom);
      p = tsub(p, tmul(tadd(update, tmul(p, h.weight_decay)), h.lr));
      return;
    }
  }
}

// kernels::mix64 (splitmix64) on int64 tensors: multiplication wraps, and the unsigned shifts are
// arithmetic shifts masked to the bits that move in.
Tensor shr(const Tensor& z, int k) { return at::bitwise_and(at::bitwise_right_shift(z, k), (int64_t(1) << (64 - k)) - 1); }

Tensor mix64(Tensor z) {
  z = at::add(z, static_cast<int64_t>(0x9E3779B97F4A7C15ull));
  z = at::mul(at::bitwise_xor(z, shr(z, 30)), static_cast<int64_t>(0xBF58476D1CE4E5B9ull));
  z = at::mul(at::bitwise_xor(z, shr(z, 27)), static_cast<int64_t>(0x94D049BB133111EBull));
  return at::bitwise_xor(z, shr(z, 31));
}

// p (fp32) converted to dtype with the kernels' from_f32 bits, NaN included (bf16: 0x7FC0; fp16: its
// sign and 0x7E00). ATen alone does not pin a NaN down: its vectorized float-to-bf16 conversion
// writes 0xFFFF where its scalar one writes 0x7FC0, and hardware fp16 conversion keeps the payload.
Tensor to_storage(const Tensor& p, at::ScalarType dtype) {
  if (dtype == at::kFloat) return p;
  const Tensor nan = at::isnan(p);
  if (dtype == at::kHalf) return at::where(nan, at::copysign(at::full_like(p, std::nanf("")), p), p).to(at::kHalf);
  const Tensor bits = p.to(at::kBFloat16).view(at::kShort);
  return at::where(nan, at::scalar_tensor(0x7FC0, bits.options()), bits).view(at::kBFloat16);
}

// kernels::bf16_stochastic for every element of p (fp32), element i hashed with (seed, i).
Tensor bf16_stochastic(const Tensor& p, uint64_t seed) {
  const Tensor u = at::bitwise_and(p.view(at::kInt).to(at::kLong), int64_t(0xFFFFFFFF));
  const Tensor idx = at::arange(p.numel(), p.options().dtype(at::kLong));
  const Tensor noise = at::bitwise_and(mix64(at::bitwise_xor(mix64(idx), static_cast<int64_t>(seed))), int64_t(0xFFFF));
  const Tensor r = at::add(u, noise);
  const auto exponent_all_ones = [](const Tensor& b) {
    return at::eq(at::bitwise_and(b, int64_t(0x7F800000)), int64_t(0x7F800000));
  };
  Tensor bits = at::where(exponent_all_ones(r), at::bitwise_or(shr(u, 16), int64_t(0x7F7F)), shr(r, 16));
  // Inf and NaN round to nearest, as the kernel's from_f32.
  const Tensor nearest = to_storage(p, at::kBFloat16).view(at::kShort).to(at::kLong);
  bits = at::where(exponent_all_ones(u), nearest, bits);
  return bits.to(at::kInt).to(at::kShort).view(at::kBFloat16);
}

}  // namespace

int64_t reference_param_step(kernels::Rule rule, StepParam& sp, double grad_scale) {
  const float scale = static_cast<float>(grad_scale);
  Tensor p = sp.param.detach().reshape(-1).to(at::kFloat);
  Tensor g = sp.grad.detach().reshape(-1).to(at::kFloat);
  if (scale != 1.0f) g = tmul(g, scale);
  const int64_t n = p.numel();
  std::vector<Tensor> s(3);
  for (int k = 0; k < 3; ++k) {
    const StepSlot& slot = sp.slots[k];
    if (slot.kind == kSlotNone) continue;
    s[k] = slot.kind >= kSlotQuantized
               ? dequantize_reference(slot.codes, slot.absmax, format_name(slot.format), sp.block_size, {n},
                                      at::kFloat)
               : slot.values.reshape(-1).to(at::kFloat);
  }
  for (auto& t : s)
    if (!t.defined()) t = at::zeros_like(p);
  rule_step(rule, sp.hyper, p, g, s, sp.block_size);
  int64_t nonfinite = 0;
  for (int k = 0; k < 3; ++k) {
    const StepSlot& slot = sp.slots[k];
    if (slot.kind == kSlotNone) continue;
    if (slot.kind >= kSlotQuantized) {
      auto [codes, absmax] = quantize_reference_flagged(s[k], format_name(slot.format), sp.block_size);
      slot.codes.copy_(codes);
      slot.absmax.copy_(absmax);
      nonfinite += at::logical_not(at::ge(absmax, 0.0)).sum().item<int64_t>();
    } else {
      slot.values.copy_(to_storage(s[k], slot.values.scalar_type()).view(slot.values.sizes()));
    }
  }
  if (sp.stochastic_round) {
    sp.param.detach().copy_(bf16_stochastic(p, sp.seed).view(sp.param.sizes()));
  } else {
    sp.param.detach().copy_(to_storage(p, sp.param.scalar_type()).view(sp.param.sizes()));
  }
  return nonfinite;
}

at::Tensor optim_step_reference(int64_t rule, at::TensorList params, at::TensorList grads, at::TensorList states,
                          at::IntArrayRef slot_kinds, at::IntArrayRef block_sizes, at::ArrayRef<double> hyper,
                          at::IntArrayRef seeds, at::IntArrayRef flags, double grad_scale, bool scalar_loop) {
  std::vector<StepParam> ps =
      parse_step_args(rule, params, grads, states, slot_kinds, block_sizes, hyper, seeds, flags, "lowbit::optim_step_");
  at::Tensor nonfinite = at::zeros({static_cast<int64_t>(ps.size())}, at::kLong);
  int64_t* out = nonfinite.data_ptr<int64_t>();
  for (size_t i = 0; i < ps.size(); ++i) out[i] = reference_param_step(static_cast<kernels::Rule>(rule), ps[i], grad_scale);
  return nonfinite;
}

std::tuple<at::Tensor, at::Tensor> grad_stats_reference(at::TensorList grads, bool want_sumsq) {
  const int64_t n = static_cast<int64_t>(grads.size());
  at::Tensor finite = at::empty({n}, at::kBool), sumsq = at::zeros({n}, at::kDouble);
  for (int64_t i = 0; i < n; ++i) {
    finite[i] = at::isfinite(grads[i]).all().item<bool>();
    if (want_sumsq) sumsq[i] = grads[i].to(at::kDouble).pow(2).sum().item<double>();
  }
  return {finite, sumsq};
}

}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CompositeExplicitAutograd, m) {
  m.impl("optim_step_", &lowbit::ops::optim_step_reference);
  m.impl("grad_stats", &lowbit::ops::grad_stats_reference);
  m.impl("optim_step_reference_", &lowbit::ops::optim_step_reference);
}
