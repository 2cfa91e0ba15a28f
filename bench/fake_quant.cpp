// bench_fake_quant: fused fake-quant forward + backward against the same math written as separate
// ATen ops in the same run (torchao's eager path), as GB/s of the bytes each pass must move; the
// copy bandwidth of the same tensor as the ceiling; and one training step of a fake-quantized
// Linear layer against the plain layer.
//   bench_fake_quant [--device cpu|cuda] [--rows N] [--cols N] [--reps N]
#include <cmath>
#include <cstdio>
#include <string>

#include <lowbit/lowbit.h>
#include <lowbit/tensors/fake_quant_ops.h>

#include "timing.h"
#include <lowbit/tools/program_args.h>

namespace qat = lowbit::qat;
using at::Tensor;

namespace {

// torchao's eager fake quant, op by op: choose_qparams_affine, quantize_affine, dequantize_affine,
// the STE mask as a bool tensor; backward = grad * mask.
std::tuple<Tensor, Tensor> eager_forward(const Tensor& x, int64_t g, int64_t bits, bool sym) {
  const double qmin = -(1 << (bits - 1)), qmax = (1 << (bits - 1)) - 1;
  const Tensor xg = x.reshape({-1, g}).to(at::kFloat);
  auto [mn, mx] = at::aminmax(xg, 1);
  const Tensor min_neg = at::minimum(mn, at::zeros_like(mn)), max_pos = at::maximum(mx, at::zeros_like(mx));
  Tensor scale, zp;
  if (sym) {
    scale = (at::maximum(-min_neg, max_pos) / ((qmax - qmin) / 2)).clamp_min(FLT_EPSILON);
    zp = at::zeros_like(scale);
  } else {
    scale = ((max_pos - min_neg) / (qmax - qmin)).clamp_min(FLT_EPSILON);
    zp = at::clamp(qmin - at::round(min_neg / scale), qmin, qmax);
  }
  const Tensor q = at::round(xg * (1.0 / scale).unsqueeze(1)) + zp.unsqueeze(1);
  const Tensor mask = at::logical_and(q >= qmin, q <= qmax);
  const Tensor y = ((at::clamp(q, qmin, qmax) - zp.unsqueeze(1)) * scale.unsqueeze(1)).to(x.scalar_type());
  return {y.view(x.sizes()), mask};
}

Tensor eager_backward(const Tensor& grad, const Tensor& mask) { return grad * mask.view(grad.sizes()); }

void sync(bool cuda) {
#ifdef LOWBIT_BENCH_CUDA
  if (cuda) at::cuda::getCurrentCUDAStream().synchronize();
#endif
}

void bench_ops(const std::string& label, const Tensor& x, int64_t g, int64_t bits, bool sym, bool cuda, int reps) {
  const Tensor dy = at::randn_like(x);
  const double n = x.numel(), es = x.element_size();
  // Bytes the fused passes must move: forward reads x, writes y and the bit mask; backward reads
  // dy and the mask, writes dx.
  const double fwd_bytes = n * es * 2 + n / 8, bwd_bytes = n * es * 2 + n / 8;
  Tensor mask;
  static auto fwd = c10::Dispatcher::singleton()
                        .findSchemaOrThrow("lowbit::fake_quant_dynamic", "")
                        .typed<std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, int64_t, int64_t, bool, bool, double)>();
  static auto bwd = c10::Dispatcher::singleton()
                        .findSchemaOrThrow("lowbit::fake_quant_backward", "")
                        .typed<Tensor(const Tensor&, const Tensor&)>();
  const double fused_f = lowbit_bench::time_ms([&] { mask = std::get<1>(fwd.call(x, g, bits, true, sym, FLT_EPSILON)); }, cuda, reps);
  const double fused_b = lowbit_bench::time_ms([&] { bwd.call(dy, mask); }, cuda, reps);
  Tensor emask;
  const double eager_f = lowbit_bench::time_ms([&] { emask = std::get<1>(eager_forward(x, g, bits, sym)); }, cuda, reps);
  const double eager_b = lowbit_bench::time_ms([&] { eager_backward(dy, emask); }, cuda, reps);
  // The alternative to a stored mask: recompute it in backward from x and the qparams. The LSQ
  // backward does that (plus the per-group sums of the qparam gradients, so this is an upper bound).
  static auto lsq = c10::Dispatcher::singleton()
                        .findSchemaOrThrow("lowbit::fake_quant_lsq_backward", "")
                        .typed<std::tuple<Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                                  const Tensor&, int64_t, int64_t, bool, double)>();
  auto [y0, m0, s0, z0] = fwd.call(x, g, bits, true, sym, FLT_EPSILON);
  const double recompute_b = lowbit_bench::time_ms([&] { lsq.call(dy, x, s0, z0, g, bits, true, 1.0); }, cuda, reps);
  Tensor dst = at::empty_like(x);
  const double copy = lowbit_bench::time_ms([&] { dst.copy_(x); }, cuda, reps);
  const double copy_gbs = 2 * n * es / copy / 1e6;
  const double fused_gbs = (fwd_bytes + bwd_bytes) / (fused_f + fused_b) / 1e6;
  std::printf("%-30s fused fwd %7.3f ms bwd %7.3f ms (%6.1f GB/s, %3.0f%% of copy)  eager fwd %7.3f bwd %7.3f ms  speedup %.2fx"
              "  | bwd recomputing the mask %7.3f ms\n",
              label.c_str(), fused_f, fused_b, fused_gbs, 100 * fused_gbs / copy_gbs, eager_f, eager_b,
              (eager_f + eager_b) / (fused_f + fused_b), recompute_b);
  sync(cuda);
}

void bench_linear(int64_t rows, int64_t in, int64_t out, bool cuda, const at::TensorOptions& opts, int reps) {
  torch::manual_seed(0);
  torch::nn::Linear plain(in, out);
  plain->to(opts.device());
  torch::nn::Linear base(in, out);
  base->to(opts.device());
  qat::FakeQuantizedLinear fq(base, qat::FakeQuantConfig::int8_per_token_asymmetric(),
                              qat::FakeQuantConfig::int4_per_group_symmetric(32));
  const Tensor x = at::randn({rows, in}, opts);
  auto step = [&](auto& m) {
    m->zero_grad();
    m->forward(x).sum().backward();
  };
  const double t_plain = lowbit_bench::time_ms([&] { step(plain); }, cuda, reps);
  const double t_fq = lowbit_bench::time_ms([&] { step(fq); }, cuda, reps);
  std::printf("training step, Linear %lldx%lld, %lld tokens: plain %.3f ms, 8da4w fake-quantized %.3f ms (%.2fx)\n",
              (long long)out, (long long)in, (long long)rows, t_plain, t_fq, t_fq / t_plain);
  // Inference: the converted layer dequantizes its packed int4 weight every call, then a float matmul.
  torch::NoGradGuard ng;
  auto q = qat::QuantizedLinearImpl::from_fake_quantized(*fq);
  const double i_plain = lowbit_bench::time_ms([&] { plain->forward(x); }, cuda, reps);
  const double i_fq = lowbit_bench::time_ms([&] { fq->forward(x); }, cuda, reps);
  const double i_q = lowbit_bench::time_ms([&] { q->forward(x); }, cuda, reps);
  std::printf("inference forward: plain %.3f ms, fake-quantized %.3f ms, converted (packed int4, %lld of %lld bytes) %.3f ms\n",
              i_plain, i_fq, (long long)q->weight_bytes(), (long long)(in * out * 4), i_q);
  // The same converted layer through the int8 x int8 matmul (one integer matmul per weight group of 32).
  q->set_int8_matmul(true);
  const double i_int8 = lowbit::qat::int_mm_cuda_shape_ok(rows, 32, out) || !cuda
                            ? lowbit_bench::time_ms([&] { q->forward(x); }, cuda, reps)
                            : NAN;
  const Tensor ref = fq->forward(x);
  const double rel = ((q->forward(x) - ref).abs().max() / ref.abs().max()).item<double>();
  std::printf("inference forward, converted through the int8 x int8 matmul (%s, one per group of 32): %.3f ms "
              "(%.2fx the dequantize path; max |diff| / max |y| vs fake-quant %.2g)\n",
              q->uses_int8_matmul(x) ? (cuda ? "at::_int_mm" : "exact float matmul of the integers") : "fell back to dequantize", i_int8, i_int8 / i_q, rel);
  // Per-channel int8 weights: one integer matmul for the whole layer (torchao's 8da8w).
  torch::nn::Linear base8(in, out);
  base8->to(opts.device());
  qat::FakeQuantizedLinear fq8(base8, qat::FakeQuantConfig::int8_per_token_asymmetric(),
                               qat::FakeQuantConfig::int8_per_channel_symmetric());
  auto q8 = qat::QuantizedLinearImpl::from_fake_quantized(*fq8);
  const double i_q8 = lowbit_bench::time_ms([&] { q8->forward(x); }, cuda, reps);
  q8->set_int8_matmul(true);
  const double i_q8_int = lowbit_bench::time_ms([&] { q8->forward(x); }, cuda, reps);
  std::printf("inference forward, 8da8w per-channel: dequantize path %.3f ms, int8 x int8 matmul %.3f ms (%.2fx)\n", i_q8,
              i_q8_int, i_q8_int / i_q8);
}

}  // namespace

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv,
                               "usage: bench_fake_quant [--device cpu|cuda] [--rows N] [--cols N] [--reps N]\n"
                               "Fused fake-quant ops against the same math as separate ATen ops.\n"))
    return 0;
  std::string device = "cpu";
  int64_t rows = 0, cols = 4096;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_fake_quant: missing value after %s\n", a.c_str());
      return 2;
    }
    if (a == "--device") device = argv[++i];
    else if (a == "--rows") rows = std::stoll(argv[++i]);
    else if (a == "--cols") cols = std::stoll(argv[++i]);
    else if (a == "--reps") reps = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "bench_fake_quant: unknown flag %s (flags: --device --rows --cols --reps)\n", a.c_str());
      return 2;
    }
  }
  const bool cuda = device == "cuda";
#ifndef LOWBIT_BENCH_CUDA
  if (cuda) {
    std::fprintf(stderr, "bench_fake_quant: built without CUDA\n");
    return 2;
  }
#endif
  if (rows == 0) rows = cuda ? 8192 : 1024;
  const auto opts = at::TensorOptions().device(cuda ? at::Device(at::kCUDA) : at::Device(at::kCPU));
  std::printf("bench_fake_quant on %s (%d OpenMP threads), tensors [%lld, %lld], median of %d\n", device.c_str(),
              omp_get_max_threads(), (long long)rows, (long long)cols, reps);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    const Tensor x = at::randn({rows, cols}, opts.dtype(dt));
    const std::string d = c10::toString(dt);
    bench_ops("int8 per-token asym " + d, x, cols, 8, false, cuda, reps);
    bench_ops("int4 per-group(32) sym " + d, x, 32, 4, true, cuda, reps);
  }
  bench_linear(cuda ? 4096 : 512, cuda ? 4096 : 1024, cuda ? 4096 : 1024, cuda, opts, reps);
  return 0;
}
