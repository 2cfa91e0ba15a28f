// bench_optim_step_gpu: the GPU step bench as a program of its own (see optim_step_gpu.cpp).
#include "optim_step_gpu.h"

int main(int argc, char** argv) { return lowbit_bench::optim_step_gpu_main(argc, argv); }
