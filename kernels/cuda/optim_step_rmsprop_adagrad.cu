// The GPU step kernels of RMSprop and Adagrad (step_kernel.cuh), in a file of their own to keep compile times short.
#include "step_launch.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

LOWBIT_INSTANTIATE_STEP(Rule::RMSprop)
LOWBIT_INSTANTIATE_STEP(Rule::Adagrad)

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
