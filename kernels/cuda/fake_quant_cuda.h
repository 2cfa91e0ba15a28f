// Host launchers of the fake-quant GPU kernels (CUDA, and HIP from the same sources). Plain C++
// header: no CUDA, HIP or torch types, so any binding can include it.
#pragma once

#include "../common/fake_quant_params.h"

namespace lowbit {
namespace kernels {

// `stream` is a cudaStream_t (hipStream_t under HIP). Returns nullptr on success, else the runtime's
// error string. Pointers are device pointers on the current device.
const char* fake_quant_gpu(const FakeQuantParams& p, void* stream);
const char* fake_quant_float8_gpu(const Float8FakeQuantParams& p, void* stream);
const char* fake_quant_block_float_gpu(const BlockFloatParams& p, void* stream);
const char* fake_quant_backward_gpu(const FakeQuantBackwardParams& p, void* stream);
const char* fake_quant_lsq_backward_gpu(const LsqBackwardParams& p, void* stream);

}  // namespace kernels
}  // namespace lowbit
