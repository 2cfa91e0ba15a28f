// inspect_checkpoint (inspect.h).
#include "inspect.h"

#include <cstdarg>
#include <cstdio>
#include <sstream>

#include "../lowbit.h"
#include "../optim/checkpoint_reader.h"

namespace lowbit {
namespace tools {

namespace {
std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}
}  // namespace

void inspect_checkpoint(const std::string& path, std::ostream& out) {
  torch::serialize::InputArchive a;
  optim::load_checkpoint_archive(path, a);
  const optim::CheckpointContents c = optim::read_checkpoint(a, path);
  // Everything is checked: print into a buffer first, so a damaged file prints nothing but the error.
  std::ostringstream s;
  s << fmt("%s: %s checkpoint, format version %lld, %lld skipped steps\n", path.c_str(), c.optimizer.c_str(),
           (long long)c.version, (long long)c.skipped_steps);
  s << fmt("%-10s %10s %6s %-6s %6s  %s\n", "param", "numel", "step", "state", "block", "slots (storage: bytes)");
  int64_t total = 0, params = 0, elems = 0;
  for (size_t g = 0; g < c.groups.size(); ++g) {
    const auto& group = c.groups[g];
    s << fmt("group %zu: %zu parameters, lr %g\n", g, group.params.size(), group.lr);
    for (size_t i = 0; i < group.params.size(); ++i) {
      const auto& p = group.params[i];
      const std::string id = std::to_string(g) + "/" + std::to_string(i);
      ++params;
      elems += p.numel;
      if (!p.has_state) {
        s << fmt("%-10s %10lld   (no state yet)\n", id.c_str(), (long long)p.numel);
        continue;
      }
      std::string slots;
      for (const auto& slot : p.slots) {
        if (slot.storage < 0) {
          slots += " -";
          continue;
        }
        const bool q = slot.quantized.defined();
        const int64_t bytes = q ? slot.quantized.nbytes() : static_cast<int64_t>(slot.values.nbytes());
        total += bytes;
        slots += std::string(" ") +
                 (q ? format_name(static_cast<QuantFormat>(slot.qformat))
                    : slot.storage == optim::kStorageInt16Correction ? "master-int16"
                    : slot.storage == optim::kStorageInt8Correction  ? "master-int8"
                                                              : state_format_name(optim::state_format_of_storage(slot.storage))) +
                 ":" + std::to_string(bytes);
      }
      s << fmt("%-10s %10lld %6lld %-6s %6lld %s\n", id.c_str(), (long long)p.numel, (long long)p.step,
               state_format_name(static_cast<StateFormat>(p.format)), (long long)p.block_size, slots.c_str());
    }
  }
  s << fmt("total: %lld parameters, %lld elements, %lld bytes of state (%.3f B/element; fp32 Adam: 8)\n",
           (long long)params, (long long)elems, (long long)total, elems ? double(total) / elems : 0.0);
  out << s.str();
}

}  // namespace tools
}  // namespace lowbit
