// MemoryReport::to_string (memory_report.h) and LowbitOptimizer::memory_report.
#include "memory_report.h"

#include <cstdio>
#include <unordered_set>

#include "lowbit_optimizer.h"

namespace lowbit {
namespace optim {

std::string MemoryReport::to_string() const {
  std::string out;
  const auto line = [&](const char* kind, int64_t bytes) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%-12s %16lld B  (%.3f B/param)\n", kind, static_cast<long long>(bytes),
                  per_parameter(bytes));
    out += buf;
  };
  line("weights", weight_bytes);
  line("gradients", gradient_bytes);
  line("state", state_bytes);
  line("correction", correction_bytes);
  line("total", total_bytes());
  return out;
}

MemoryReport LowbitOptimizer::memory_report() const {
  MemoryReport r;
  std::unordered_set<c10::TensorImpl*> seen;  // a parameter in two groups (tied weights) counts once
  for (const auto& group : param_groups_) {
    for (const at::Tensor& p : group.params()) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
      r.parameters += p.numel();
      r.weight_bytes += static_cast<int64_t>(p.nbytes());
      if (p.grad().defined()) r.gradient_bytes += static_cast<int64_t>(p.grad().nbytes());
      if (const ParamState* st = state_of(p)) {
        for (const StateSlot& s : st->slots) {
          if (kernels::is_correction(s.type.storage)) r.correction_bytes += s.nbytes();
          else r.state_bytes += s.nbytes();
        }
      }
    }
  }
  return r;
}

}  // namespace optim
}  // namespace lowbit
