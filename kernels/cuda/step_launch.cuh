// The step kernels' launch: one-wave grids, the kernel of a chunk's parameter dtype, state family,
// warp width, carried slots and companions; LOWBIT_INSTANTIATE_STEP(rule) instantiates a rule's
// launcher (optim_step_<rule>.cu, one file per rule or two, so no file compiles for long).
#pragma once

#include <algorithm>
#include <atomic>

#include "step_kernel.cuh"
#include "step_tuning.cuh"

namespace lowbit {
namespace kernels {
namespace gpu_step {

// The grid of a launch of `kernel` that has work for `wanted` blocks: at most one wave, the blocks
// all SMs hold at once (the kernel's occupancy, queried once per kernel and device). Each warp
// takes an equal run of the launch's units, so the blocks of a single wave end together; a grid
// of several waves (8 blocks per SM: 2.67 waves at 3 resident) ran its last, partial wave at two
// blocks per SM, lower occupancy, alone. The kernel is a template argument, not a function
// pointer's type: each kernel needs its own cache.
template <auto kernel>
int wave_grid(int64_t wanted) {
  constexpr int kDevices = 64;
  static std::atomic<int> cached[kDevices];  // blocks per wave; 0 until queried
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;  // the launch reports the error
  int blocks = dev < kDevices ? cached[dev].load(std::memory_order_relaxed) : 0;
  if (blocks == 0) {
    int sms = 1, resident = 1;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) sms = 1;
    if (Tuning::grid_per_sm > 0) {
      resident = Tuning::grid_per_sm;
    } else if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, kThreads, 0) != cudaSuccess) {
      resident = 1;
    }
    blocks = std::max(1, sms) * std::max(1, resident);
    if (dev < kDevices) cached[dev].store(blocks, std::memory_order_relaxed);
  }
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, blocks)));
}

// Kernels of rule R for one chunk (optim_step_<rule>.cu instantiate it).
// companions: the chunk's Companions (kernels without fixed ones take kAnyCompanions for any).
template <Rule R>
cudaError_t launch_step(const Chunk& chunk, const Args& a, ElemType param_type, int family, int warp, int ns,
                        int companions, int64_t wanted, cudaStream_t stream);
template <Rule R, typename T, int FAMILY, int WARP, int C>
cudaError_t launch_companions(const Chunk& chunk, const Args& a, int ns, int64_t wanted, cudaStream_t stream) {
  constexpr int kMost = RuleMaxSlots<R>::value;
  constexpr int kFewer = rule_has_variant<R>(kMost - 1) ? kMost - 1 : (rule_has_variant<R>(1) ? 1 : kMost);
  if (ns == kMost) {
    constexpr auto kernel = step_kernel<R, T, FAMILY, kMost, WARP, C>;
    kernel<<<wave_grid<kernel>(wanted), kThreads, 0, stream>>>(chunk, a);
  } else if (ns == kFewer) {
    constexpr auto kernel = step_kernel<R, T, FAMILY, kFewer, WARP, C>;
    kernel<<<wave_grid<kernel>(wanted), kThreads, 0, stream>>>(chunk, a);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <Rule R, typename T, int FAMILY, int WARP>
cudaError_t launch_typed(const Chunk& chunk, const Args& a, int ns, int companions, int64_t wanted,
                         cudaStream_t stream) {
  if constexpr (has_fixed_companions<T>(FAMILY)) {
    switch (companions) {
      case kNearest: return launch_companions<R, T, FAMILY, WARP, kNearest>(chunk, a, ns, wanted, stream);
      case kStochastic: return launch_companions<R, T, FAMILY, WARP, kStochastic>(chunk, a, ns, wanted, stream);
      case kMaster24: return launch_companions<R, T, FAMILY, WARP, kMaster24>(chunk, a, ns, wanted, stream);
      case kMaster32: return launch_companions<R, T, FAMILY, WARP, kMaster32>(chunk, a, ns, wanted, stream);
      default: break;
    }
  }
  return launch_companions<R, T, FAMILY, WARP, kAnyCompanions>(chunk, a, ns, wanted, stream);
}

#define LOWBIT_STEP_LAUNCH_FAMILY(R, T, W)                                                      \
  switch (family) {                                                                             \
    case kF32: return launch_typed<R, T, kF32, W>(chunk, a, ns, companions, wanted, stream);                      \
    case kBF16: return launch_typed<R, T, kBF16, W>(chunk, a, ns, companions, wanted, stream);                    \
    case kCodes8: return launch_typed<R, T, kCodes8, W>(chunk, a, ns, companions, wanted, stream);                \
    case kCodes4: return launch_typed<R, T, kCodes4, W>(chunk, a, ns, companions, wanted, stream);                \
  }                                                                                             \
  return cudaErrorInvalidValue;

#define LOWBIT_STEP_LAUNCH_WARP(W)                                                              \
  if (warp == W) {                                                                              \
    switch (param_type) {                                                                       \
      case ElemType::F32: { LOWBIT_STEP_LAUNCH_FAMILY(R, float, W) }                            \
      case ElemType::BF16: { LOWBIT_STEP_LAUNCH_FAMILY(R, bf16_t, W) }                          \
      case ElemType::F16: { LOWBIT_STEP_LAUNCH_FAMILY(R, f16_t, W) }                            \
    }                                                                                           \
  }

#define LOWBIT_INSTANTIATE_STEP(RULE)                                                           \
  template <>                                                                                   \
  cudaError_t launch_step<RULE>(const Chunk& chunk, const Args& a, ElemType param_type, int family, int warp, \
                                int ns, int companions, int64_t wanted, cudaStream_t stream) {  \
    constexpr Rule R = RULE;                                                                    \
    LOWBIT_FOR_EACH_WARP_SIZE(LOWBIT_STEP_LAUNCH_WARP)                                          \
    return cudaErrorInvalidValue;                                                               \
  }

}  // namespace gpu_step
}  // namespace kernels
}  // namespace lowbit
