// The GPU bindings' view of libtorch's device runtime: the device guard and the current stream.
// A CUDA libtorch names them c10::cuda / at::cuda; a ROCm libtorch registers its HIP devices under
// the CUDA dispatch key and names them "masquerading as CUDA" (USE_ROCM is its compile definition).
#pragma once

#if defined(USE_ROCM)
#include <ATen/hip/HIPContext.h>
#include <ATen/hip/impl/HIPGuardImplMasqueradingAsCUDA.h>
#else
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace lowbit {
namespace ops {

#if defined(USE_ROCM)
using GpuGuard = c10::hip::HIPGuardMasqueradingAsCUDA;
inline void* current_gpu_stream() { return at::hip::getCurrentHIPStreamMasqueradingAsCUDA().stream(); }
#else
using GpuGuard = c10::cuda::CUDAGuard;
inline void* current_gpu_stream() { return at::cuda::getCurrentCUDAStream().stream(); }
#endif

}  // namespace ops
}  // namespace lowbit
