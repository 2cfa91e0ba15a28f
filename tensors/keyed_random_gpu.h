// The GPU side of keyed_normal_ (keyed_random.cpp), compiled where the library has GPU kernels.
#pragma once

#include <ATen/core/Tensor.h>

#include "../kernels/common/keyed_normal.h"

namespace lowbit {
namespace ops {

// Launches kernels::keyed_normal_gpu on out's device and current stream; p.out is out's data.
void keyed_normal_on_gpu(const kernels::KeyedNormalParams& p, const at::Tensor& out);

}  // namespace ops
}  // namespace lowbit
