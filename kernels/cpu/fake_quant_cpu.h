// Fake-quant forward (+ bit-packed STE mask), backward and LSQ backward on the CPU (OpenMP).
#pragma once

#include "../common/fake_quant_params.h"

namespace lowbit {
namespace kernels {

void fake_quant_cpu(const FakeQuantParams& p);
void fake_quant_float8_cpu(const Float8FakeQuantParams& p);
void fake_quant_block_float_cpu(const BlockFloatParams& p);
void fake_quant_backward_cpu(const FakeQuantBackwardParams& p);
void fake_quant_lsq_backward_cpu(const LsqBackwardParams& p);

}  // namespace kernels
}  // namespace lowbit
