// The GPU step kernels of AdEMAMix (step_kernel.cuh), in a file of their own to keep compile times short.
#include "step_launch.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

LOWBIT_INSTANTIATE_STEP(Rule::AdEMAMix)

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
