// Host launchers of the fused optimizer step and its gradient pre-pass on GPUs (CUDA, and HIP from
// the same sources): a step is a StepLaunch (kernels/common/step_launch.h), the record the CPU
// kernels take too. Plain C++ header: no CUDA, HIP or torch types, so any binding can include it.
// Pointers are device pointers on the current device unless said otherwise; `stream` is a
// cudaStream_t (hipStream_t under HIP). Each launcher returns nullptr, or the error of the launch.
// Nothing here allocates, uploads or reads back to the host, except the per-format tables, made
// on a device's first step (so a CUDA graph can capture every step after the first).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../common/step_launch.h"

namespace lowbit {
namespace kernels {

size_t gpu_step_scratch_bytes(const StepLaunch& s);
const char* optim_step_gpu(const StepLaunch& s, void* stream);
// LAMB's sums of p^2 and r^2 per parameter (kernels/cpu/optim_step_cpu.h's order) into out [n][2].
const char* lamb_norms_gpu(const StepLaunch& s, double* out, void* stream);
// LAMB's block sums (block_sums [blocks][2], device) added in LAMB's order (lamb_add_block_sums)
// over n ranges of blocks [first[i], first[i] + count[i]) into out [n][2] (device); first and count
// are host arrays. A sharded parameter's whole sums, without a trip to the host.
const char* lamb_add_block_sums_gpu(const double* block_sums, const int64_t* first, const int64_t* count, int64_t n,
                                    double* out, void* stream);
// For tests: the step kernels' division a / b, square root of a and reciprocal of a
// (speculative_arith.cuh) for n pairs, and per element whether each was in the short sequences'
// range (bit 0: the quotient, bit 1: the root, bit 2: the reciprocal). Where it was, the result
// must be the IEEE operation's.
const char* speculative_arith_gpu(const float* a, const float* b, int64_t n, float* quotient, float* root,
                                  float* reciprocal, uint8_t* ok, void* stream);

// The gradient pre-pass (tensors/optim_ops.h: grad_check): found_inf (zeroed by the caller) set to
// 1 when an element is Inf or NaN; with want_sumsq, sumsq[group] (zeroed) += each gradient's sum of
// squares in kernels/cpu/grad_stats_cpu.h's order, gradients in order.
struct GpuGrad {
  const void* data = nullptr;
  ElemType type = ElemType::F32;
  int64_t numel = 0;
  int64_t group = 0;
  int32_t aligned = 0;
};
size_t grad_check_scratch_bytes(const GpuGrad* grads, int64_t n, bool want_sumsq);
const char* grad_check_gpu(const GpuGrad* grads, int64_t n, bool want_sumsq, float* found_inf, double* sumsq,
                           void* scratch, void* stream);

}  // namespace kernels
}  // namespace lowbit
