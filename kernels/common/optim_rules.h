// The per-element update rule of every optimizer, in fp32: templates over the float type, run by the
// CPU loops (a float, and 16 lanes at a time as a vector with AVX-512), the GPU kernels, and the
// ATen reference (tensors/aten_float.h: a tensor as the float type). Written as separate IEEE
// operations (the build turns off fma contraction) so every backend rounds identically. Semantics
// follow torch.optim; the bias corrections are multiplied as reciprocals (step_config.h: Hyper).
// Kernel-internal: no public header includes this one.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"
#include "step_config.h"
#include "step_values.h"

namespace lowbit {
namespace kernels {

// Element-wise helpers the rules use, for a float. The rules are templates over the float type;
// another type brings its own overloads: a class, found by argument lookup (tensors/aten_float.h),
// or a vector type (no namespace to look in), declared before this header
// (kernels/cpu/x86/vec16.h). vmax(a, b) is a > b ? a : b (what x86's max instruction does).
LOWBIT_HD float vsqrt(float x) { return sqrtf(x); }
LOWBIT_HD float vmax(float a, float b) { return a > b ? a : b; }
LOWBIT_HD float sign_of(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f); }

// How a rule divides and takes square roots. ExactArith: the IEEE operations, on every backend.
// A GPU kernel passes its own (kernels/cuda/speculative_arith.cuh), which reaches the same
// correctly rounded values by a shorter route where the operands allow it and records where they
// did not, so the caller can redo those elements with ExactArith. Every rule takes one as its last
// argument (ExactArith when left out).
struct ExactArith {
  template <typename F>
  LOWBIT_RULE F div(F a, F b) const { return a / b; }
  template <typename F>
  LOWBIT_RULE F sqrt(F x) const { return vsqrt(x); }
};

// torch.optim.Adam / AdamW. s[0] = exp_avg, s[1] = exp_avg_sq, s[2] = max_exp_avg_sq (amsgrad).
// AMSGRAD false: a caller that carries no slot 2 (h.amsgrad is then false too) drops the test.
template <typename F, bool AMSGRAD = true, typename Ar = ExactArith>
LOWBIT_RULE void adam(const Hyper& h, bool decoupled, F g, F& p, F* s, Ar&& ar = Ar{}) {
  if (decoupled) {
    p = p * h.decay;
  } else if (h.weight_decay != 0.0f) {
    g = g + h.weight_decay * p;
  }
  s[0] = s[0] * h.beta1 + h.one_minus_beta1 * g;
  s[1] = s[1] * h.beta2 + h.one_minus_beta2 * (g * g);
  F v = s[1];
  if (AMSGRAD && h.amsgrad) {
    s[2] = vmax(s[2], s[1]);
    v = s[2];
  }
  const F denom = ar.sqrt(v) * h.inv_bias2_sqrt + h.eps;
  p = p - h.step_size * ar.div(s[0], denom);
}

// torch.optim.SGD. s[0] = momentum_buffer.
template <typename F>
LOWBIT_RULE void sgd(const Hyper& h, F g, F& p, F* s) {
  if (h.weight_decay != 0.0f) g = g + h.weight_decay * p;
  if (h.momentum != 0.0f) {
    s[0] = h.first_step ? g : s[0] * h.momentum + h.one_minus_dampening * g;
    g = h.nesterov ? g + h.momentum * s[0] : s[0];
  }
  p = p - h.lr * g;
}

// Lion (Chen et al., arXiv 2302.06675). s[0] = exp_avg.
template <typename F>
LOWBIT_RULE void lion(const Hyper& h, F g, F& p, F* s) {
  const F c = s[0] * h.beta1 + h.one_minus_beta1 * g;
  p = p * h.decay - h.lr * sign_of(c);
  s[0] = s[0] * h.beta2 + h.one_minus_beta2 * g;
}

// torch.optim.RMSprop. s[0] = square_avg, s[1] = momentum_buffer, s[2] = grad_avg (centered).
template <typename F, typename Ar = ExactArith>
LOWBIT_RULE void rmsprop(const Hyper& h, F g, F& p, F* s, Ar&& ar = Ar{}) {
  if (h.weight_decay != 0.0f) g = g + h.weight_decay * p;
  s[0] = s[0] * h.alpha + h.one_minus_alpha * (g * g);
  F avg;
  if (h.centered) {
    s[2] = s[2] * h.alpha + h.one_minus_alpha * g;
    // Variance estimate, clamped at 0: with quantized state the two averages are rounded
    // independently and their difference can dip below zero, where torch would take sqrt of a
    // negative number and write NaN into the parameter.
    const F var = s[0] - s[2] * s[2];
    avg = ar.sqrt(vmax(var, F{})) + h.eps;
  } else {
    avg = ar.sqrt(s[0]) + h.eps;
  }
  if (h.momentum > 0.0f) {
    s[1] = s[1] * h.momentum + ar.div(g, avg);
    p = p - h.lr * s[1];
  } else {
    p = p - h.lr * ar.div(g, avg);
  }
}

// torch.optim.Adagrad. s[0] = sum. step_size = lr / (1 + (t-1) * lr_decay).
template <typename F, typename Ar = ExactArith>
LOWBIT_RULE void adagrad(const Hyper& h, F g, F& p, F* s, Ar&& ar = Ar{}) {
  if (h.weight_decay != 0.0f) g = g + h.weight_decay * p;
  s[0] = s[0] + g * g;
  p = p - h.step_size * ar.div(g, ar.sqrt(s[0]) + h.eps);
}

// AdEMAMix (Pagliardini et al., arXiv 2409.03137). s[0] = fast EMA m1, s[1] = slow EMA m2,
// s[2] = nu. alpha and beta3 arrive already scheduled for this step.
template <typename F, typename Ar = ExactArith>
LOWBIT_RULE void ademamix(const Hyper& h, F g, F& p, F* s, Ar&& ar = Ar{}) {
  s[0] = s[0] * h.beta1 + h.one_minus_beta1 * g;
  s[1] = s[1] * h.beta3 + h.one_minus_beta3 * g;
  s[2] = s[2] * h.beta2 + h.one_minus_beta2 * (g * g);
  const F denom = ar.sqrt(s[2]) * h.inv_bias2_sqrt + h.eps;
  const F update = ar.div(s[0] * h.inv_bias1 + h.alpha * s[1], denom);
  p = p - h.lr * (update + h.weight_decay * p);
}

// LAMB (You et al., arXiv 1904.00962). s[0] = exp_avg, s[1] = exp_avg_sq. The update direction
// r = m_hat / (sqrt(v_hat) + eps) + wd * p is scaled by the layer's trust ratio ||p|| / ||r||,
// which needs the whole parameter: lamb_direction runs first (state untouched) to get the norms.
template <typename F, typename Ar = ExactArith>
LOWBIT_RULE F lamb_direction(const Hyper& h, F g, F p, const F* s, F* m_new, F* v_new, Ar&& ar = Ar{}) {
  *m_new = s[0] * h.beta1 + h.one_minus_beta1 * g;
  *v_new = s[1] * h.beta2 + h.one_minus_beta2 * (g * g);
  const F denom = ar.sqrt(*v_new) * h.inv_bias2_sqrt + h.eps;
  return ar.div(*m_new * h.inv_bias1, denom) + h.weight_decay * p;
}

template <typename F, typename Ar = ExactArith>
LOWBIT_RULE void lamb(const Hyper& h, F g, F& p, F* s, Ar&& ar = Ar{}) {
  F m, v;
  const F r = lamb_direction(h, g, p, s, &m, &v, ar);
  s[0] = m;
  s[1] = v;
  p = p - (h.lr * h.trust) * r;
}

// One element (or one vector of elements) of rule R. `maximize` flips the gradient first.
// SLOT2: whether the caller carries a third slot (a GPU kernel compiled for fewer leaves it out).
template <Rule R, typename F, bool SLOT2 = true, typename Ar = ExactArith>
LOWBIT_RULE void apply_rule(const Hyper& h, F g, F& p, F* s, Ar&& ar = Ar{}) {
  if (h.maximize) g = -g;
  switch (R) {
    case Rule::Adam: adam<F, SLOT2>(h, false, g, p, s, ar); break;
    case Rule::AdamW: adam<F, SLOT2>(h, true, g, p, s, ar); break;
    case Rule::SGD: sgd(h, g, p, s); break;
    case Rule::Lion: lion(h, g, p, s); break;
    case Rule::RMSprop: rmsprop(h, g, p, s, ar); break;
    case Rule::Adagrad: adagrad(h, g, p, s, ar); break;
    case Rule::AdEMAMix: ademamix(h, g, p, s, ar); break;
    case Rule::LAMB: lamb(h, g, p, s, ar); break;
  }
}

}  // namespace kernels
}  // namespace lowbit
