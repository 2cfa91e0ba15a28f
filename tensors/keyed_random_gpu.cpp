// keyed_normal_on_gpu (keyed_random_gpu.h): the device guard and current stream, then the launcher.
#include "keyed_random_gpu.h"

#include <c10/util/Exception.h>

#include "../kernels/cuda/keyed_normal_cuda.h"

#include "gpu_runtime.h"

namespace lowbit {
namespace ops {

void keyed_normal_on_gpu(const kernels::KeyedNormalParams& p, const at::Tensor& out) {
  const GpuGuard guard(out.device());
  const char* err = kernels::keyed_normal_gpu(p, current_gpu_stream());
  TORCH_CHECK(err == nullptr, "keyed_normal_: GPU launch failed: ", err);
}

}  // namespace ops
}  // namespace lowbit
