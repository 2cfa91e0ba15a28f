// The gradient pre-pass on GPUs (optim_step_cuda.h: grad_check_gpu). The finite check alone reads
// each gradient once with wide loads. The sums of squares follow common/grad_sums.h's order, as
// the CPU kernel does (16 lanes per chunk, lane j as partial sum j), so clipping scales by the
// CPU's factor.
#include <algorithm>

#include "../common/grad_sums.h"
#include "optim_step_cuda.h"
#include "vector_io.cuh"

namespace lowbit {
namespace kernels {
namespace {

constexpr int kThreads = 256;
// Gradients one launch checks: as many as its parameters hold (48 bytes each, 600 on CUDA). Over
// thousands of small gradients every launch costs its start and its last wave's tail.
constexpr int kGrads = (kKernelParamBytes - 256) / (sizeof(GpuGrad) + sizeof(int64_t)) > 600
                           ? 600
                           : (kKernelParamBytes - 256) / (sizeof(GpuGrad) + sizeof(int64_t));

struct GradChunk {
  GpuGrad g[kGrads];
  int64_t first[kGrads + 1];  // finite check: items (kItemBytes); sums: chunks of kGradChunk
  int count;
};
static_assert(sizeof(GradChunk) + 2 * sizeof(void*) <= kKernelParamBytes, "a launch's gradients fit its parameters");

template <typename T>
__device__ __forceinline__ float load1(const void* p, int64_t i) {
  return to_f32(static_cast<const T*>(p)[i]);
}

__device__ __forceinline__ float load_any(const GpuGrad& g, int64_t i) {
  switch (g.type) {
    case ElemType::F32: return load1<float>(g.data, i);
    case ElemType::BF16: return load1<bf16_t>(g.data, i);
    case ElemType::F16: return load1<f16_t>(g.data, i);
  }
  return 0.0f;
}

__device__ __forceinline__ bool finite(float x) { return (__float_as_uint(x) & 0x7FFFFFFFu) < 0x7F800000u; }


__device__ __forceinline__ int grad_of(const GradChunk& c, int64_t item) {
  int lo = 0, hi = c.count - 1;
  while (lo < hi) {  // the last gradient whose first item is <= item
    const int mid = (lo + hi + 1) / 2;
    if (c.first[mid] <= item) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// A finite-check item: 32 bytes of one gradient (8 fp32 or 16 16-bit elements), two 16-byte loads
// whatever the dtype. Items of 8 elements gave 16-bit gradients half the bytes per load and per
// item's bookkeeping: their pass ran at 2.62 TB/s where fp32's ran at 2.94 (H100).
constexpr int kItemBytes = 32;
__host__ __device__ __forceinline__ int item_elems(ElemType t) { return t == ElemType::F32 ? 8 : 16; }

// Whether an item's raw words hold a NaN or an infinity: an all-ones exponent, tested on the bits
// (no conversion).
__device__ __forceinline__ bool any_nonfinite(ElemType t, uint4 a, uint4 b) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  bool bad = false;
  if (t == ElemType::F32) {
#pragma unroll
    for (int k = 0; k < 8; ++k) bad |= (w[k] & 0x7F800000u) == 0x7F800000u;
  } else {
    const uint32_t e = t == ElemType::BF16 ? 0x7F80u : 0x7C00u;  // the exponent field of one half
#pragma unroll
    for (int k = 0; k < 8; ++k) bad |= (w[k] & e) == e || ((w[k] >> 16) & e) == e;
  }
  return bad;
}

// Each thread block takes one contiguous run of the launch's items, and its threads take
// kInFlight items per round (adjacent threads, adjacent items): a thread's items only move
// forward, so it finds each one's gradient by stepping on from the last (no search per group), and
// it issues all kInFlight loads of a round before testing any. The first version searched the 200
// descriptors twice per group, one load after another: its fp32 pass ran at 3.3 TB/s, but its
// 16-bit pass took as long for half the bytes (H100, 1.07B elements: 1.25 ms).
constexpr int kInFlight = 4;

// The ragged end of a gradient, or one not 16-byte aligned: an item element by element (out of
// line, so the hot loop stays small enough to unroll).
__device__ __noinline__ bool ragged_nonfinite(const GpuGrad& g, int64_t i) {
  bool bad = false;
  for (int64_t at = i; at < i + item_elems(g.type); at += 8) {
    float v[8];
    switch (g.type) {
      case ElemType::F32: load8(static_cast<const float*>(g.data), at, g.numel, false, v); break;
      case ElemType::BF16: load8(static_cast<const bf16_t*>(g.data), at, g.numel, false, v); break;
      case ElemType::F16: load8(static_cast<const f16_t*>(g.data), at, g.numel, false, v); break;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) bad |= !finite(v[k]);
  }
  return bad;
}

__global__ void __launch_bounds__(kThreads) finite_kernel(const LOWBIT_GRID_CONSTANT GradChunk c, float* found_inf) {
  const int64_t groups = c.first[c.count];
  const int64_t begin = groups * blockIdx.x / gridDim.x, end = groups * (blockIdx.x + 1) / gridDim.x;
  bool bad = false;
  int j = 0;
  for (int64_t base = begin; base < end; base += int64_t(kThreads) * kInFlight) {
    // Where each group is, first; then every wide load; then the tests.
    const char* at[kInFlight];
    int of[kInFlight];
    int64_t elem[kInFlight];
    bool wide[kInFlight], in_range[kInFlight];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      const int64_t item = base + int64_t(u) * kThreads + threadIdx.x;
      in_range[u] = item < end;
      if (in_range[u])
        while (j + 1 < c.count && c.first[j + 1] <= item) ++j;
      const GpuGrad& g = c.g[j];
      of[u] = j;
      const int n = item_elems(g.type);
      elem[u] = (item - c.first[j]) * n;
      wide[u] = in_range[u] && g.aligned != 0 && elem[u] + n <= g.numel;
      at[u] = static_cast<const char*>(g.data) + (item - c.first[j]) * kItemBytes;
    }
    uint4 raw[kInFlight][2];
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      raw[u][0] = wide[u] ? *reinterpret_cast<const uint4*>(at[u]) : make_uint4(0, 0, 0, 0);  // zeros are finite
      raw[u][1] = wide[u] ? *reinterpret_cast<const uint4*>(at[u] + 16) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kInFlight; ++u) {
      bad |= any_nonfinite(c.g[of[u]].type, raw[u][0], raw[u][1]);
      if (in_range[u] && !wide[u]) bad |= ragged_nonfinite(c.g[of[u]], elem[u]);
    }
  }
  if (bad) *found_inf = 1.0f;  // every writer writes the same value
}

// 16 lanes per chunk of kGradChunk elements; two chunks per warp per round.
__global__ void __launch_bounds__(kThreads) sumsq_kernel(const LOWBIT_GRID_CONSTANT GradChunk c, double* chunk_sums,
                                                         float* found_inf) {
  const int64_t chunks = c.first[c.count];
  const int64_t warps = int64_t(gridDim.x) * (kThreads / 32);
  const int j16 = threadIdx.x % 16;
  for (int64_t pair = int64_t(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32; 2 * pair < chunks; pair += warps) {
    const int64_t item = 2 * pair + (threadIdx.x / 16) % 2;
    double acc = 0.0;
    bool bad = false;
    if (item < chunks) {
      const int gi = grad_of(c, item);
      const GpuGrad& g = c.g[gi];
      const int64_t begin = (item - c.first[gi]) * kGradChunk;
      const int64_t len = g.numel - begin < kGradChunk ? g.numel - begin : kGradChunk;
      for (int64_t m = j16; m < len; m += 16) {
        const float x = load_any(g, begin + m);
        bad |= !finite(x);
        const double d = x;
        acc += d * d;
      }
    }
    double s = 0.0;
    for (int q = 0; q < 16; ++q) s += LOWBIT_SHFL(acc, q, 16);
    if (j16 == 0 && item < chunks) chunk_sums[item] = s;
    if (bad) *found_inf = 1.0f;
  }
}

// One thread per gradient adds its chunks in order; then thread 0 adds the gradients into their
// groups in order.
__global__ void group_sums_kernel(const LOWBIT_GRID_CONSTANT GradChunk c, const double* chunk_sums, double* sumsq) {
  __shared__ double grad_sum[kGrads];
  for (int i = threadIdx.x; i < c.count; i += blockDim.x) {
    double s = 0.0;
    for (int64_t k = c.first[i]; k < c.first[i + 1]; ++k) s += chunk_sums[k];
    grad_sum[i] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int i = 0; i < c.count; ++i) sumsq[c.g[i].group] += grad_sum[i];
}

int grid_for(int64_t work, int per_block) {
  DeviceInfo dev;
  if (query_device(&dev) != cudaSuccess) dev.sm_count = 1;
  const int64_t wanted = (work + per_block - 1) / per_block;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, int64_t(dev.sm_count) * 8)));
}

}  // namespace

size_t grad_check_scratch_bytes(const GpuGrad* grads, int64_t n, bool want_sumsq) {
  if (!want_sumsq) return 16;
  int64_t most = 0;
  for (int64_t first = 0; first < n; first += kGrads) {
    int64_t chunks = 0;
    for (int64_t i = first; i < std::min<int64_t>(n, first + kGrads); ++i)
      chunks += (grads[i].numel + kGradChunk - 1) / kGradChunk;
    most = std::max(most, chunks);
  }
  return static_cast<size_t>(most) * sizeof(double) + 16;
}

const char* grad_check_gpu(const GpuGrad* grads, int64_t n, bool want_sumsq, float* found_inf, double* sumsq,
                           void* scratch, void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  GradChunk c;
  for (int64_t first = 0; first < n; first += kGrads) {
    c.count = static_cast<int>(std::min<int64_t>(kGrads, n - first));
    c.first[0] = 0;
    for (int i = 0; i < c.count; ++i) {
      c.g[i] = grads[first + i];
      const int64_t unit = want_sumsq ? kGradChunk : item_elems(c.g[i].type);
      c.first[i + 1] = c.first[i] + (c.g[i].numel + unit - 1) / unit;
    }
    if (c.first[c.count] == 0 && !want_sumsq) continue;
    if (want_sumsq) {
      double* chunk_sums = static_cast<double*>(scratch);
      if (c.first[c.count] > 0)
        sumsq_kernel<<<grid_for(c.first[c.count], 2 * kThreads / 32), kThreads, 0, s>>>(c, chunk_sums, found_inf);
      group_sums_kernel<<<1, kThreads, 0, s>>>(c, chunk_sums, sumsq);
    } else {
      finite_kernel<<<grid_for(c.first[c.count], kThreads * kInFlight), kThreads, 0, s>>>(c, found_inf);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cudaGetErrorString(e);
  }
  return nullptr;
}

}  // namespace kernels
}  // namespace lowbit
