// ATen-only optimizer step (optim_ops.h): the CompositeExplicitAutograd kernels of
// lowbit::optim_step_, optim_lamb_norms and grad_check, the test oracle of the fused kernels, and
// the path of devices without one. Per parameter: the state decoded with the reference dequantize,
// the kernels' own rules run on whole tensors (aten_float.h), the state re-encoded with the
// reference quantize, the parameter stored with the kernels' bits (stochastic rounding with their
// hash, in ATen int64 ops). On the CPU it matches the fused step bit for bit.
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../kernels/common/optim_rules.h"

#include "aten_float.h"
#include "blockwise_ops.h"
#include "optim_ops.h"
#include "optim_step_boxed.h"

namespace lowbit {
namespace ops {
namespace {

using at::Tensor;

// Unsigned shifts on int64 tensors: arithmetic shifts masked to the bits that move in.
Tensor shr(const Tensor& z, int k) { return at::bitwise_and(at::bitwise_right_shift(z, k), (int64_t(1) << (64 - k)) - 1); }

// kernels::sr_noise on int64 tensors holding 32-bit values: products wrap, masked back to 32 bits.
Tensor sr_noise(const Tensor& index, uint64_t seed) {
  const int64_t m32 = 0xFFFFFFFF;
  const auto mul32 = [&](const Tensor& x, uint32_t c) { return at::bitwise_and(at::mul(x, int64_t(c)), m32); };
  const Tensor lo = at::bitwise_xor(at::bitwise_and(index, m32), static_cast<int64_t>(seed & 0xFFFFFFFFu));
  const Tensor hi = at::bitwise_xor(shr(index, 32), static_cast<int64_t>(seed >> 32));
  Tensor x = at::bitwise_and(at::add(lo, mul32(hi, 0x9E3779B9u)), m32);
  x = at::bitwise_xor(x, shr(x, 16));
  x = mul32(x, 0x7FEB352Du);
  x = at::bitwise_xor(x, shr(x, 15));
  x = mul32(x, 0x846CA68Bu);
  x = at::bitwise_xor(x, shr(x, 16));
  return shr(x, 16);
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

// kernels::bf16_stochastic for every element of p (fp32), element i hashed with (seed, offset + i).
Tensor bf16_stochastic(const Tensor& p, uint64_t seed, int64_t offset) {
  const Tensor u = at::bitwise_and(p.view(at::kInt).to(at::kLong), int64_t(0xFFFFFFFF));
  const Tensor idx = at::arange(offset, offset + p.numel(), p.options().dtype(at::kLong));
  const Tensor noise = sr_noise(idx, seed);
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

// The fp32 bit patterns (as int64 in [0, 2^32)) of x.
Tensor f32_bits(const Tensor& x) { return at::bitwise_and(x.view(at::kInt).to(at::kLong), int64_t(0xFFFFFFFF)); }

// int64 values in [0, 2^32) as the fp32 values with those bits (int32 wraps modulo 2^32).
Tensor from_f32_bits(const Tensor& u) { return u.to(at::kInt).view(at::kFloat); }

// One parameter's values as fp32: p (its master values with a correction slot), the gradient
// times grad_mult, the decoded slots (zeros for unused ones).
struct Loaded {
  Tensor p, g;
  AtenFloat s[kernels::kMomentSlots];
};

Loaded load(const StepCall& c, const StepParam& sp, float grad_mult) {
  Loaded x;
  const bool corrected = c.num_slots > kernels::kCorrectionSlot &&
                         kernels::is_correction(c.slots[kernels::kCorrectionSlot].storage);
  x.p = corrected ? master_values(sp.param->detach().reshape(-1), sp.values[kernels::kCorrectionSlot]->reshape(-1))
                  : sp.param->detach().reshape(-1).to(at::kFloat);
  x.g = sp.grad->detach().reshape(-1).to(at::kFloat);
  if (grad_mult != 1.0f) x.g = at::mul(x.g, static_cast<double>(grad_mult));
  const int64_t n = x.p.numel();
  for (int k = 0; k < kernels::kMomentSlots; ++k) {
    const kernels::SlotType& t = c.slots[k];
    if (k >= c.num_slots || t.storage == kernels::SlotStorage::None) {
      x.s[k].t = at::zeros_like(x.p);
    } else if (t.storage == kernels::SlotStorage::Quant) {
      x.s[k].t = dequantize_reference(*sp.codes[k], *sp.absmax[k], format_name(t.format), c.block_size, {n}, at::kFloat);
    } else {
      x.s[k].t = sp.values[k]->reshape(-1).to(at::kFloat);
    }
  }
  return x;
}

void apply(kernels::Rule rule, const kernels::Hyper& h, const AtenFloat& g, AtenFloat& p, AtenFloat* s) {
  using kernels::Rule;
  switch (rule) {
    case Rule::Adam: return kernels::apply_rule<Rule::Adam>(h, g, p, s);
    case Rule::AdamW: return kernels::apply_rule<Rule::AdamW>(h, g, p, s);
    case Rule::SGD: return kernels::apply_rule<Rule::SGD>(h, g, p, s);
    case Rule::Lion: return kernels::apply_rule<Rule::Lion>(h, g, p, s);
    case Rule::RMSprop: return kernels::apply_rule<Rule::RMSprop>(h, g, p, s);
    case Rule::Adagrad: return kernels::apply_rule<Rule::Adagrad>(h, g, p, s);
    case Rule::AdEMAMix: return kernels::apply_rule<Rule::AdEMAMix>(h, g, p, s);
    case Rule::LAMB: return kernels::apply_rule<Rule::LAMB>(h, g, p, s);
  }
}

// Sum of x^2 in double in the kernels' order: element i of a block into partial sum i mod 16, a
// block's 16 partials in order, the blocks' sums as kernels::lamb_add_block_sums adds them.
double block_order_sumsq(const Tensor& x, int64_t block) {
  const int64_t n = x.numel(), nb = (n + block - 1) / block;
  Tensor padded = at::zeros({nb * block}, x.options().dtype(at::kDouble));
  padded.narrow(0, 0, n).copy_(x);
  const Tensor sq = (padded * padded).view({nb, block}).cpu();
  const double* d = sq.data_ptr<double>();
  std::vector<double> block_sums(nb);
  for (int64_t b = 0; b < nb; ++b) {
    double lanes[16] = {};
    for (int64_t i = 0; i < block; ++i) lanes[i % 16] += d[b * block + i];
    double part = 0.0;
    for (double l : lanes) part += l;
    block_sums[b] = part;
  }
  return kernels::lamb_add_block_sums(nb, [&](int64_t b) { return block_sums[b]; });
}

// LAMB's sums of p^2 and r^2 over parameter i of c, in the kernels' order, at step t.
std::array<double, 2> reference_lamb_sums(const StepCall& c, size_t i, int64_t t, float grad_mult) {
  Loaded x = load(c, c.params[i], grad_mult);
  const kernels::Hyper h = kernels::derive_hyper(c.config, t, call_lr(c));
  AtenFloat g{x.g}, m, v;
  if (h.maximize) g = -g;
  const AtenFloat r = kernels::lamb_direction(h, g, AtenFloat{x.p}, x.s, &m, &v);
  return {block_order_sumsq(x.p, c.block_size), block_order_sumsq(r.t, c.block_size)};
}

// The reference step of parameter i of c at step t; returns the blocks of quantized state that
// became non-finite. trust: LAMB's trust ratio.
int64_t reference_param_step(const StepCall& c, size_t i, int64_t t, float grad_mult, float trust) {
  const StepParam& sp = c.params[i];
  Loaded x = load(c, sp, grad_mult);
  kernels::Hyper h = kernels::derive_hyper(c.config, t, call_lr(c));
  h.trust = trust;
  AtenFloat p{x.p};
  apply(c.config.rule, h, AtenFloat{x.g}, p, x.s);
  int64_t nonfinite = 0;
  for (int k = 0; k < c.num_slots; ++k) {
    const kernels::SlotType& type = c.slots[k];
    if (type.storage == kernels::SlotStorage::None || kernels::is_correction(type.storage)) continue;
    if (type.storage == kernels::SlotStorage::Quant) {
      auto [codes, absmax] = quantize_reference_flagged(x.s[k].t, format_name(type.format), c.block_size);
      sp.codes[k]->copy_(codes);
      sp.absmax[k]->copy_(absmax);
      nonfinite += at::logical_not(at::ge(absmax, 0.0)).sum().item<int64_t>();
    } else {
      sp.values[k]->copy_(to_storage(x.s[k].t, sp.values[k]->scalar_type()).view(sp.values[k]->sizes()));
    }
  }
  at::Tensor out = sp.param->detach();
  if (c.num_slots > kernels::kCorrectionSlot && kernels::is_correction(c.slots[kernels::kCorrectionSlot].storage)) {
    store_master(p.t, out, *sp.values[kernels::kCorrectionSlot]);
  } else if (c.stochastic_round && out.scalar_type() == at::kBFloat16) {
    out.copy_(bf16_stochastic(p.t, kernels::step_seed(c.seed, t, c.refs[i].rng_key), c.refs[i].offset).view(out.sizes()));
  } else {
    out.copy_(to_storage(p.t, out.scalar_type()).view(out.sizes()));
  }
  return nonfinite;
}

void step_reference(const StepArgs& args) {
  const StepCall c = check_step_call(args, "lowbit::optim_step_");
  std::vector<size_t> all(c.params.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  reference_steps(c, all);
}

Tensor lamb_norms_reference(const StepArgs& args) {
  const StepCall c = check_step_call(args, "lowbit::optim_lamb_norms");
  const int64_t n = static_cast<int64_t>(c.params.size());
  Tensor out = at::zeros({n, 2}, at::kDouble);
  if (n == 0) return out;
  const float mult = call_grad_multiplier(c);
  for (int64_t i = 0; i < n; ++i) {
    const auto sums = reference_lamb_sums(c, static_cast<size_t>(i), (*c.params[i].counters)[0].item<int64_t>() + 1, mult);
    out[i][0] = sums[0];
    out[i][1] = sums[1];
  }
  return out.to(c.params[0].param->device());
}

std::tuple<Tensor, Tensor> grad_check_reference(at::TensorList grads, at::IntArrayRef groups, int64_t num_groups,
                                                bool want_sumsq) {
  check_grad_check_args(grads, groups, num_groups);
  const at::Device device = grads.empty() ? at::Device(at::kCPU) : grads[0].device();
  Tensor found_inf = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  Tensor sumsq = at::zeros({num_groups}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (size_t i = 0; i < grads.size(); ++i) {
    found_inf = at::maximum(found_inf, at::logical_not(at::isfinite(grads[i])).any().to(at::kFloat).reshape({1}));
    if (want_sumsq) sumsq.select(0, groups[i]).add_(grads[i].to(at::kDouble).pow(2).sum());
  }
  return {found_inf, sumsq};
}

}  // namespace

// ---- master weights (kernels/common/master_weight.h) in int64 ATen ops -------------------------

Tensor master_values(const Tensor& b, const Tensor& c) {
  const Tensor hi = at::bitwise_and(b.view(at::kShort).to(at::kLong), int64_t(0xFFFF));
  const int64_t unit = c.scalar_type() == at::kShort ? 1 : 256;
  const Tensor u = at::add(at::mul(hi, int64_t(1) << 16), at::mul(c.to(at::kLong), unit));
  return from_f32_bits(at::bitwise_and(u, int64_t(0xFFFFFFFF))).view(b.sizes());
}

void store_master(const Tensor& x_in, Tensor b, Tensor c) {
  const Tensor x = x_in.to(at::kFloat).contiguous();
  Tensor u = f32_bits(x);
  const bool m16 = c.scalar_type() == at::kShort;
  if (!m16) u = shr(at::add(u, int64_t(0x80)), 8);  // the 24-bit value q
  const int64_t half = m16 ? 0x8000 : 0x80;
  const int shift = m16 ? 16 : 8;
  Tensor hi = shr(at::add(u, half), shift);
  Tensor corr = at::sub(u, at::mul(hi, int64_t(1) << shift));
  const Tensor nan = at::isnan(x);
  const Tensor nan_bits = at::bitwise_or(at::bitwise_and(shr(f32_bits(x), 16), int64_t(0x8000)), int64_t(0x7FC0));
  hi = at::where(nan, nan_bits, hi);
  corr = at::where(nan, at::zeros_like(corr), corr);
  b.copy_(hi.to(at::kInt).to(at::kShort).view(at::kBFloat16).view(b.sizes()));
  c.copy_(corr.to(c.scalar_type()).view(c.sizes()));
}

void reference_steps(const StepCall& c, const std::vector<size_t>& which) {
  if (which.empty() || call_skipped(c)) return;
  const float mult = call_grad_multiplier(c);
  Tensor norms;
  if (c.config.rule == kernels::Rule::LAMB && c.lamb_norms) norms = c.lamb_norms->cpu();
  for (size_t i : which) {
    const StepParam& p = c.params[i];
    const int64_t t = (*p.counters)[0].item<int64_t>() + 1;
    float trust = 1.0f;
    if (c.config.rule == kernels::Rule::LAMB) {
      const auto sums = norms.defined() ? std::array<double, 2>{norms[i][0].item<double>(), norms[i][1].item<double>()}
                                        : reference_lamb_sums(c, i, t, mult);
      trust = kernels::lamb_trust(sums[0], sums[1]);
    }
    const int64_t bad = reference_param_step(c, i, t, mult, trust);
    p.counters->select(0, 0).fill_(t);
    p.counters->select(0, 1).add_(bad);
  }
}

}  // namespace ops
}  // namespace lowbit

TORCH_LIBRARY_IMPL(lowbit, CompositeExplicitAutograd, m) {
  using namespace lowbit::ops;
  m.impl("optim_step_", torch::CppFunction::makeFromBoxedFunction<&boxed_step<&step_reference>>());
  m.impl("optim_step_reference_", torch::CppFunction::makeFromBoxedFunction<&boxed_step<&step_reference>>());
  m.impl("optim_lamb_norms", torch::CppFunction::makeFromBoxedFunction<&boxed_lamb_norms<&lamb_norms_reference>>());
  m.impl("optim_lamb_norms_reference",
         torch::CppFunction::makeFromBoxedFunction<&boxed_lamb_norms<&lamb_norms_reference>>());
  m.impl("grad_check", &grad_check_reference);
  m.impl("lamb_add_block_sums", &lamb_add_block_sums_host);
}
