// Per-format tables of the GPU kernels. The small ones travel as kernel parameters (1.8 KB); the
// window start table (16 KiB) lives in device memory, made once per device and format. Kernels
// stage both in shared memory.
#pragma once

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "../common/code_tables.h"
#include "portability.cuh"

namespace lowbit {
namespace kernels {

// Encode by window bucket (encode.h, code_tables.h: make_window_starts): one start lookup and one
// compare per element for every table-coded format.
struct GpuTables {
  float thresholds[257];       // ascending, +0.0 for -0.0, +inf padded
  uint8_t sorted_codes[256];
  float codebook[256];         // decode: value of each code
  bool identity = false;       // sorted_codes[i] == i: the count is the code
};

inline const GpuTables& gpu_tables(QuantFormat fmt) {
  static GpuTables tables[kNumQuantFormats];
  static std::once_flag once[kNumQuantFormats];
  const int i = static_cast<int>(fmt);
  std::call_once(once[i], [&] {
    const EncodeTable enc = make_encode_table(fmt);
    const std::vector<float> cb = make_codebook(fmt);
    GpuTables& t = tables[i];
    for (int k = 0; k < 257; ++k) t.thresholds[k] = k < 256 ? enc.thresholds[k] + 0.0f : INFINITY;
    for (int k = 0; k < 256; ++k) {
      t.sorted_codes[k] = enc.sorted_codes[k];
      t.codebook[k] = k < static_cast<int>(cb.size()) ? cb[k] : 0.0f;
    }
    t.identity = true;
    for (int k = 0; k < enc.num_values; ++k) t.identity &= enc.sorted_codes[k] == k;
  });
  return tables[i];
}

// Everything a fused optimizer step needs of one format, in one device allocation (and, copied,
// in a step kernel's shared memory): the window starts; for each start j, threshold j and the
// codes below and above it (so no code lookup follows the compare); the codebook. A multiple of
// 16 bytes, copied as uint4. Made once per device and format by the first step that uses it (a
// step captured in a CUDA graph must not be that first one). The quantize kernels use its starts.
struct alignas(16) DeviceFormat {
  uint8_t starts[1 << kWindowBucketBits];
  uint2 pairs[256];  // .x: bits of threshold j (+inf past the last); .y: code below | code above << 8
  float codebook[256];
};

inline cudaError_t device_format(QuantFormat fmt, cudaStream_t stream, const DeviceFormat** out) {
  static std::mutex mu;
  static std::map<std::pair<int, int>, DeviceFormat*> cache;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(dev, static_cast<int>(fmt));
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    e = cudaStreamIsCapturing(stream, &capturing);
    if (e != cudaSuccess) return e;
    if (capturing != cudaStreamCaptureStatusNone) return cudaErrorStreamCaptureUnsupported;
    const GpuTables& t = gpu_tables(fmt);
    DeviceFormat host;
    const std::vector<uint8_t> starts = make_window_starts(make_encode_table(fmt));
    std::copy(starts.begin(), starts.end(), host.starts);
    for (int j = 0; j < 256; ++j) {
      uint32_t bits;
      std::memcpy(&bits, &t.thresholds[j], 4);
      host.pairs[j] = make_uint2(bits, t.sorted_codes[j] | (uint32_t(t.sorted_codes[j < 255 ? j + 1 : j]) << 8));
    }
    std::copy(t.codebook, t.codebook + 256, host.codebook);
    DeviceFormat* d = nullptr;
    e = cudaMalloc(reinterpret_cast<void**>(&d), sizeof(DeviceFormat));
    if (e != cudaSuccess) return e;
    e = cudaMemcpy(d, &host, sizeof(DeviceFormat), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return e;
    it = cache.emplace(key, d).first;
  }
  *out = it->second;
  return cudaSuccess;
}

// The window starts of `fmt` on the current device (made on first use, kept for the process).
inline cudaError_t device_window_starts(QuantFormat fmt, const uint8_t** out) {
  const DeviceFormat* d = nullptr;
  const cudaError_t e = device_format(fmt, nullptr, &d);
  if (e == cudaSuccess) *out = d->starts;
  return e;
}

// Copies n elements into shared memory, block-strided; the caller syncs.
template <typename T>
__device__ __forceinline__ void stage(T* dst, const T* src, int n) {
  for (int k = threadIdx.x; k < n; k += blockDim.x) dst[k] = src[k];
}

}  // namespace kernels
}  // namespace lowbit
