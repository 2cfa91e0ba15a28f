// quant_table: quantizes real data (Fashion-MNIST training images) in every lowbit format and prints
// the error and the bytes each one takes.
//   quant_table [--dir DIR] [--device cpu|cuda] [--block N]
#include <lowbit/lowbit.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "../idx_reader.h"
#include <lowbit/tools/program_args.h>

constexpr const char* kUsage =
    "usage: quant_table [--dir DIR] [--device cpu|cuda] [--block N]\n"
    "Each state format's quantization error on real AdamW moments, as a table.\n";

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv, kUsage)) return 0;
  std::string dir = lowbit_examples::kFashionMnistDir, device = "cpu";
  int64_t block = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--device" && i + 1 < argc) device = argv[++i];
    else if (a == "--block" && i + 1 < argc) block = lowbit_tools::int_arg(argv[++i], "--block", 0, kUsage);
    else {
      std::fprintf(stderr, "quant_table: unknown flag or missing value: %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  try {
    const at::Tensor images = lowbit_examples::read_idx_gz(dir + "/train-images-idx3-ubyte.gz");
    // Unsigned formats get pixel intensities in [0, 1]; signed ones the mean-centred images, which
    // look like the optimizer states they are made for (both signs, many small values).
    const at::Tensor pixels = (images.to(at::kFloat) / 255).to(at::Device(device));
    const at::Tensor centred = pixels - pixels.mean(0, /*keepdim=*/true);
    std::printf("Fashion-MNIST training images: %lld values, fp32 %.1f MB, device %s\n\n",
                static_cast<long long>(pixels.numel()), pixels.numel() * 4 / 1e6, device.c_str());
    std::printf("%-16s %-9s %6s %10s %8s %12s %12s %9s %9s\n", "format", "data", "block", "MB", "B/value",
                "max err/amax", "rms err", "SNR dB", "ms");
    for (int fi = 0; fi < lowbit::kNumQuantFormats; ++fi) {
      const auto f = static_cast<lowbit::QuantFormat>(fi);
      const bool is_signed = lowbit::format_is_signed(f);
      const at::Tensor& x = is_signed ? centred : pixels;
      const auto t0 = std::chrono::steady_clock::now();
      const lowbit::QTensor q = lowbit::quantize(x, f, block);
      const at::Tensor y = q.dequantize();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const at::Tensor err = (y - x).view(-1);
      const int64_t b = q.block_size();
      const at::Tensor scale = q.absmax().repeat_interleave(b).narrow(0, 0, x.numel()).clamp_min(1e-30);
      const double max_rel = (err.abs() / scale).max().item<double>();
      const double rms = err.pow(2).mean().sqrt().item<double>();
      const double snr = 10 * std::log10(x.pow(2).mean().item<double>() / err.pow(2).mean().item<double>());
      std::printf("%-16s %-9s %6lld %10.2f %8.3f %12.5f %12.6f %9.1f %9.1f\n", lowbit::format_name(f),
                  is_signed ? "centred" : "pixels", static_cast<long long>(b), q.nbytes() / 1e6,
                  double(q.nbytes()) / x.numel(), max_rel, rms, snr, ms);
    }
    std::printf("\nfp32 takes 4 B/value. B/value counts codes plus one fp32 absmax per block.\n");
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "quant_table: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
