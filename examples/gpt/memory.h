// Memory accounting: the CUDA caching allocator's statistics (compiled where libtorch has CUDA:
// LOWBIT_GPT_CUDA), the host's peak resident set, and where the bytes went at the peak.
#pragma once

#include <torch/torch.h>

#include <string>

namespace gpt {

struct DeviceMemory {
  bool available = false;  // false on the CPU, or without CUDA in libtorch
  int64_t allocated = 0, reserved = 0, peak_allocated = 0, peak_reserved = 0;
};

DeviceMemory device_memory(at::Device d);
void reset_peak(at::Device d);
void empty_cache(at::Device d);
void synchronize(at::Device d);
int64_t host_peak_rss();  // bytes (getrusage)

// The peak split into weights, gradients, optimizer state, the rest (activations, temporaries)
// and allocator slack (reserved but not allocated). On the CPU: the host's peak resident set.
std::string memory_breakdown(at::Device d, int64_t weight_bytes, int64_t grad_bytes, int64_t state_bytes);

std::string gib(int64_t bytes);  // "1.23 GiB", or "12.3 MiB" below 1 GiB

}  // namespace gpt
