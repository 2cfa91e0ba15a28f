// The GPU step kernels of SGD and Lion (step_kernel.cuh), in a file of their own to keep compile times short.
#include "step_launch.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

LOWBIT_INSTANTIATE_STEP(Rule::SGD)
LOWBIT_INSTANTIATE_STEP(Rule::Lion)

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
