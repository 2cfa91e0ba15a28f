// The `lowbit` command: build info, codebooks, checkpoint inspection (tools/inspect.h).
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <lowbit/lowbit.h>

#include "inspect.h"

namespace {

int usage() {
  std::cerr << "usage: lowbit info              version, libtorch version, compiled backends\n"
               "       lowbit codebook FORMAT   decoded value of each code, one per line\n"
               "       lowbit inspect FILE      what an optimizer checkpoint holds\n"
               "FORMAT: "
            << lowbit::all_format_names() << "\n";
  return 2;
}

int print_codebook(const std::string& name) {
  const lowbit::QuantFormat f = lowbit::format_from_name(name);
  const at::Tensor cb = lowbit::codebook(f);
  const float* v = cb.data_ptr<float>();
  for (int64_t i = 0; i < cb.numel(); ++i) std::printf("%.9g\n", static_cast<double>(v[i]));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  try {
    if (cmd == "info" && argc == 2) {
      std::cout << lowbit::build_info();
      return 0;
    }
    if (cmd == "codebook" && argc == 3) return print_codebook(argv[2]);
    if (cmd == "inspect" && argc == 3) {
      lowbit::tools::inspect_checkpoint(argv[2], std::cout);
      return 0;
    }
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      usage();
      return 0;
    }
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lowbit: " << e.what() << "\n";
    return 1;
  }
  return usage();
}
