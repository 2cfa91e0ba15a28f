// Blockwise quantize / dequantize on the CPU: OpenMP over blocks, bit-identical to the reference.
#pragma once

#include "../common/quantize_params.h"

namespace lowbit {
namespace kernels {

void quantize_blockwise_cpu(const QuantizeParams& p);
void dequantize_blockwise_cpu(const DequantizeParams& p);

}  // namespace kernels
}  // namespace lowbit
