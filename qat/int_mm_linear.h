// The converted forward of int8 dynamic activations x int8 / int4 symmetric weights through a real
// int8 x int8 matmul (at::_int_mm), opt-in per QuantizedLinear (set_int8_matmul).
//
// Per output (m, n), with a_k = q_x[m,k] - z_x[m] (activation codes minus zero point), b_k = q_w[n,k]
// (weight codes, zero point 0), s = the token's scale, t_g = the weight group's scale:
//   A_g = sum_{k in g} a_k b_k = int_mm(q_x, q_w)_g - z_x[m] * sum_{k in g} b_k     (int32, exact)
//   y   = fl( fl( sum_g fl(float(A_g) * t_g) ) * s ) + bias                       (float32, g ascending)
// The fake-quant model computes the float matmul of x^ = fl(a_k s) and w^ = fl(b_k t_g) instead.
// Both approximate the exact S = sum_k a_k b_k s t_g; the integer sums are exact, so only where the
// scales are applied differs, and (u = 2^-24, gamma_j = j u / (1 - j u), K = in_features, G = groups
// per row)
//   |y_int8 - y_fake| <= gamma_{K+G+8} * (sum_k |a_k b_k| s t_g + |bias|)
// (float matmul: gamma_{K+1} over its K products and the bias, plus 2u for x^, w^; this path:
// u for float(A_g) above 2^24, u per product, gamma_G for the sum, u for s, u for the bias).
// Not bit for bit: the default converted forward (dequantize, float matmul) is, and stays the default.
// tests/test_qat_int_mm.cpp checks the bound over seeds and shapes.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>

#include "fake_quant_config.h"

namespace lowbit {
namespace qat {

// Whether at::_int_mm accepts [m, k] x [k, n] on CUDA (torch 2.11: m > 16, k and n positive
// multiples of 8). On the CPU it takes every shape.
bool int_mm_cuda_shape_ok(int64_t m, int64_t k, int64_t n);
// int32 [m, n] = a [m, k] x b [k, n], both int8, exactly: at::_int_mm on CUDA (where
// int_mm_cuda_shape_ok, refused otherwise); on the CPU an exact float32 / float64 matmul (same result).
at::Tensor int8_matmul(const at::Tensor& a, const at::Tensor& b);
// The same in float64 (every partial sum an integer below 2^53, so exact): the test oracle.
at::Tensor int8_matmul_reference(const at::Tensor& a, const at::Tensor& b);

// Why the int8 path cannot run this (activation, weight) config, or "" when it can: int8 signed
// per-token dynamic activations; signed symmetric integer weights (2..8 bits) in row-local groups.
std::string int_mm_config_problem(const std::optional<FakeQuantConfig>& activation, const FakeQuantConfig& weight);

// y [m, n] float32 of the formula above. x_codes: int8 [m, k] (q_x); x_scale, x_zero: float32 [m];
// w: int8 [n, k] (q_w); w_scale: float32 [n * k / group_size]; bias: float32 [n] or undefined.
at::Tensor int_mm_linear(const at::Tensor& x_codes, const at::Tensor& x_scale, const at::Tensor& x_zero,
                         const at::Tensor& w, const at::Tensor& w_scale, int64_t group_size, const at::Tensor& bias);

// Turns the int8 path on or off for every QuantizedLinear under root whose config it can run;
// returns how many it turned on.
int64_t set_int8_matmul(const std::shared_ptr<torch::nn::Module>& root, bool on = true);
int64_t set_int8_matmul(const torch::nn::Sequential& root, bool on = true);

}  // namespace qat
}  // namespace lowbit
