// How much each state format loses of a real optimizer state: an MLP trained on Fashion-MNIST with
// fp32 AdamW, or the moments the GPT example saved (gpt --state-format FP32 --save-moments FILE);
// at a few steps the moments (exp_avg m, exp_avg_sq v) are quantized in each format and decoded,
// and we compare what the update uses, u = m_hat / (sqrt(v_hat) + eps), against fp32. A snapshot
// error, one quantization deep (training re-quantizes every step; the examples measure that end to
// end). Prints one table row per (step, format).
//   bench_state_error [--steps 50,300,1500] [--dir /usr/share/datasets/fashion-mnist]
//   bench_state_error --moments FILE[,FILE...]
#include <torch/torch.h>

#include <cstdio>
#include <sstream>

#include <lowbit/lowbit.h>

#include "../examples/idx_reader.h"
#include <lowbit/tools/program_args.h>

namespace lo = lowbit::optim;
using lowbit::QuantFormat;
using lowbit::StateFormat;

namespace {

struct Errors {
  double m = 0, v = 0, u = 0;  // relative L2 errors, summed squares until finish()
  double mn = 0, vn = 0, un = 0;
  int64_t v_zeroed = 0, v_nonzero = 0;  // v > 0 decoded as 0
  double u_max = 0, u_ref_max = 0;
};

at::Tensor roundtrip(const at::Tensor& x, QuantFormat f, int64_t block) {
  return lowbit::dequantize(lowbit::quantize(x, f, block));
}

// A state format as the optimizer options choose it (FP8's second moment in either variant).
struct Row {
  StateFormat format;
  QuantFormat fp8_unsigned;
  std::string name() const {
    const std::string n = lowbit::state_format_name(format);
    return format != StateFormat::FP8 ? n : n + (fp8_unsigned == QuantFormat::FP8E5M2 ? "/E5M2" : "/E4M3");
  }
};

std::vector<Row> rows() {
  std::vector<Row> out;
  for (StateFormat f : lowbit::kAllStateFormats) {
    if (f == StateFormat::FP32) continue;
    out.push_back({f, QuantFormat::FP8E4M3});
    if (f == StateFormat::FP8) out.push_back({f, QuantFormat::FP8E5M2});
  }
  return out;
}

at::Tensor state_as(const at::Tensor& x, const Row& r, bool is_signed) {
  if (r.format == StateFormat::BF16) return x.to(at::kBFloat16).to(at::kFloat);
  const QuantFormat q = lowbit::quant_format_for(r.format, is_signed, r.fp8_unsigned);
  return roundtrip(x, q, lowbit::default_block_size(q));
}

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

// One row per state format: the errors of moments (m, v) quantized in it, at `step`.
void print_rows(int64_t step, const std::vector<std::pair<at::Tensor, at::Tensor>>& moments, double b1, double b2,
                double eps) {
  const double c1 = 1 - std::pow(b1, double(step)), c2 = 1 - std::pow(b2, double(step));
  for (const Row& r : rows()) {
    Errors e;
    for (const auto& [m, v] : moments) {
      if (m.numel() < 4096) continue;  // small tensors keep fp32 state (min_quant_numel)
      const at::Tensor mq = state_as(m, r, true), vq = state_as(v, r, false);
      const at::Tensor u = (m / c1) / ((v / c2).sqrt() + eps), uq = (mq / c1) / ((vq / c2).sqrt() + eps);
      e.m += (mq - m).pow(2).sum().item<double>();
      e.mn += m.pow(2).sum().item<double>();
      e.v += (vq - v).pow(2).sum().item<double>();
      e.vn += v.pow(2).sum().item<double>();
      e.u += (uq - u).pow(2).sum().item<double>();
      e.un += u.pow(2).sum().item<double>();
      e.v_zeroed += ((v > 0) & (vq == 0)).sum().item<int64_t>();
      e.v_nonzero += (v > 0).sum().item<int64_t>();
      e.u_max = std::max(e.u_max, uq.abs().max().item<double>());
      e.u_ref_max = std::max(e.u_ref_max, u.abs().max().item<double>());
    }
    std::printf("%-6lld %-8s %12.3e %12.3e %12.3e %13.4f%% %12.3f\n", (long long)step, r.name().c_str(),
                std::sqrt(e.m / e.mn), std::sqrt(e.v / e.vn), std::sqrt(e.u / e.un),
                100.0 * double(e.v_zeroed) / double(std::max<int64_t>(1, e.v_nonzero)), e.u_max / e.u_ref_max);
  }
}

void print_header() {
  std::printf("%-6s %-8s %12s %12s %12s %14s %12s\n", "step", "state", "rel err m", "rel err v", "rel err u",
              "v>0 decoded 0", "max|u|/ref");
}

// The moments a GPT run saved (examples/gpt: --save-moments), one table block per file.
int from_files(const std::string& list) {
  std::stringstream ss(list);
  std::string path;
  print_header();
  while (std::getline(ss, path, ',')) {
    torch::serialize::InputArchive ar;
    ar.load_from(path);
    const auto scalar = [&](const char* key) {
      at::Tensor t;
      ar.read(key, t);
      return t.item<double>();
    };
    at::Tensor count;
    ar.read("count", count);
    std::vector<std::pair<at::Tensor, at::Tensor>> moments;
    for (int64_t i = 0; i < count.item<int64_t>(); ++i) {
      at::Tensor m, v;
      ar.read("m" + std::to_string(i), m);
      ar.read("v" + std::to_string(i), v);
      moments.emplace_back(m.to(at::kFloat).flatten(), v.to(at::kFloat).flatten());
    }
    print_rows(static_cast<int64_t>(scalar("step")), moments, scalar("beta1"), scalar("beta2"), scalar("eps"));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv,
                               "usage: bench_state_error [--steps S1,S2,...] [--dir DIR] | --moments FILE\n"
                               "The error of each state format on AdamW moments of a Fashion-MNIST MLP.\n"))
    return 0;
  std::vector<int64_t> snapshots = {50, 300, 1500};
  std::string dir = lowbit_examples::kFashionMnistDir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--steps") snapshots = parse_list(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
    else if (a == "--moments") return from_files(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown argument %s; use --steps N,N,... and --dir DIR, or --moments FILE,FILE...\n",
                   a.c_str());
      return 2;
    }
  }
  torch::manual_seed(0);
  const at::Tensor images = lowbit_examples::read_idx_gz(dir + "/train-images-idx3-ubyte.gz").to(at::kFloat).div(255).flatten(1);
  const at::Tensor labels = lowbit_examples::read_idx_gz(dir + "/train-labels-idx1-ubyte.gz").to(at::kLong);
  torch::nn::Sequential net(torch::nn::Linear(784, 512), torch::nn::ReLU(), torch::nn::Linear(512, 256),
                            torch::nn::ReLU(), torch::nn::Linear(256, 10));
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  lo::AdamW opt(net->parameters(), lo::AdamWOptions(1e-3).betas({b1, b2}).eps(eps).state_format(StateFormat::FP32));
  const int64_t batch = 128, n = images.size(0);
  print_header();
  int64_t step = 0;
  for (int64_t target : snapshots) {
    for (; step < target; ++step) {
      const at::Tensor idx = at::randint(n, {batch}, at::kLong);
      opt.zero_grad();
      torch::nn::functional::cross_entropy(net->forward(images.index_select(0, idx)), labels.index_select(0, idx))
          .backward();
      opt.step();
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> moments;
    for (const at::Tensor& p : net->parameters()) {
      const std::vector<at::Tensor> st = opt.export_state_fp32(p);
      moments.emplace_back(st[0], st[1]);
    }
    print_rows(step, moments, b1, b2, eps);
  }
  return 0;
}
