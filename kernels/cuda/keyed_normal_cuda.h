// Host launcher of the keyed normal fill on GPUs (kernels/common/keyed_normal.h; CUDA, and HIP
// from the same source). Plain C++ header: no CUDA, HIP or torch types.
#pragma once

#include "../common/keyed_normal.h"

namespace lowbit {
namespace kernels {

// `stream` is a cudaStream_t (hipStream_t under HIP); p.out a device pointer on the current
// device. Returns nullptr on success, else the runtime's error string.
const char* keyed_normal_gpu(const KeyedNormalParams& p, void* stream);

}  // namespace kernels
}  // namespace lowbit
