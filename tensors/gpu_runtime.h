// The GPU bindings' view of libtorch's device runtime: the device guard, the current stream and
// the launchers' error check.
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
#include <c10/util/Exception.h>

namespace lowbit {
namespace ops {

#if defined(USE_ROCM)
using GpuGuard = c10::hip::HIPGuardMasqueradingAsCUDA;
inline void* current_gpu_stream() { return at::hip::getCurrentHIPStreamMasqueradingAsCUDA().stream(); }
#else
using GpuGuard = c10::cuda::CUDAGuard;
inline void* current_gpu_stream() { return at::cuda::getCurrentCUDAStream().stream(); }
#endif

// A launcher's error (nullptr: launched), raised naming the op.
inline void check_gpu_launch(const char* err, const char* op) {
  TORCH_CHECK(err == nullptr, op, ": CUDA launch failed: ", err);
}

}  // namespace ops
}  // namespace lowbit
