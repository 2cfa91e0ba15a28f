// The GPU step kernels of Adam and AdamW (optim_step_kernels.cuh), in a file of their own to keep compile times short.
#include "optim_step_kernels.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

LOWBIT_INSTANTIATE_STEP(Rule::Adam)
LOWBIT_INSTANTIATE_STEP(Rule::AdamW)

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
