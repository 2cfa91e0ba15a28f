// Per-format tables passed to the GPU kernels by value (2.3 KB of kernel parameters) and staged in
// shared memory, so no global constant memory needs managing per device.
#pragma once

#include <mutex>

#include "../common/code_tables.h"

namespace lowbit {
namespace kernels {

struct GpuTables {
  float eytzinger[256];     // encode: thresholds as a breadth-first BST (index 1..)
  uint8_t sorted_codes[256];
  float codebook[256];      // decode: value of each code
};

inline const GpuTables& gpu_tables(QuantFormat fmt) {
  static GpuTables tables[kNumQuantFormats];
  static std::once_flag once[kNumQuantFormats];
  const int i = static_cast<int>(fmt);
  std::call_once(once[i], [&] {
    const EncodeTable enc = make_encode_table(fmt);
    const std::vector<float> cb = make_codebook(fmt);
    GpuTables& t = tables[i];
    for (int k = 0; k < 256; ++k) {
      t.eytzinger[k] = enc.eytzinger[k];
      t.sorted_codes[k] = enc.sorted_codes[k];
      t.codebook[k] = k < static_cast<int>(cb.size()) ? cb[k] : 0.0f;
    }
  });
  return tables[i];
}

// Copies the first `n` floats / bytes of a table into shared memory; the caller syncs.
template <typename T>
__device__ __forceinline__ void stage(T* dst, const T* src, int n) {
  for (int k = threadIdx.x; k < n; k += blockDim.x) dst[k] = src[k];
}

}  // namespace kernels
}  // namespace lowbit
