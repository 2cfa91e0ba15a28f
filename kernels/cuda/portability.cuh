// The one place where CUDA and HIP differ for lowbit's kernels: runtime names, warp shuffles and
// the warp width. The kernel sources include this instead of cuda_runtime.h / hip_runtime.h.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#define cudaStream_t hipStream_t
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorInvalidValue hipErrorInvalidValue
#define cudaErrorNotSupported hipErrorNotSupported
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetDevice hipGetDevice
#define cudaMalloc hipMalloc
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrWarpSize hipDeviceAttributeWarpSize
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaStreamCaptureStatus hipStreamCaptureStatus
#define cudaStreamCaptureStatusNone hipStreamCaptureStatusNone
#define cudaStreamIsCapturing hipStreamIsCapturing
#define cudaErrorStreamCaptureUnsupported hipErrorStreamCaptureUnsupported
#define cudaMemsetAsync hipMemsetAsync
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamWaitEvent hipStreamWaitEvent
#define LOWBIT_SHFL_XOR(v, lane_mask, width) __shfl_xor((v), (lane_mask), (width))
#define LOWBIT_SHFL(v, src_lane, width) __shfl((v), (src_lane), (width))
#define LOWBIT_SYNCWARP() __builtin_amdgcn_wave_barrier()
#define LOWBIT_GRID_CONSTANT
#else
#include <cuda_runtime.h>
#define LOWBIT_SHFL_XOR(v, lane_mask, width) __shfl_xor_sync(0xffffffffu, (v), (lane_mask), (width))
#define LOWBIT_SHFL(v, src_lane, width) __shfl_sync(0xffffffffu, (v), (src_lane), (width))
#define LOWBIT_SYNCWARP() __syncwarp()
// Kernel parameters read in place from the constant bank (no copy to local memory when indexed).
#define LOWBIT_GRID_CONSTANT __grid_constant__
#endif

namespace lowbit {
namespace kernels {

// Warp widths a kernel is instantiated for; the launcher picks one from the device's reported
// warp size (CUDA: 32; AMD CDNA: 64; RDNA: 32).
#if defined(__HIPCC__)
#define LOWBIT_FOR_EACH_WARP_SIZE(X) X(32) X(64)
#else
#define LOWBIT_FOR_EACH_WARP_SIZE(X) X(32)
#endif

// Tensor descriptors one launch carries by value as kernel parameters: CUDA 12.1+ allows 32 KB of
// them (Volta and later), HIP keeps within 4 KB.
#if defined(__HIPCC__)
constexpr int kDescriptorsPerLaunch = 24;
constexpr int kKernelParamBytes = 4096;
#else
constexpr int kDescriptorsPerLaunch = 200;
constexpr int kKernelParamBytes = 32764;
#endif

// Device properties the launchers need, queried once per device.
struct DeviceInfo {
  int sm_count = 1;
  int warp_size = 32;
};

inline cudaError_t query_device(DeviceInfo* info) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&info->sm_count, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  return cudaDeviceGetAttribute(&info->warp_size, cudaDevAttrWarpSize, dev);
}

}  // namespace kernels
}  // namespace lowbit
