// The `lowbit` command: build info, codebooks, and (later) checkpoint inspection.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <torch/serialize/input-archive.h>

#include <lowbit/lowbit.h>

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

int64_t get_int(torch::serialize::InputArchive& a, const std::string& key, int64_t fallback = -1) {
  c10::IValue v;
  return a.try_read(key, v) && v.isInt() ? v.toInt() : fallback;
}

// Prints the entries a lowbit optimizer checkpoint holds (see optim/lowbit_optimizer.cpp).
int inspect(const std::string& path) {
  torch::serialize::InputArchive a;
  a.load_from(path);
  c10::IValue name;
  TORCH_CHECK(get_int(a, "lowbit/magic") != -1 && a.try_read("lowbit/optimizer", name),
              path, " is not a lowbit optimizer checkpoint");
  std::printf("%s: %s checkpoint, format version %lld, %lld skipped steps\n", path.c_str(), name.toStringRef().c_str(),
              (long long)get_int(a, "lowbit/version"), (long long)get_int(a, "lowbit/skipped_steps"));
  int64_t total = 0, params = 0, elems = 0;
  const int64_t groups = get_int(a, "lowbit/groups", 0);
  std::printf("%-10s %10s %6s %-6s %6s  %s\n", "param", "numel", "step", "state", "block", "slots (storage: bytes)");
  for (int64_t g = 0; g < groups; ++g) {
    const std::string gk = "group/" + std::to_string(g);
    c10::IValue lr;
    a.try_read(gk + "/lr", lr);
    const int64_t n = get_int(a, gk + "/params", 0);
    std::printf("group %lld: %lld parameters, lr %g\n", (long long)g, (long long)n, lr.isDouble() ? lr.toDouble() : 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const std::string k = "param/" + std::to_string(g) + "/" + std::to_string(i);
      const int64_t numel = get_int(a, k + "/numel");
      ++params;
      elems += numel;
      if (get_int(a, k + "/has_state") != 1) {
        std::printf("%-10s %10lld   (no state yet)\n", (std::to_string(g) + "/" + std::to_string(i)).c_str(), (long long)numel);
        continue;
      }
      const auto fmt = static_cast<lowbit::StateFormat>(get_int(a, k + "/format"));
      std::string slots;
      for (int64_t s = 0; s < get_int(a, k + "/slots", 0); ++s) {
        const std::string sk = k + "/slot/" + std::to_string(s);
        const int64_t storage = get_int(a, sk + "/storage");
        if (storage < 0) {
          slots += " -";
          continue;
        }
        int64_t bytes = 0;
        std::string what;
        if (lowbit::is_quantized(static_cast<lowbit::StateFormat>(storage))) {
          at::Tensor c, m;
          a.read(sk + "/codes", c);
          a.read(sk + "/absmax", m);
          bytes = c.nbytes() + m.nbytes();
          what = lowbit::format_name(static_cast<lowbit::QuantFormat>(get_int(a, sk + "/qformat")));
        } else {
          at::Tensor v;
          a.read(sk + "/values", v);
          bytes = v.nbytes();
          what = lowbit::state_format_name(static_cast<lowbit::StateFormat>(storage));
        }
        total += bytes;
        slots += " " + what + ":" + std::to_string(bytes);
      }
      std::printf("%-10s %10lld %6lld %-6s %6lld %s\n", (std::to_string(g) + "/" + std::to_string(i)).c_str(),
                  (long long)numel, (long long)get_int(a, k + "/step"), lowbit::state_format_name(fmt),
                  (long long)get_int(a, k + "/block_size"), slots.c_str());
    }
  }
  std::printf("total: %lld parameters, %lld elements, %lld bytes of state (%.3f B/element; fp32 Adam: 8)\n",
              (long long)params, (long long)elems, (long long)total, elems ? double(total) / elems : 0.0);
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
    if (cmd == "inspect" && argc == 3) return inspect(argv[2]);
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
