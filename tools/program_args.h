// What every program of the repository (examples, benches, tools) does with its command line
// before its own flags: `--help` / `-h` prints the usage and ends the program with status 0, and
// a number argument that is not one ends it with status 2 and a message naming the argument.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace lowbit_tools {

// Prints `usage` (to stdout) and returns true where any argument is --help or -h.
inline bool wants_help(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(usage, stdout);
      return true;
    }
  }
  return false;
}

// argv[i] as an integer >= min, or the program ends naming `what`, the text and the usage.
inline long long int_arg(const char* text, const char* what, long long min, const char* usage) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || v < min) {
    std::fprintf(stderr, "%s must be an integer >= %lld, got '%s'\n%s", what, min, text, usage);
    std::exit(2);
  }
  return v;
}

}  // namespace lowbit_tools
