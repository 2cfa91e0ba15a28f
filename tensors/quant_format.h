// Public names for the quantization formats (lowbit::QuantFormat lives in kernels/common so the
// kernels can share it) and their torch-facing helpers.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "../kernels/common/format_table.h"

namespace lowbit {

// "dyn8signed" / "Dyn8Signed" -> QuantFormat; an unknown name is an error listing the valid ones.
QuantFormat format_from_name(const std::string& name);

// The decoded value of every code, float32 on the CPU: 256 entries for 8-bit formats, 16 for 4-bit.
// A quantized element decodes to codebook[code] * absmax of its block.
at::Tensor codebook(QuantFormat format);

// Resolves block_size 0 to the format's default and checks it; `what` names the caller.
int64_t resolve_block_size(QuantFormat format, int64_t block_size, const char* what);

}  // namespace lowbit
