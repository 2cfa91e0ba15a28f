// The per-step values of an optimizer step, in two parts:
//   Hyper       what the per-element rules (optim_rules.h) read, derived from the config
//               (step_config.h), the step count t and the learning rate by derive_hyper, and
//   the call's factors: the gradient multiplier (clipping, AMP's loss scale), LAMB's trust ratio
//               and the sums behind it, the rounding seed of a step.
// They are derived where the step runs (host for the CPU, the device for GPUs), with the same IEEE
// double operations everywhere (det_math.h), so every backend derives the same bits and a step
// count or lr that lives on a device never has to visit the host. Kernel-internal: not installed.
#pragma once

#include <cmath>
#include <cstdint>

#include "det_math.h"
#include "host_device.h"
#include "step_config.h"
#include "stochastic_round.h"

namespace lowbit {
namespace kernels {

// Everything a rule reads per element: fp32, as the kernels hold it.
struct Hyper {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f, beta3 = 0.9999f;  // beta3: AdEMAMix's slow EMA
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float alpha = 0.0f;          // RMSprop smoothing; AdEMAMix mixing coefficient (scheduled)
  float momentum = 0.0f, dampening = 0.0f;
  bool nesterov = false, centered = false, amsgrad = false, maximize = false;
  bool first_step = false;     // SGD: the momentum buffer starts as the gradient
  // 1 - beta is taken in double and rounded once: 1 - 0.999f in float is 0.00099998713, a 1.3e-5
  // relative bias in the second moment.
  float one_minus_beta1 = 0.1f, one_minus_beta2 = 0.001f, one_minus_beta3 = 1e-4f;
  float one_minus_alpha = 0.01f;      // RMSprop
  float one_minus_dampening = 1.0f;   // SGD
  float step_size = 0.0f;      // Adam: lr / (1 - beta1^t); Adagrad: lr / (1 + (t-1) * lr_decay)
  // Bias corrections as reciprocals (double, rounded once): a multiply per element where torch
  // divides, the same value to within an ulp, and cheaper than a division per element.
  float inv_bias2_sqrt = 1.0f; // 1 / sqrt(1 - beta2^t)
  float inv_bias1 = 1.0f;      // 1 / (1 - beta1^t) (AdEMAMix, LAMB)
  float decay = 1.0f;          // AdamW / Lion: 1 - lr * weight_decay
  float trust = 1.0f;          // LAMB: ||p|| / ||r|| of the whole parameter (lamb_trust)
};

// The values of step t (1-based) at learning rate lr.
LOWBIT_HD Hyper derive_hyper(const StepConfig& c, int64_t t, double lr) {
  Hyper h;
  h.lr = static_cast<float>(lr);
  h.beta1 = static_cast<float>(c.beta1);
  h.beta2 = static_cast<float>(c.beta2);
  h.beta3 = static_cast<float>(c.beta3);
  h.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  h.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  h.one_minus_beta3 = static_cast<float>(1.0 - c.beta3);
  h.eps = static_cast<float>(c.eps);
  h.weight_decay = static_cast<float>(c.weight_decay);
  h.alpha = static_cast<float>(c.alpha);
  h.one_minus_alpha = static_cast<float>(1.0 - c.alpha);
  h.momentum = static_cast<float>(c.momentum);
  h.dampening = static_cast<float>(c.dampening);
  h.one_minus_dampening = static_cast<float>(1.0 - c.dampening);
  h.nesterov = c.nesterov;
  h.centered = c.centered;
  h.amsgrad = c.amsgrad;
  h.maximize = c.maximize;
  h.first_step = t == 1;
  h.decay = static_cast<float>(1.0 - lr * c.weight_decay);
  switch (c.rule) {
    case Rule::Adam:
    case Rule::AdamW:
    case Rule::LAMB:
    case Rule::AdEMAMix: {
      const double bc1 = 1.0 - det_pow_int(c.beta1, t);
      h.inv_bias1 = static_cast<float>(1.0 / bc1);
      h.step_size = static_cast<float>(lr / bc1);
      h.inv_bias2_sqrt = static_cast<float>(1.0 / sqrt(1.0 - det_pow_int(c.beta2, t)));
      break;
    }
    case Rule::Adagrad:
      h.step_size = static_cast<float>(lr / (1.0 + static_cast<double>(t - 1) * c.lr_decay));
      break;
    default: break;
  }
  if (c.rule == Rule::AdEMAMix && c.t_alpha_beta3 > 0) {
    // The paper's warm-up (Pagliardini et al., arXiv 2409.03137): alpha rises linearly; beta3
    // follows the schedule that makes the slow EMA's half-life grow linearly from beta1's to beta3's.
    const double frac_raw = static_cast<double>(t) / static_cast<double>(c.t_alpha_beta3);
    const double frac = frac_raw < 1.0 ? frac_raw : 1.0;
    const double lb1 = det_log(c.beta1), lb3 = det_log(c.beta3);
    double beta3 = det_exp(lb1 * lb3 / ((1.0 - frac) * lb3 + frac * lb1));
    beta3 = beta3 < c.beta3 ? beta3 : c.beta3;
    h.alpha = static_cast<float>(frac * c.alpha);
    h.beta3 = static_cast<float>(beta3);
    h.one_minus_beta3 = static_cast<float>(1.0 - beta3);
  }
  return h;
}

// The factor every gradient element is multiplied by as it is read: torch.nn.utils.clip_grad_norm_'s
// max_norm / (norm + 1e-6) where that is below 1 (max_norm > 0; sumsq the squared norm of the
// gradients that clipping covers), over an AMP loss scale when one is given (the gradients are
// scale times the true ones; sumsq is of the scaled gradients). 1 when neither applies.
LOWBIT_HD float grad_multiplier(double max_norm, double sumsq, double loss_scale) {
  double coef = 1.0;
  if (max_norm > 0.0) {
    const double c = max_norm / (sqrt(sumsq) / loss_scale + 1e-6);
    if (c < 1.0) coef = c;
  }
  return static_cast<float>(coef / loss_scale);
}

// LAMB's trust ratio from the whole parameter's sums of p^2 and r^2 (1 where either is 0).
LOWBIT_HD float lamb_trust(double sum_p2, double sum_r2) {
  const double pn = sqrt(sum_p2), rn = sqrt(sum_r2);
  return (pn > 0.0 && rn > 0.0) ? static_cast<float>(pn / rn) : 1.0f;
}

// The order in which LAMB adds a parameter's block sums (each the sum over one state block, its
// element i into partial i mod 16, the 16 partials in order), on every backend: the blocks in
// groups of kLambSumGroup, each group's sums added in block order, then the groups' sums in order.
// Fixed by the block count alone, so the bits never depend on threads or ranks; and a GPU adds
// the groups in parallel where one chain of every block's sum costs an add's latency per block
// (1.9 ms for the 2^18 blocks of a 2^24-element parameter with blocks of 64, H100). A parameter
// of at most kLambSumGroup blocks adds them in one chain.
constexpr int64_t kLambSumGroup = 256;

// block_sum(b) for b in [0, n): the sum in LAMB's order.
template <typename BlockSum>
LOWBIT_HD double lamb_add_block_sums(int64_t n, BlockSum block_sum) {
  double total = 0.0;
  for (int64_t first = 0; first < n; first += kLambSumGroup) {
    const int64_t end = first + kLambSumGroup < n ? first + kLambSumGroup : n;
    double group = 0.0;
    for (int64_t b = first; b < end; ++b) group += block_sum(b);
    total += group;
  }
  return total;
}

// The same over interleaved pairs, sums[2 b] = block b's sum of p^2 and sums[2 b + 1] its sum of
// r^2 (how the CPU kernel and the sharded optimizer hold them): out[0] and out[1].
// A functor, not a host lambda: nvcc warns (20013) where a __host__ __device__ template calls one.
struct BlockSumOfPair {
  const double* sums;
  int k;  // 0: p^2, 1: r^2
  LOWBIT_HD double operator()(int64_t b) const { return sums[2 * b + k]; }
};

inline void lamb_add_block_sum_pairs(const double* sums, int64_t n, double* out) {
  out[0] = lamb_add_block_sums(n, BlockSumOfPair{sums, 0});
  out[1] = lamb_add_block_sums(n, BlockSumOfPair{sums, 1});
}

// The stochastic-rounding seed of one parameter at step t: a hash of the optimizer's seed, the
// step and the parameter's key (its place in the optimizer), so every step draws fresh noise and
// a resumed run (seed and step in the checkpoint) draws the same.
LOWBIT_HD uint64_t step_seed(uint64_t seed, int64_t t, int64_t key) {
  return mix64(seed ^ mix64(static_cast<uint64_t>(t) * 1000003u + static_cast<uint64_t>(key)));
}

}  // namespace kernels
}  // namespace lowbit
