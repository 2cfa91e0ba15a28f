// Timing helpers for bench/: medians of repeated runs, device events on the GPU.
#pragma once

#include <omp.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <vector>

#ifdef LOWBIT_BENCH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace lowbit_bench {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Milliseconds of one memcpy of `bytes`, each OpenMP thread copying its contiguous share.
inline double parallel_memcpy_ms(char* dst, const char* src, int64_t bytes) {
  const double t0 = now_ms();
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t lo = bytes * t / nt, hi = bytes * (t + 1) / nt;
    std::memcpy(dst + lo, src + lo, hi - lo);
  }
  return now_ms() - t0;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Median milliseconds of `reps` runs of fn after `warmup` runs.
inline double time_ms(const std::function<void()>& fn, bool cuda, int reps = 20, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
#ifdef LOWBIT_BENCH_CUDA
  if (cuda) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    for (int i = 0; i < reps; ++i) {
      start.record();
      fn();
      stop.record();
      stop.synchronize();
      ms.push_back(start.elapsed_time(stop));
    }
    return median(ms);
  }
#endif
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    if (cuda) torch::cuda::synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return median(ms);
}

}  // namespace lowbit_bench
