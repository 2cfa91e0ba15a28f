// One read of every gradient before an optimizer step: is it all finite (a step with a non-finite
// gradient is skipped), and, for clipping, its sum of squares.
#pragma once

#include <cstdint>

#include "../common/grad_sums.h"
#include "../common/quantize_params.h"

namespace lowbit {
namespace kernels {

struct GradRef {
  const void* data = nullptr;  // numel contiguous elements of type
  ElemType type = ElemType::F32;
  int64_t numel = 0;
};

// finite[i] = 1 when every element of grads[i] is finite; with want_sumsq, sumsq[i] = the sum of
// its squares in double, added in the order of common/grad_sums.h (fixed by the data alone), so
// the result does not depend on the thread count or the device.
void grad_stats_cpu(const GradRef* grads, int64_t count, bool want_sumsq, uint8_t* finite, double* sumsq);

}  // namespace kernels
}  // namespace lowbit
