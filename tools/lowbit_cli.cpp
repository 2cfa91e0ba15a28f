// The `lowbit` command: build info, codebooks, checkpoint inspection (tools/inspect.h).
// Bad arguments (an unknown command, a missing or extra argument, an unknown format, a file that
// is not there) end with exit status 2 and one line naming the argument and its value.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "../lowbit.h"

#include "inspect.h"

namespace {

int usage(std::ostream& out) {
  out << "usage: lowbit info              version, libtorch version, compiled backends\n"
         "       lowbit codebook FORMAT   decoded value of each code, one per line\n"
         "       lowbit inspect FILE      what an optimizer checkpoint holds\n"
         "FORMAT: "
      << lowbit::all_format_names() << "\n";
  return 2;
}

// A bad argument: what is wrong on one line, then the usage.
int bad_argument(const std::string& what) {
  std::cerr << "lowbit: " << what << "\n";
  return usage(std::cerr);
}

int print_codebook(const std::string& name) {
  lowbit::QuantFormat f;
  if (!lowbit::parse_format(name, &f))
    return bad_argument("codebook: FORMAT '" + name + "' is an unknown quantization format; expected one of " +
                        lowbit::all_format_names());
  const at::Tensor cb = lowbit::codebook(f);
  const float* v = cb.data_ptr<float>();
  for (int64_t i = 0; i < cb.numel(); ++i) std::printf("%.9g\n", static_cast<double>(v[i]));
  return 0;
}

int inspect(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (path.empty()) return bad_argument("inspect: FILE is empty");
  if (!std::filesystem::exists(st)) return bad_argument("inspect: FILE '" + path + "' does not exist");
  if (std::filesystem::is_directory(st)) return bad_argument("inspect: FILE '" + path + "' is a directory");
  lowbit::tools::inspect_checkpoint(path, std::cout);
  return 0;
}

// The command's arguments: exactly `want` of them (named `names`), or a message saying which.
bool arity(const std::string& cmd, int got, int want, const char* names, int* rc, char** extra) {
  if (got == want) return true;
  *rc = got < want ? bad_argument(cmd + ": missing " + names)
                   : bad_argument(cmd + ": unexpected argument '" + std::string(extra[want]) + "'");
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return bad_argument("missing command (info, codebook or inspect)");
  const std::string cmd = argv[1];
  const int nargs = argc - 2;
  char** args = argv + 2;
  int rc = 2;
  try {
    if (cmd == "info") {
      if (!arity(cmd, nargs, 0, "", &rc, args)) return rc;
      std::cout << lowbit::build_info();
      return 0;
    }
    if (cmd == "codebook") return arity(cmd, nargs, 1, "FORMAT", &rc, args) ? print_codebook(args[0]) : rc;
    if (cmd == "inspect") return arity(cmd, nargs, 1, "FILE", &rc, args) ? inspect(args[0]) : rc;
    if (cmd == "--help" || cmd == "-h" || cmd == "help") {
      usage(std::cout);
      return 0;
    }
  } catch (const c10::Error& e) {
    std::cerr << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lowbit: " << e.what() << "\n";
    return 1;
  }
  return bad_argument("unknown command '" + cmd + "' (expected info, codebook or inspect)");
}
