// What training holds per parameter, by kind, as an optimizer sees it: weights, gradients,
// optimizer state and master-weight corrections (LowbitOptimizer::memory_report). Activations and
// allocator slack are not the optimizer's to know: the GPT example reads those from the allocator.
#pragma once

#include <cstdint>
#include <string>

namespace lowbit {
namespace optim {

struct MemoryReport {
  int64_t parameters = 0;        // elements of the distinct parameters
  int64_t weight_bytes = 0;      // the parameters themselves
  int64_t gradient_bytes = 0;    // their .grad tensors at the time of the report
  int64_t state_bytes = 0;       // moments and buffers: codes + absmax, or dense
  int64_t correction_bytes = 0;  // master-weight corrections (master_weight_bits)

  int64_t total_bytes() const { return weight_bytes + gradient_bytes + state_bytes + correction_bytes; }
  // bytes / parameters (0 without parameters).
  double per_parameter(int64_t bytes) const { return parameters ? double(bytes) / double(parameters) : 0.0; }
  // One line per kind: "weights 2147483648 B (2.00 B/param)", ..., then the total.
  std::string to_string() const;
};

}  // namespace optim
}  // namespace lowbit
