// ATen-only optimizer step (see reference_step.h). Every scalar is rounded to float first, as the
// kernels hold it, and every tensor op is a single IEEE operation.
#include "reference_step.h"

#include <lowbit/tensors/blockwise_ops.h>

#include <cmath>

namespace lowbit {
namespace optim {
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

// LAMB's trust ratio ||p|| / ||r||: squares summed in double per block of `block` elements, the
// block sums added in block order, as the fused kernel does.
float lamb_trust(const Tensor& p, const Tensor& r, int64_t block) {
  auto block_sums = [&](const Tensor& x) {
    const int64_t n = x.numel(), nb = (n + block - 1) / block;
    Tensor padded = at::zeros({nb * block}, x.options().dtype(at::kDouble));
    padded.narrow(0, 0, n).copy_(x);
    const Tensor sq = (padded * padded).view({nb, block}).cpu();
    double total = 0.0;
    const double* d = sq.data_ptr<double>();
    for (int64_t b = 0; b < nb; ++b) {
      double part = 0.0;
      for (int64_t i = 0; i < block; ++i) part += d[b * block + i];
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

}  // namespace

void reference_step(kernels::Rule rule, const kernels::Hyper& h, Tensor& param, const Tensor& grad,
                    ParamState& state, float grad_scale) {
  Tensor p = param.detach().reshape(-1).to(at::kFloat);
  Tensor g = grad.detach().reshape(-1).to(at::kFloat);
  if (grad_scale != 1.0f) g = tmul(g, grad_scale);
  std::vector<Tensor> s(3);
  for (size_t k = 0; k < state.slots.size(); ++k) {
    const StateSlot& slot = state.slots[k];
    if (is_quantized(slot.storage) && slot.quantized.defined()) {
      s[k] = ops::dequantize_reference(slot.quantized.codes(), slot.quantized.absmax(),
                                       format_name(slot.quantized.format()), slot.quantized.block_size(),
                                       {slot.quantized.numel()}, at::kFloat);
    } else if (slot.dense.defined()) {
      s[k] = slot.dense.reshape(-1).to(at::kFloat);
    }
  }
  for (auto& t : s)
    if (!t.defined()) t = at::zeros_like(p);
  rule_step(rule, h, p, g, s, state.block_size);
  for (size_t k = 0; k < state.slots.size(); ++k) {
    StateSlot& slot = state.slots[k];
    if (is_quantized(slot.storage) && slot.quantized.defined()) {
      const QTensor& q = slot.quantized;
      auto [codes, absmax] = ops::quantize_reference(s[k], format_name(q.format()), q.block_size());
      q.codes().copy_(codes);
      q.absmax().copy_(absmax);
    } else if (slot.dense.defined()) {
      slot.dense.copy_(s[k].view(slot.dense.sizes()));
    }
  }
  param.detach().copy_(p.view(param.sizes()));
}

}  // namespace optim
}  // namespace lowbit
