// What this build of lowbit holds: version, the libtorch it was built against, compiled backends.
#pragma once

#include <string>

namespace lowbit {

// Multi-line, human-readable; `lowbit info` prints it.
std::string build_info();
// "0.1.0"
const char* version();

}  // namespace lowbit
