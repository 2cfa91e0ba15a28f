// Random values keyed by element index. Element i of a tensor filled from `first_element` gets a
// value that depends only on (key, first_element + i): never on how a parameter's elements are
// split between calls, on the device, or on the order of the calls. A model initialized this way is
// the same whether one process fills each parameter whole or each rank of a fully sharded job fills
// only its own shard (FullyShardedOptions::initialize), so no process has to build, hold or
// broadcast the whole model.
//
// Only operations that IEEE 754 rounds exactly are used (integer arithmetic, float64 +, -, *, /
// and sqrt; kernels/common/keyed_normal.h): no library log or cos, whose last bit differs between
// CPU and GPU libraries. So the bits are the same on every device and for every split.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace lowbit {

// out[i] (row-major order of out, contiguous or not) = mean + std * z(key, first_element + i),
// z a standard normal: Box-Muller from two 32-bit hashes of the element index, in float64 with
// kernels/common/det_math.h's log and cos (a few ulps), then rounded to out's dtype (float64;
// float32; bfloat16 or float16 through float32). out on the CPU or a GPU; first_element >= 0;
// mean and std finite, std >= 0.
void keyed_normal_(const at::Tensor& out, double mean, double std, uint64_t key, int64_t first_element = 0);

// A key for keyed_normal_ from a name (a parameter's name in its model, "h3.qkv_w") and a seed:
// the same in every process and on every platform.
uint64_t keyed_random_key(const std::string& name, uint64_t seed);

}  // namespace lowbit
