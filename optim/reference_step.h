// The optimizer update written with ATen ops only: the test oracle of the fused kernels, and the
// path for parameters on devices without a fused kernel. Mirrors kernels/common/optim_rules.h
// operation for operation (no fused multiply-add), so on the CPU it matches the fused step bit for
// bit, quantized state included.
#pragma once

#include <ATen/ATen.h>

#include <lowbit/kernels/common/optim_rules.h>

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

// Updates `param` (any float dtype) and `state` in place from `grad` (scaled by grad_scale).
void reference_step(kernels::Rule rule, const kernels::Hyper& h, at::Tensor& param, const at::Tensor& grad,
                    ParamState& state, float grad_scale);

}  // namespace optim
}  // namespace lowbit
