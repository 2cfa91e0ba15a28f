// Host launchers of the blockwise quantize / dequantize GPU kernels (CUDA, and HIP from the same
// sources). Plain C++ header: no CUDA, HIP or torch types, so any binding can include it.
#pragma once

#include "../common/quantize_params.h"

namespace lowbit {
namespace kernels {

// `stream` is a cudaStream_t (hipStream_t under HIP). Returns nullptr on success, else the runtime's
// error string for the failed launch. Pointers are device pointers on the current device.
const char* quantize_blockwise_gpu(const QuantizeParams& p, void* stream);
const char* dequantize_blockwise_gpu(const DequantizeParams& p, void* stream);

}  // namespace kernels
}  // namespace lowbit
