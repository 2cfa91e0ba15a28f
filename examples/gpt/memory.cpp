// Memory statistics. The CUDA allocator's headers come with any CUDA build of libtorch (the wheel
// has them even where lowbit's own CUDA kernels are off); a CPU-only libtorch compiles without.
#include "memory.h"

#include <sys/resource.h>

#include <cstdio>
#include <sstream>

#if LOWBIT_GPT_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace gpt {

std::string gib(int64_t bytes) {
  char s[32];
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t(1) << 30) || bytes <= -(int64_t(1) << 30)) std::snprintf(s, sizeof s, "%.2f GiB", b / (1 << 30));
  else std::snprintf(s, sizeof s, "%.1f MiB", b / (1 << 20));
  return s;
}

DeviceMemory device_memory(at::Device d) {
  DeviceMemory m;
#if LOWBIT_GPT_CUDA
  if (d.is_cuda()) {
    const auto idx = d.has_index() ? d.index() : c10::cuda::current_device();
    const auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(idx);
    constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.available = true;
    m.allocated = s.allocated_bytes[kAll].current;
    m.reserved = s.reserved_bytes[kAll].current;
    m.peak_allocated = s.allocated_bytes[kAll].peak;
    m.peak_reserved = s.reserved_bytes[kAll].peak;
  }
#endif
  (void)d;
  return m;
}

void reset_peak(at::Device d) {
#if LOWBIT_GPT_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.has_index() ? d.index() : c10::cuda::current_device());
#endif
  (void)d;
}

void empty_cache(at::Device d) {
#if LOWBIT_GPT_CUDA
  if (d.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  (void)d;
}

void synchronize(at::Device d) {
#if LOWBIT_GPT_CUDA
  if (d.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)d;
}

int64_t host_peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

std::string memory_breakdown(at::Device d, int64_t weight_bytes, int64_t grad_bytes, int64_t state_bytes) {
  std::ostringstream s;
  const DeviceMemory m = device_memory(d);
  if (!m.available) {
    s << "memory: weights " << gib(weight_bytes) << ", gradients " << gib(grad_bytes) << ", optimizer state "
      << gib(state_bytes) << "; host peak resident set " << gib(host_peak_rss());
    return s.str();
  }
  const int64_t other = m.peak_allocated - weight_bytes - grad_bytes - state_bytes;
  s << "memory at the peak (CUDA caching allocator): peak allocated " << gib(m.peak_allocated) << " = weights "
    << gib(weight_bytes) << " + gradients " << gib(grad_bytes) << " + optimizer state " << gib(state_bytes)
    << " + activations and temporaries " << gib(other) << "; peak reserved " << gib(m.peak_reserved)
    << " (allocator slack " << gib(m.peak_reserved - m.peak_allocated) << ")";
  return s.str();
}

}  // namespace gpt
