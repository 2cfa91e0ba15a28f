// One read of every gradient before an optimizer step: is it all finite (a step with a non-finite
// gradient is skipped), and, for clipping, its sum of squares.
#pragma once

#include <cstdint>

#include "../common/quantize_params.h"

namespace lowbit {
namespace kernels {

struct GradRef {
  const void* data = nullptr;  // numel contiguous elements of type
  ElemType type = ElemType::F32;
  int64_t numel = 0;
};

// finite[i] = 1 when every element of grads[i] is finite; with want_sumsq, sumsq[i] = the sum of
// its squares in double, added in an order fixed by the data alone (chunks of kGradChunk, 16
// partial sums each), so the result does not depend on the thread count.
constexpr int64_t kGradChunk = 8192;
void grad_stats_cpu(const GradRef* grads, int64_t count, bool want_sumsq, uint8_t* finite, double* sumsq);

}  // namespace kernels
}  // namespace lowbit
