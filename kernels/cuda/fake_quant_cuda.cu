// Fake quantization on the GPU (CUDA; HIP compiles the same file through portability.cuh).
//
// Forward: every thread owns 8 consecutive elements, i.e. one byte of the bit-packed STE mask, so
// no two threads write the same byte and no atomics are needed. Dynamic qparams, by group size:
//  * G a multiple of 8 up to 8 * warp (weights' groups of 32..256): one pass; the G / 8 lanes of a
//    group reduce min / max with shuffles, every lane derives the qparams and quantizes its 8 values.
//  * G a larger multiple of 8 (per-token rows): one thread block per row; min / max reduced through
//    shared memory, then the row is re-read (from L1 / L2) to quantize.
//  * other G: a qparams kernel (one warp per group), then the quantize kernel.
// Backward: the same 8-elements-per-thread shape reading one mask byte. LSQ backward: one warp per
// group, its d scale / d zero sums reduced with shuffles (in double, like the CPU loop).
#include <algorithm>

#include "../common/fake_quant_math.h"
#include "fake_quant_cuda.h"
#include "vector_io.cuh"

namespace lowbit {
namespace kernels {
namespace {

constexpr int kThreads = 256;

template <typename T, int WARP>
__global__ void __launch_bounds__(kThreads) qparams_kernel(const T* __restrict__ x, int64_t ngroups, int64_t G,
                                                           FakeQuantRange r, bool symmetric, float eps,
                                                           float* __restrict__ scale, float* __restrict__ zp) {
  const int lane = threadIdx.x % WARP;
  const int64_t warps_total = int64_t(gridDim.x) * (kThreads / WARP);
  for (int64_t g = int64_t(blockIdx.x) * (kThreads / WARP) + threadIdx.x / WARP; g < ngroups; g += warps_total) {
    const T* xg = x + g * G;
    float mn = to_f32(xg[0]), mx = mn;  // every lane starts from element 0: min/max are unaffected
    for (int64_t i = lane; i < G; i += WARP) {
      const float v = to_f32(xg[i]);
      mn = fq_min(mn, v);
      mx = fq_max(mx, v);
    }
#pragma unroll
    for (int off = WARP / 2; off > 0; off /= 2) {
      mn = fq_min(mn, LOWBIT_SHFL_XOR(mn, off, WARP));
      mx = fq_max(mx, LOWBIT_SHFL_XOR(mx, off, WARP));
    }
    if (lane == 0) {
      const AffineQParams qp = fq_qparams(mn, mx, r, symmetric, eps);
      scale[g] = qp.scale;
      zp[g] = qp.zero_point;
    }
  }
}

// Lane-group min / max: LANES consecutive lanes (a power of two) share one group.
template <int LANES, int WARP>
__device__ __forceinline__ void group_minmax(float& mn, float& mx) {
#pragma unroll
  for (int off = LANES / 2; off > 0; off /= 2) {
    mn = fq_min(mn, LOWBIT_SHFL_XOR(mn, off, WARP));
    mx = fq_max(mx, LOWBIT_SHFL_XOR(mx, off, WARP));
  }
}

// Quantizes 8 values of one group, stores them and their mask byte.
template <typename T>
__device__ __forceinline__ void quantize8(const float (&v)[8], int64_t i, int64_t n, bool vec, AffineQParams qp,
                                          FakeQuantRange r, T* y, uint8_t* mask) {
  const float inv = fq_inv_scale(qp.scale);
  float out[8];
  uint32_t bits = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    bool inside;
    out[k] = fq_apply(v[k], qp.scale, inv, qp.zero_point, r, &inside);
    bits |= uint32_t(inside) << k;
  }
  store8(y, i, n, vec, out);
  mask[i / 8] = static_cast<uint8_t>(bits);
}

// Dynamic, G = 8 * LANES (LANES a power of two <= WARP): one pass, registers only.
template <typename T, int LANES, int WARP>
__global__ void __launch_bounds__(kThreads) fused_small_kernel(const T* __restrict__ x, int64_t n, FakeQuantRange r,
                                                               bool symmetric, float eps, float* __restrict__ scale,
                                                               float* __restrict__ zp, T* __restrict__ y,
                                                               uint8_t* __restrict__ mask, bool vec) {
  constexpr int64_t G = 8 * LANES;
  const int lane = threadIdx.x % WARP;
  const int64_t units = (n + 8 * WARP - 1) / (8 * WARP);
  const int64_t warps_total = int64_t(gridDim.x) * (kThreads / WARP);
  for (int64_t u = int64_t(blockIdx.x) * (kThreads / WARP) + threadIdx.x / WARP; u < units; u += warps_total) {
    const int64_t i = (u * WARP + lane) * 8;
    float v[8];
    load8(x, i, n, vec, v);  // whole groups lie either inside or past n (n is a multiple of G)
    float mn = v[0], mx = v[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) mn = fq_min(mn, v[k]), mx = fq_max(mx, v[k]);
    group_minmax<LANES, WARP>(mn, mx);
    if (i >= n) continue;
    const AffineQParams qp = fq_qparams(mn, mx, r, symmetric, eps);
    if (lane % LANES == 0) {
      scale[i / G] = qp.scale;
      zp[i / G] = qp.zero_point;
    }
    quantize8(v, i, n, vec, qp, r, y, mask);
  }
}

// Dynamic, G a multiple of 8 larger than 8 * WARP: one block per group (row).
template <typename T, int WARP>
__global__ void __launch_bounds__(kThreads) fused_row_kernel(const T* __restrict__ x, int64_t ngroups, int64_t G,
                                                             FakeQuantRange r, bool symmetric, float eps,
                                                             float* __restrict__ scale, float* __restrict__ zp,
                                                             T* __restrict__ y, uint8_t* __restrict__ mask, bool vec) {
  __shared__ float s_min[kThreads / WARP], s_max[kThreads / WARP];
  __shared__ AffineQParams s_qp;
  const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
  constexpr int kWarps = kThreads / WARP;
  for (int64_t g = blockIdx.x; g < ngroups; g += gridDim.x) {
    const int64_t base = g * G, end = base + G;
    float mn = to_f32(x[base]), mx = mn;
    for (int64_t i = base + int64_t(threadIdx.x) * 8; i < end; i += int64_t(kThreads) * 8) {
      float v[8];
      load8(x, i, end, vec, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) mn = fq_min(mn, v[k]), mx = fq_max(mx, v[k]);
    }
    group_minmax<WARP, WARP>(mn, mx);
    if (lane == 0) s_min[warp] = mn, s_max[warp] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kWarps; ++w) mn = fq_min(mn, s_min[w]), mx = fq_max(mx, s_max[w]);
      s_qp = fq_qparams(mn, mx, r, symmetric, eps);
      scale[g] = s_qp.scale;
      zp[g] = s_qp.zero_point;
    }
    __syncthreads();
    const AffineQParams qp = s_qp;
    for (int64_t i = base + int64_t(threadIdx.x) * 8; i < end; i += int64_t(kThreads) * 8) {
      float v[8];
      load8(x, i, end, vec, v);
      quantize8(v, i, end, vec, qp, r, y, mask);
    }
    __syncthreads();  // s_qp is rewritten for the next group
  }
}

// Thread t owns elements [8t, 8t + 8) and mask byte t.
template <typename T>
__global__ void __launch_bounds__(kThreads) apply_kernel(const T* __restrict__ x, int64_t n, int64_t G,
                                                         FakeQuantRange r, const float* __restrict__ scale,
                                                         const float* __restrict__ zp, T* __restrict__ y,
                                                         uint8_t* __restrict__ mask, bool vec) {
  const int64_t nbytes = (n + 7) / 8;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < nbytes; b += int64_t(gridDim.x) * kThreads) {
    const int64_t i = b * 8;
    float v[8], out[8];
    load8(x, i, n, vec, v);
    int64_t g = i / G, next = (g + 1) * G;
    float s = scale[g], z = zp[g], inv = fq_inv_scale(s);
    uint32_t bits = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if (i + k >= n) {
        out[k] = 0.0f;
        continue;
      }
      if (i + k == next) {  // crossed into the next group (groups smaller than or unaligned to 8)
        g = (i + k) / G;
        next = (g + 1) * G;
        s = scale[g];
        z = zp[g];
        inv = fq_inv_scale(s);
      }
      bool inside;
      out[k] = fq_apply(v[k], s, inv, z, r, &inside);
      bits |= uint32_t(inside) << k;
    }
    store8(y, i, n, vec, out);
    mask[b] = static_cast<uint8_t>(bits);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) backward_kernel(const T* __restrict__ dy, int64_t n,
                                                            const uint8_t* __restrict__ mask, T* __restrict__ dx,
                                                            bool vec) {
  const int64_t nbytes = (n + 7) / 8;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < nbytes; b += int64_t(gridDim.x) * kThreads) {
    const int64_t i = b * 8;
    const uint32_t m = mask[b];
    float v[8];
    load8(dy, i, n, vec, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = (m >> k) & 1u ? v[k] : 0.0f;
    store8(dx, i, n, vec, v);
  }
}

template <typename T, int WARP>
__global__ void __launch_bounds__(kThreads) lsq_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                                       int64_t ngroups, int64_t G, FakeQuantRange r,
                                                       const float* __restrict__ scale, const float* __restrict__ zp,
                                                       float factor, T* __restrict__ dx, float* __restrict__ gs,
                                                       float* __restrict__ gz) {
  const int lane = threadIdx.x % WARP;
  const int64_t warps_total = int64_t(gridDim.x) * (kThreads / WARP);
  for (int64_t g = int64_t(blockIdx.x) * (kThreads / WARP) + threadIdx.x / WARP; g < ngroups; g += warps_total) {
    const float s = scale[g], z = zp[g], inv = fq_inv_scale(s);
    double ds = 0.0, dz = 0.0;
    for (int64_t i = g * G + lane; i < (g + 1) * G; i += WARP) {
      const LsqGrad lg = fq_lsq_grad(to_f32(dy[i]), to_f32(x[i]), s, inv, z, r);
      dx[i] = from_f32<T>(lg.dx);
      ds += lg.dscale;
      dz += lg.dzero;
    }
#pragma unroll
    for (int off = WARP / 2; off > 0; off /= 2) {
      ds += LOWBIT_SHFL_XOR(ds, off, WARP);
      dz += LOWBIT_SHFL_XOR(dz, off, WARP);
    }
    if (lane == 0) {
      gs[g] = static_cast<float>(ds) * factor;
      gz[g] = static_cast<float>(dz) * factor;
    }
  }
}

// Float8: one warp per group for the absmax and scale, then 8 elements (one mask byte) per thread.
template <typename T, int WARP>
__global__ void __launch_bounds__(kThreads) float8_scale_kernel(const T* __restrict__ x, int64_t ngroups, int64_t G,
                                                                Float8Format f, float eps, float* __restrict__ scale) {
  const int lane = threadIdx.x % WARP;
  const int64_t warps_total = int64_t(gridDim.x) * (kThreads / WARP);
  for (int64_t g = int64_t(blockIdx.x) * (kThreads / WARP) + threadIdx.x / WARP; g < ngroups; g += warps_total) {
    float amax = 0.0f;
    for (int64_t i = lane; i < G; i += WARP) amax = fq_max(amax, fabsf(to_f32(x[g * G + i])));
#pragma unroll
    for (int off = WARP / 2; off > 0; off /= 2) amax = fq_max(amax, LOWBIT_SHFL_XOR(amax, off, WARP));
    if (lane == 0) scale[g] = fq_float8_scale(amax, f, eps);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) float8_apply_kernel(const T* __restrict__ x, int64_t n, int64_t G,
                                                                Float8Format f, const float* __restrict__ scale,
                                                                T* __restrict__ y, uint8_t* __restrict__ mask, bool vec) {
  const int64_t nbytes = (n + 7) / 8;
  for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < nbytes; b += int64_t(gridDim.x) * kThreads) {
    const int64_t i = b * 8;
    float v[8], out[8];
    load8(x, i, n, vec, v);
    uint32_t bits = 0;
    int64_t g = i / G, next = (g + 1) * G;  // one 64-bit division per thread, then boundary checks
    float sc = scale[g];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      out[k] = 0.0f;
      if (i + k < n) {
        if (i + k == next) {
          g = (i + k) / G;
          next = (g + 1) * G;
          sc = scale[g];
        }
        bool inside;
        out[k] = fq_float8_apply(v[k], sc, f, &inside);
        bits |= uint32_t(inside) << k;
      }
    }
    store8(y, i, n, vec, out);
    mask[b] = static_cast<uint8_t>(bits);
  }
}

// Block-scaled floats: one warp per block for the absmax and scale, then 8 elements per thread.
template <typename T, int WARP>
__global__ void __launch_bounds__(kThreads) block_float_scale_kernel(const T* __restrict__ x, int64_t nblocks,
                                                                     BlockFloatParams p) {
  const int lane = threadIdx.x % WARP;
  const int64_t warps_total = int64_t(gridDim.x) * (kThreads / WARP);
  const float tensor_scale = p.nvfp4 ? fq_nvfp4_tensor_scale(*p.tensor_amax, p.eps) : 0.0f;
  for (int64_t b = int64_t(blockIdx.x) * (kThreads / WARP) + threadIdx.x / WARP; b < nblocks; b += warps_total) {
    float amax = 0.0f;
    for (int64_t i = lane; i < p.block; i += WARP) amax = fq_max(amax, fabsf(to_f32(x[b * p.block + i])));
#pragma unroll
    for (int off = WARP / 2; off > 0; off /= 2) amax = fq_max(amax, LOWBIT_SHFL_XOR(amax, off, WARP));
    if (lane == 0) p.scale[b] = p.nvfp4 ? fq_nvfp4_total_scale(amax, tensor_scale) : fq_mx_scale(amax, p.mx_emax);
  }
}

int grid_for(int64_t work_items, int per_block, const DeviceInfo& dev) {
  const int64_t wanted = (work_items + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(dev.sm_count) * 16)));
}

template <typename T, int WARP>
cudaError_t forward(const FakeQuantParams& p, const DeviceInfo& dev, cudaStream_t s) {
  const FakeQuantRange r = fq_range(p.bits, p.is_signed);
  const int64_t ngroups = p.n / p.group_size;
  const T* x = static_cast<const T*>(p.input);
  const bool vec = reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && reinterpret_cast<uintptr_t>(p.output) % 16 == 0;
  T* y = static_cast<T*>(p.output);
  if (p.dynamic && p.group_size % 8 == 0) {
    const int64_t lanes = p.group_size / 8;
    const int grid = grid_for((p.n + 8 * WARP - 1) / (8 * WARP), kThreads / WARP, dev);
#define LOWBIT_SMALL_CASE(L)                                                                                   \
  if (lanes == L && L <= WARP) {                                                                               \
    fused_small_kernel<T, (L <= WARP ? L : WARP), WARP><<<grid, kThreads, 0, s>>>(x, p.n, r, p.symmetric, p.eps, \
                                                                                  p.scale, p.zero_point, y,    \
                                                                                  p.mask, vec);                \
    return cudaGetLastError();                                                                                 \
  }
    LOWBIT_SMALL_CASE(1) LOWBIT_SMALL_CASE(2) LOWBIT_SMALL_CASE(4) LOWBIT_SMALL_CASE(8) LOWBIT_SMALL_CASE(16)
    LOWBIT_SMALL_CASE(32) LOWBIT_SMALL_CASE(64)
#undef LOWBIT_SMALL_CASE
    if (lanes > WARP) {
      const int rows = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ngroups, int64_t(dev.sm_count) * 16)));
      fused_row_kernel<T, WARP><<<rows, kThreads, 0, s>>>(x, ngroups, p.group_size, r, p.symmetric, p.eps, p.scale,
                                                          p.zero_point, y, p.mask, vec);
      return cudaGetLastError();
    }
  }
  if (p.dynamic) {
    qparams_kernel<T, WARP><<<grid_for(ngroups, kThreads / WARP, dev), kThreads, 0, s>>>(
        x, ngroups, p.group_size, r, p.symmetric, p.eps, p.scale, p.zero_point);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  apply_kernel<T><<<grid_for((p.n + 7) / 8, kThreads, dev), kThreads, 0, s>>>(x, p.n, p.group_size, r, p.scale,
                                                                              p.zero_point, y, p.mask, vec);
  return cudaGetLastError();
}

template <typename T, int WARP>
cudaError_t float8(const Float8FakeQuantParams& p, const DeviceInfo& dev, cudaStream_t s) {
  const int64_t ngroups = p.n / p.group_size;
  const Float8Format f = fq_float8_format(p.e4m3);
  const T* x = static_cast<const T*>(p.input);
  float8_scale_kernel<T, WARP><<<grid_for(ngroups, kThreads / WARP, dev), kThreads, 0, s>>>(x, ngroups, p.group_size,
                                                                                          f, p.eps, p.scale);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const bool vec = reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && reinterpret_cast<uintptr_t>(p.output) % 16 == 0;
  float8_apply_kernel<T><<<grid_for((p.n + 7) / 8, kThreads, dev), kThreads, 0, s>>>(
      x, p.n, p.group_size, f, p.scale, static_cast<T*>(p.output), p.mask, vec);
  return cudaGetLastError();
}

template <typename T, int WARP>
cudaError_t block_float(const BlockFloatParams& p, const DeviceInfo& dev, cudaStream_t s) {
  const int64_t nblocks = p.n / p.block;
  const T* x = static_cast<const T*>(p.input);
  block_float_scale_kernel<T, WARP><<<grid_for(nblocks, kThreads / WARP, dev), kThreads, 0, s>>>(x, nblocks, p);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  // The element step is float8_apply_kernel's: x / scale, clamp, round, times scale (the block is G).
  const bool vec = reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && reinterpret_cast<uintptr_t>(p.output) % 16 == 0;
  const Float8Format elem{p.elem_mantissa_bits, p.elem_min_exponent, p.elem_max};
  float8_apply_kernel<T><<<grid_for((p.n + 7) / 8, kThreads, dev), kThreads, 0, s>>>(
      x, p.n, p.block, elem, p.scale, static_cast<T*>(p.output), p.mask, vec);
  return cudaGetLastError();
}

template <typename T, int WARP>
cudaError_t backward(const FakeQuantBackwardParams& p, const DeviceInfo& dev, cudaStream_t s) {
  const bool vec = reinterpret_cast<uintptr_t>(p.grad) % 16 == 0 && reinterpret_cast<uintptr_t>(p.grad_input) % 16 == 0;
  backward_kernel<T><<<grid_for((p.n + 7) / 8, kThreads, dev), kThreads, 0, s>>>(
      static_cast<const T*>(p.grad), p.n, p.mask, static_cast<T*>(p.grad_input), vec);
  return cudaGetLastError();
}

template <typename T, int WARP>
cudaError_t lsq(const LsqBackwardParams& p, const DeviceInfo& dev, cudaStream_t s) {
  const int64_t ngroups = p.n / p.group_size;
  lsq_kernel<T, WARP><<<grid_for(ngroups, kThreads / WARP, dev), kThreads, 0, s>>>(
      static_cast<const T*>(p.grad), static_cast<const T*>(p.input), ngroups, p.group_size,
      fq_range(p.bits, p.is_signed), p.scale, p.zero_point, p.grad_factor, static_cast<T*>(p.grad_input),
      p.grad_scale, p.grad_zero_point);
  return cudaGetLastError();
}

template <typename T, int WARP> struct Forward {
  static cudaError_t run(const FakeQuantParams& p, const DeviceInfo& d, cudaStream_t s) { return forward<T, WARP>(p, d, s); }
};
template <typename T, int WARP> struct Float8 {
  static cudaError_t run(const Float8FakeQuantParams& p, const DeviceInfo& d, cudaStream_t s) {
    return float8<T, WARP>(p, d, s);
  }
};
template <typename T, int WARP> struct BlockFloat {
  static cudaError_t run(const BlockFloatParams& p, const DeviceInfo& d, cudaStream_t s) {
    return block_float<T, WARP>(p, d, s);
  }
};
template <typename T, int WARP> struct Backward {
  static cudaError_t run(const FakeQuantBackwardParams& p, const DeviceInfo& d, cudaStream_t s) {
    return backward<T, WARP>(p, d, s);
  }
};
template <typename T, int WARP> struct Lsq {
  static cudaError_t run(const LsqBackwardParams& p, const DeviceInfo& d, cudaStream_t s) { return lsq<T, WARP>(p, d, s); }
};

// dtype and warp width (from the device) as template arguments.
template <template <typename, int> class F, typename P>
const char* launch(const P& p, ElemType type, void* stream) {
  if (p.n == 0) return nullptr;
  DeviceInfo dev;
  cudaError_t e = query_device(&dev);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  const auto s = static_cast<cudaStream_t>(stream);
  bool launched = false;
#define LOWBIT_WARP_CASE(W)                                          \
  if (!launched && dev.warp_size == W) {                             \
    launched = true;                                                 \
    switch (type) {                                                  \
      case ElemType::F32: e = F<float, W>::run(p, dev, s); break;    \
      case ElemType::BF16: e = F<bf16_t, W>::run(p, dev, s); break;  \
      case ElemType::F16: e = F<f16_t, W>::run(p, dev, s); break;    \
      default: e = cudaErrorInvalidValue;                            \
    }                                                                \
  }
  LOWBIT_FOR_EACH_WARP_SIZE(LOWBIT_WARP_CASE)
#undef LOWBIT_WARP_CASE
  if (!launched) return "unsupported warp size";
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* fake_quant_gpu(const FakeQuantParams& p, void* stream) { return launch<Forward>(p, p.type, stream); }

const char* fake_quant_float8_gpu(const Float8FakeQuantParams& p, void* stream) { return launch<Float8>(p, p.type, stream); }

const char* fake_quant_block_float_gpu(const BlockFloatParams& p, void* stream) {
  return launch<BlockFloat>(p, p.type, stream);
}

const char* fake_quant_backward_gpu(const FakeQuantBackwardParams& p, void* stream) {
  return launch<Backward>(p, p.type, stream);
}

const char* fake_quant_lsq_backward_gpu(const LsqBackwardParams& p, void* stream) {
  return launch<Lsq>(p, p.type, stream);
}

}  // namespace kernels
}  // namespace lowbit
