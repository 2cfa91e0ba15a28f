// The GPU step bench's entry, shared by bench_optim_step_gpu and `bench_optim_step --device cuda`.
#pragma once

namespace lowbit_bench {
// argv[1..4]: tensors, rows, cols, reps (see optim_step_gpu.cpp).
int optim_step_gpu_main(int argc, char** argv);
}  // namespace lowbit_bench
