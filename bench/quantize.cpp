// bench/quantize: GB/s of blockwise quantize and dequantize per format, against a copy of the same
// bytes in the same run. Bytes counted = bytes read + bytes written.
//   quantize  <n> [cpu|cuda] [reps]    default n: 2^28 on cuda, 2^26 on cpu
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <lowbit/kernels/cpu/quantize_cpu.h>
#include <lowbit/lowbit.h>
#ifdef LOWBIT_BENCH_CUDA
#include <lowbit/kernels/cuda/quantize_cuda.h>
#endif

#include "timing.h"
#include <lowbit/tools/program_args.h>

namespace lk = lowbit::kernels;

constexpr const char* kUsage =
    "usage: bench_quantize [N [cpu|cuda [REPS]]]\n"
    "Blockwise quantize / dequantize of N float32 values, every format, against the ATen reference.\n";

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv, kUsage)) return 0;
  const std::string dev = argc > 2 ? argv[2] : (torch::cuda::is_available() ? "cuda" : "cpu");
  const bool cuda = dev == "cuda";
  const int64_t n = argc > 1 ? lowbit_tools::int_arg(argv[1], "N", 1, kUsage) : (cuda ? (int64_t(1) << 28) : (int64_t(1) << 26));
  const int reps = argc > 3 ? static_cast<int>(lowbit_tools::int_arg(argv[3], "REPS", 1, kUsage)) : 20;
#ifndef LOWBIT_BENCH_CUDA
  if (cuda) {
    std::fprintf(stderr, "bench built without CUDA\n");
    return 1;
  }
#endif
  const auto opts = at::TensorOptions().device(cuda ? at::kCUDA : at::kCPU);
  const at::Tensor x = at::randn({n}, opts.dtype(at::kFloat));
  const at::Tensor xpos = x.abs();
  at::Tensor copy_dst = at::empty_like(x);

  // Baseline: a copy of the fp32 tensor (4n read + 4n written).
  const double copy_ms = lowbit_bench::time_ms(
      [&] {
        if (cuda) {
          copy_dst.copy_(x);
        } else {
          const char* src = static_cast<const char*>(x.data_ptr());
          char* dst = static_cast<char*>(copy_dst.data_ptr());
          const int64_t bytes = n * 4;
#pragma omp parallel
          {
            const int t = omp_get_thread_num(), nt = omp_get_num_threads();
            const int64_t lo = bytes * t / nt, hi = bytes * (t + 1) / nt;
            std::memcpy(dst + lo, src + lo, hi - lo);
          }
        }
      },
      cuda, reps);
  const double copy_gbs = 8.0 * n / copy_ms / 1e6;
  std::printf("device %s  n %lld  threads %d\n", dev.c_str(), static_cast<long long>(n), cuda ? 0 : omp_get_max_threads());
  std::printf("%-16s %-10s %10s %10s %10s\n", "format", "op", "ms", "GB/s", "% copy");
  std::printf("%-16s %-10s %10.3f %10.1f %10.1f\n", "fp32", "copy", copy_ms, copy_gbs, 100.0);

  for (int fi = 0; fi < lowbit::kNumQuantFormats; ++fi) {
    const auto f = static_cast<lowbit::QuantFormat>(fi);
    const int64_t block = lowbit::default_block_size(f);
    const at::Tensor& in = lowbit::format_is_signed(f) ? x : xpos;
    at::Tensor codes = at::empty({lowbit::code_bytes(f, n)}, opts.dtype(at::kByte));
    at::Tensor absmax = at::empty({lowbit::num_blocks(n, block)}, opts.dtype(at::kFloat));
    at::Tensor out = at::empty({n}, opts.dtype(at::kFloat));
    lk::QuantizeParams qp;
    qp.input = in.data_ptr();
    qp.n = n;
    qp.block_size = block;
    qp.format = f;
    qp.codes = codes.data_ptr<uint8_t>();
    qp.absmax = absmax.data_ptr<float>();
    lk::DequantizeParams dp;
    dp.codes = qp.codes;
    dp.absmax = qp.absmax;
    dp.n = n;
    dp.block_size = block;
    dp.format = f;
    dp.output = out.data_ptr();
    std::function<void()> q, d;
    if (cuda) {
#ifdef LOWBIT_BENCH_CUDA
      void* stream = at::cuda::getCurrentCUDAStream().stream();
      q = [&, stream] { TORCH_CHECK(lk::quantize_blockwise_gpu(qp, stream) == nullptr); };
      d = [&, stream] { TORCH_CHECK(lk::dequantize_blockwise_gpu(dp, stream) == nullptr); };
#endif
    } else {
      q = [&] { lk::quantize_blockwise_cpu(qp); };
      d = [&] { lk::dequantize_blockwise_cpu(dp); };
    }
    const double qbytes = 4.0 * n + codes.numel() + 4.0 * absmax.numel();
    const double qms = lowbit_bench::time_ms(q, cuda, reps);
    const double dms = lowbit_bench::time_ms(d, cuda, reps);
    // Sanity: the benchmarked kernels computed a real round trip.
    const double err = ((out - in).abs().max() / in.abs().max()).item<double>();
    TORCH_CHECK(err < 0.2, "round trip error ", err, " for ", lowbit::format_name(f));
    const double qgbs = qbytes / qms / 1e6, dgbs = qbytes / dms / 1e6;
    std::printf("%-16s %-10s %10.3f %10.1f %10.1f\n", lowbit::format_name(f), "quantize", qms, qgbs, 100 * qgbs / copy_gbs);
    std::printf("%-16s %-10s %10.3f %10.1f %10.1f\n", lowbit::format_name(f), "dequantize", dms, dgbs, 100 * dgbs / copy_gbs);
  }
  return 0;
}
