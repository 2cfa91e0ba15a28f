// Fake quantization on the GPU (CUDA; HIP compiles the same file through portability.cuh).
//
// Forward: dynamic qparams are one warp per group (min/max reduced with shuffles, then
// kernels/common's formula); the quantize pass gives each thread 8 consecutive elements, i.e. one
// byte of the bit-packed STE mask, so no two threads write the same byte and no atomics are needed.
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

int grid_for(int64_t work_items, int per_block, const DeviceInfo& dev) {
  const int64_t wanted = (work_items + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(dev.sm_count) * 16)));
}

template <typename T, int WARP>
cudaError_t forward(const FakeQuantParams& p, const DeviceInfo& dev, cudaStream_t s) {
  const FakeQuantRange r = fq_range(p.bits, p.is_signed);
  const int64_t ngroups = p.n / p.group_size;
  const T* x = static_cast<const T*>(p.input);
  if (p.dynamic) {
    qparams_kernel<T, WARP><<<grid_for(ngroups, kThreads / WARP, dev), kThreads, 0, s>>>(
        x, ngroups, p.group_size, r, p.symmetric, p.eps, p.scale, p.zero_point);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  const bool vec = reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && reinterpret_cast<uintptr_t>(p.output) % 16 == 0;
  apply_kernel<T><<<grid_for((p.n + 7) / 8, kThreads, dev), kThreads, 0, s>>>(
      x, p.n, p.group_size, r, p.scale, p.zero_point, static_cast<T*>(p.output), p.mask, vec);
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

const char* fake_quant_backward_gpu(const FakeQuantBackwardParams& p, void* stream) {
  return launch<Backward>(p, p.type, stream);
}

const char* fake_quant_lsq_backward_gpu(const LsqBackwardParams& p, void* stream) {
  return launch<Lsq>(p, p.type, stream);
}

}  // namespace kernels
}  // namespace lowbit
