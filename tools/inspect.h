// `lowbit inspect FILE`: what an optimizer checkpoint holds, read and checked by the same reader
// as LowbitOptimizer::load (optim/checkpoint_reader.h).
#pragma once

#include <ostream>
#include <string>

namespace lowbit {
namespace tools {

// Prints the checkpoint's entries to `out`; throws c10::Error (nothing printed) if it is damaged.
void inspect_checkpoint(const std::string& path, std::ostream& out);

}  // namespace tools
}  // namespace lowbit
