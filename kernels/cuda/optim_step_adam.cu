// The GPU step kernels of Adam and AdamW (step_kernel.cuh), in a file of their own to keep compile times short.
#include "step_launch.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

LOWBIT_INSTANTIATE_STEP(Rule::Adam)
LOWBIT_INSTANTIATE_STEP(Rule::AdamW)

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
