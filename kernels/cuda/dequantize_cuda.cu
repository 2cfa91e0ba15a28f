// Blockwise dequantize on the GPU: each thread decodes 8 consecutive codes with the codebook staged
// in shared memory and writes 8 outputs (CUDA; HIP through portability.cuh).
#include <algorithm>

#include "../common/encode.h"
#include "gpu_tables.cuh"
#include "quantize_cuda.h"
#include "vector_io.cuh"

namespace lowbit {
namespace kernels {
namespace {

constexpr int kThreads = 256;

// 16 elements per thread: 16 (8-bit) or 8 (4-bit) code bytes in one load, enough bytes in flight
// per SM to cover memory latency although the codes are a fifth of the traffic.
constexpr int kElems = 16;

template <typename T, int BITS>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const uint8_t* __restrict__ codes,
                                                              const float* __restrict__ absmax, T* __restrict__ y,
                                                              int64_t n, int block_shift, bool vec, GpuTables tables) {
  __shared__ float s_cb[256];
  stage(s_cb, tables.codebook, 1 << BITS);
  __syncthreads();
  const int64_t chunks = (n + kElems - 1) / kElems;
  for (int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * kThreads) {
    const int64_t i = c * kElems;
    // 16 elements never straddle two blocks: blocks are multiples of 32 elements.
    const float amax = absmax[i >> block_shift];
    uint8_t code[kElems];
    const bool full = vec && i + kElems <= n;
    if (BITS == 8) {
      if (full) {
        const uint4 w = *reinterpret_cast<const uint4*>(codes + i);
        const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < kElems; ++k) code[k] = (words[k / 4] >> (8 * (k % 4))) & 0xFF;
      } else {
#pragma unroll
        for (int k = 0; k < kElems; ++k) code[k] = i + k < n ? codes[i + k] : 0;
      }
    } else {
      uint2 w = make_uint2(0, 0);
      if (full) {
        w = *reinterpret_cast<const uint2*>(codes + i / 2);
      } else {
#pragma unroll
        for (int k = 0; k < kElems / 2; ++k)
          if (i + 2 * k < n) (k < 4 ? w.x : w.y) |= uint32_t(codes[i / 2 + k]) << (8 * (k % 4));
      }
#pragma unroll
      for (int k = 0; k < kElems; ++k) code[k] = ((k < 8 ? w.x : w.y) >> (4 * (k % 8))) & 0xF;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = decode_value(s_cb, code[8 * half + k], amax);
      store8(y, i + 8 * half, n, vec, v);
    }
  }
}

template <typename T, int BITS>
cudaError_t launch(const DequantizeParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const int64_t chunks = (p.n + kElems - 1) / kElems;
  const int64_t wanted = (chunks + kThreads - 1) / kThreads;
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(dev.sm_count) * 8)));
  const bool vec = reinterpret_cast<uintptr_t>(p.output) % 16 == 0 && reinterpret_cast<uintptr_t>(p.codes) % 16 == 0;
  int shift = 0;
  while ((int64_t(1) << shift) < p.block_size) ++shift;
  dequantize_kernel<T, BITS><<<grid, kThreads, 0, stream>>>(p.codes, p.absmax, static_cast<T*>(p.output), p.n, shift,
                                                             vec, gpu_tables(p.format));
  return cudaGetLastError();
}

template <typename T>
cudaError_t dispatch_bits(const DequantizeParams& p, const DeviceInfo& dev, cudaStream_t s) {
  return format_bits(p.format) == 4 ? launch<T, 4>(p, dev, s) : launch<T, 8>(p, dev, s);
}

}  // namespace

const char* dequantize_blockwise_gpu(const DequantizeParams& p, void* stream) {
  if (p.n == 0) return nullptr;
  if (!is_valid_block_size(p.block_size)) return "block_size must be a power of two in [32, 4096]";
  DeviceInfo dev;
  cudaError_t e = query_device(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const auto s = static_cast<cudaStream_t>(stream);
  switch (p.output_type) {
    case ElemType::F32: e = dispatch_bits<float>(p, dev, s); break;
    case ElemType::BF16: e = dispatch_bits<bf16_t>(p, dev, s); break;
    case ElemType::F16: e = dispatch_bits<f16_t>(p, dev, s); break;
  }
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace kernels
}  // namespace lowbit
