// keyed_normal_gpu (keyed_normal_cuda.h): a grid-stride loop, one element per thread and turn.
#include "keyed_normal_cuda.h"

#include <algorithm>

#include "portability.cuh"

namespace lowbit {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;

__global__ void keyed_normal_kernel(KeyedNormalParams p) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += stride)
    keyed_normal_store(p, i);
}

}  // namespace

const char* keyed_normal_gpu(const KeyedNormalParams& p, void* stream) {
  if (p.n == 0) return nullptr;
  const int64_t blocks = std::min<int64_t>((p.n + kThreads - 1) / kThreads, kMaxBlocks);
  keyed_normal_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace kernels
}  // namespace lowbit
