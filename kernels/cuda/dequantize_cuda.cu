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

// Work comes in groups of 4 consecutive elements; consecutive threads take consecutive groups, so
// each warp-wide store writes one contiguous 512-byte (fp32) run. Each thread loads the codes of
// kUnroll groups, a grid apart, before decoding any: enough loads in flight to cover latency.
constexpr int kUnroll = 4;

template <typename T>
__device__ __forceinline__ void store4(T* y, int64_t i, int64_t n, bool vec, const float (&v)[4]) {
  if (vec && i + 4 <= n) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(y + i) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      *reinterpret_cast<uint2*>(y + i) = make_uint2(pack2<T>(v[0], v[1]), pack2<T>(v[2], v[3]));
    }
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i + k < n) y[i + k] = from_f32<T>(v[k]);
  }
}

template <typename T, int BITS>
__global__ void __launch_bounds__(kThreads) dequantize_kernel(const uint8_t* __restrict__ codes,
                                                              const float* __restrict__ absmax, T* __restrict__ y,
                                                              int64_t n, int block_shift, bool vec, GpuTables tables) {
  __shared__ float s_cb[256];
  stage(s_cb, tables.codebook, 1 << BITS);
  __syncthreads();
  const int64_t groups = (n + 3) / 4;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t base = int64_t(blockIdx.x) * kThreads + threadIdx.x; base < groups; base += kUnroll * stride) {
    uint32_t word[kUnroll];  // 4 codes: 4 bytes (8-bit) or 2 bytes (4-bit)
    float amax[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + u * stride;
      const int64_t i = g * 4;
      word[u] = 0;
      amax[u] = 0.0f;
      if (g < groups) {
        amax[u] = absmax[i >> block_shift];  // 4 elements never straddle two blocks (blocks >= 32)
        if (vec && i + 4 <= n) {
          word[u] = BITS == 8 ? *reinterpret_cast<const uint32_t*>(codes + i)
                              : *reinterpret_cast<const uint16_t*>(codes + i / 2);
        } else {
          for (int k = 0; k < 4 && i + k < n; ++k)
            word[u] |= BITS == 8 ? uint32_t(codes[i + k]) << (8 * k)
                                 : uint32_t((codes[(i + k) / 2] >> (4 * ((i + k) & 1))) & 0xF) << (4 * k);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g = base + u * stride;
      if (g >= groups) break;
      float v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t code = BITS == 8 ? (word[u] >> (8 * k)) & 0xFF : (word[u] >> (4 * k)) & 0xF;
        v[k] = decode_value(s_cb, static_cast<uint8_t>(code), amax[u]);
      }
      store4(y, g * 4, n, vec, v);
    }
  }
}

template <typename T, int BITS>
cudaError_t launch(const DequantizeParams& p, const DeviceInfo& dev, cudaStream_t stream) {
  const int64_t groups = (p.n + 3) / 4;
  const int64_t wanted = (groups + kThreads * kUnroll - 1) / (kThreads * kUnroll);
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(dev.sm_count) * 8)));
  const bool vec = reinterpret_cast<uintptr_t>(p.output) % 16 == 0 && reinterpret_cast<uintptr_t>(p.codes) % 4 == 0;
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
