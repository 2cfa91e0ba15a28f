// The order in which the gradient pre-pass adds squares (clipping's norm), shared by the CPU and
// GPU kernels so both produce the same bits: per chunk of kGradChunk elements of a gradient, 16
// double partial sums (partial j takes elements j, j + 16, ... in order), the partials added in
// order; a gradient's chunks added in order; the gradients added into their group in order.
#pragma once

#include <cstdint>

namespace lowbit {
namespace kernels {

constexpr int64_t kGradChunk = 8192;

}  // namespace kernels
}  // namespace lowbit
