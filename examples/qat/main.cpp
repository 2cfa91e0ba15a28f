// qat: quantization-aware training on Fashion-MNIST. Trains a small CNN in float32, then compares
//   (a) float32, (a') float32 fine-tuned as long as QAT (control: what the extra steps alone give),
//   (b) PTQ: int4 per-group weights + int8 per-token activations applied to the trained model,
//   (c) QAT: the same config fine-tuned with fake quantization, then converted to packed int4.
// over several seeds; prints and saves the table (CSV), the fine-tuning loss curves (CSV, PNG via
// gnuplot), and checks that the converted model's logits equal the QAT model's bit for bit.
//   qat [--seeds N] [--epochs N] [--qat-steps N] [--batch N] [--lr X] [--qat-lr X] [--group-size N]
//       [--weight-bits N] [--train-limit N] [--test-limit N] [--dir DIR] [--out PREFIX] [--ci]
// --ci: a smoke run for CI (1 seed, 2,048 training images, 30 + 30 steps, 2,000 test images): it
// checks that everything runs and that converted == QAT bit for bit, not the accuracy bar.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include <lowbit/lowbit.h>

#include "../idx_reader.h"
#include <lowbit/tools/program_args.h>

namespace qat = lowbit::qat;

namespace {

torch::nn::Sequential make_net() {
  return torch::nn::Sequential(
      torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
      torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5).padding(2)), torch::nn::ReLU(), torch::nn::MaxPool2d(2),
      torch::nn::Flatten(), torch::nn::Linear(32 * 7 * 7, 128), torch::nn::ReLU(), torch::nn::Linear(128, 10));
}

torch::nn::Sequential clone(const torch::nn::Sequential& m) {
  return torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m->clone()));
}

struct Data {
  at::Tensor train_x, train_y, test_x, test_y;
};

// Trains `steps` steps of batch `batch` with lowbit's AdamW; the data order depends on `seed` only.
std::vector<double> train(torch::nn::Sequential& net, const Data& d, int64_t steps, int64_t batch, double lr, uint64_t seed) {
  lowbit::optim::AdamW opt(net->parameters(), lowbit::optim::AdamWOptions(lr));
  net->train();
  torch::manual_seed(seed);
  const int64_t n = d.train_x.size(0);
  at::Tensor perm = at::randperm(n);
  std::vector<double> losses;
  for (int64_t s = 0, pos = 0; s < steps; ++s, pos += batch) {
    if (pos + batch > n) {
      perm = at::randperm(n);
      pos = 0;
    }
    const at::Tensor idx = perm.narrow(0, pos, batch);
    opt.zero_grad();
    at::Tensor loss = torch::nn::functional::cross_entropy(net->forward(d.train_x.index({idx}).unsqueeze(1)), d.train_y.index({idx}));
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  net->eval();
  return losses;
}

// Test logits [10000, 10].
at::Tensor logits(torch::nn::Sequential& net, const Data& d) {
  torch::NoGradGuard ng;
  net->eval();
  std::vector<at::Tensor> out;
  for (int64_t s = 0; s < d.test_x.size(0); s += 1000)
    out.push_back(net->forward(d.test_x.narrow(0, s, std::min<int64_t>(1000, d.test_x.size(0) - s)).unsqueeze(1)));
  return at::cat(out);
}

double accuracy(const at::Tensor& lg, const Data& d) {
  return 100.0 * lg.argmax(1).eq(d.test_y).sum().item<double>() / d.test_y.size(0);
}

struct Row {
  int seed;
  double fp32, fp32_tuned, ptq, qat, converted, int8mm;
  bool exact;
  int64_t fp32_bytes, packed_bytes;
};

}  // namespace

constexpr const char* kUsage =
    "usage: qat_fashion_mnist [--seeds N] [--epochs N] [--qat-steps N] [--batch N] [--lr X] [--qat-lr X]\n"
    "                         [--group-size N] [--weight-bits N] [--train-limit N] [--test-limit N]\n"
    "                         [--dir DIR] [--out PREFIX] [--ci]\n"
    "float32 against post-training quantization against QAT (then convert) on Fashion-MNIST.\n";

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv, kUsage)) return 0;
  int seeds = 3, epochs = 1;
  int64_t qat_steps = 300, batch = 128, group_size = 32, weight_bits = 4, train_limit = 0, test_limit = 0, pre_steps_ci = 0;
  double lr = 1e-3, qat_lr = 1e-4;
  std::string dir = lowbit_examples::kFashionMnistDir, out = "qat_fashion_mnist";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    try {
      if (a == "--seeds") seeds = std::stoi(next());
      else if (a == "--epochs") epochs = std::stoi(next());
      else if (a == "--qat-steps") qat_steps = std::stoll(next());
      else if (a == "--batch") batch = std::stoll(next());
      else if (a == "--lr") lr = std::stod(next());
      else if (a == "--qat-lr") qat_lr = std::stod(next());
      else if (a == "--group-size") group_size = std::stoll(next());
      else if (a == "--weight-bits") weight_bits = std::stoll(next());
      else if (a == "--train-limit") train_limit = std::stoll(next());
      else if (a == "--test-limit") test_limit = std::stoll(next());
      else if (a == "--ci") seeds = 1, train_limit = 2048, test_limit = 2000, qat_steps = 30, pre_steps_ci = 30;
      else if (a == "--dir") dir = next();
      else if (a == "--out") out = next();
      else throw std::runtime_error("unknown flag " + a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "qat: %s\nflags: --seeds --epochs --qat-steps --batch --lr --qat-lr --group-size --weight-bits --train-limit --test-limit --dir --out --ci\n", e.what());
      return 2;
    }
  }
  try {
    Data d;
    d.train_x = (lowbit_examples::read_idx_gz(dir + "/train-images-idx3-ubyte.gz").to(at::kFloat) / 255 - 0.286) / 0.353;
    d.train_y = lowbit_examples::read_idx_gz(dir + "/train-labels-idx1-ubyte.gz").to(at::kLong);
    d.test_x = (lowbit_examples::read_idx_gz(dir + "/t10k-images-idx3-ubyte.gz").to(at::kFloat) / 255 - 0.286) / 0.353;
    d.test_y = lowbit_examples::read_idx_gz(dir + "/t10k-labels-idx1-ubyte.gz").to(at::kLong);
    if (train_limit > 0) {
      d.train_x = d.train_x.narrow(0, 0, std::min(train_limit, d.train_x.size(0)));
      d.train_y = d.train_y.narrow(0, 0, d.train_x.size(0));
    }
    if (test_limit > 0) {
      d.test_x = d.test_x.narrow(0, 0, std::min(test_limit, d.test_x.size(0)));
      d.test_y = d.test_y.narrow(0, 0, d.test_x.size(0));
    }
    const auto t_start = std::chrono::steady_clock::now();
    const qat::QatConfig cfg = qat::QatConfig()
                                   .activation(qat::FakeQuantConfig::int8_per_token_asymmetric())
                                   .weight(qat::FakeQuantConfig(weight_bits).granularity(qat::Granularity::PerGroup).group_size(group_size));
    const int64_t pre_steps = pre_steps_ci > 0 ? pre_steps_ci : epochs * (d.train_x.size(0) / batch);
    std::printf("Fashion-MNIST QAT: %lld train images, %lld test images, %d seed(s), %d threads; float32 %lld steps (lr %g), then %lld steps (lr %g)\n"
                "config: activations %s; weights %s (Linear layers; convolutions stay float32)\n\n",
                (long long)d.train_x.size(0), (long long)d.test_x.size(0), seeds, at::get_num_threads(), (long long)pre_steps, lr, (long long)qat_steps, qat_lr,
                cfg.activation()->describe().c_str(), cfg.weight()->describe().c_str());
    std::vector<Row> rows;
    std::vector<double> curve_qat, curve_fp32;
    for (int seed = 0; seed < seeds; ++seed) {
      const auto t0 = std::chrono::steady_clock::now();
      torch::manual_seed(seed);
      auto net = make_net();
      train(net, d, pre_steps, batch, lr, 1000 + seed);
      Row r{};
      r.seed = seed;
      r.fp32 = accuracy(logits(net, d), d);
      // (a') the control: float32 fine-tuned with the same steps and data order as QAT.
      auto tuned = clone(net);
      auto l_fp32 = train(tuned, d, qat_steps, batch, qat_lr, 2000 + seed);
      r.fp32_tuned = accuracy(logits(tuned, d), d);
      // (b) PTQ: the trained model, fake-quantized as it is (= its converted model, checked below).
      auto ptq = qat::prepare(clone(net), cfg);
      r.ptq = accuracy(logits(ptq, d), d);
      // (c) QAT, then convert.
      auto model = qat::prepare(clone(net), cfg);
      auto l_qat = train(model, d, qat_steps, batch, qat_lr, 2000 + seed);
      const at::Tensor qat_logits = logits(model, d);
      r.qat = accuracy(qat_logits, d);
      auto converted = qat::convert(model);
      const at::Tensor conv_logits = logits(converted, d);
      r.converted = accuracy(conv_logits, d);
      r.exact = at::equal(qat_logits, conv_logits) && qat_logits.sizes() == conv_logits.sizes();
      // The same converted model through the int8 x int8 matmul (within a proven bound, not bit for bit).
      qat::set_int8_matmul(converted);
      r.int8mm = accuracy(logits(converted, d), d);
      for (const auto& m : converted->modules())
        if (auto q = std::dynamic_pointer_cast<qat::QuantizedLinearImpl>(m)) {
          r.packed_bytes += q->weight_bytes();
          r.fp32_bytes += q->options.in_features() * q->options.out_features() * 4;
        }
      if (seed == 0) curve_qat = l_qat, curve_fp32 = l_fp32;
      rows.push_back(r);
      std::printf("seed %d: fp32 %.2f%%  fp32 fine-tuned %.2f%%  PTQ %.2f%%  QAT %.2f%%  converted %.2f%% (%s)  int8 matmul %.2f%%  [%.0f s]\n",
                  seed, r.fp32, r.fp32_tuned, r.ptq, r.qat, r.converted, r.exact ? "logits identical" : "LOGITS DIFFER", r.int8mm,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      std::fflush(stdout);
    }
    // Table: what PTQ lost and what QAT got back, per seed and on average.
    const std::string csv = out + ".csv";
    std::ofstream f(csv);
    f << "seed,fp32,fp32_finetuned,ptq,qat,converted,converted_equals_qat,int8_matmul,recovered_fraction,linear_fp32_bytes,linear_packed_bytes\n";
    std::printf("\n%-5s %8s %10s %8s %8s %10s %8s %10s %s\n", "seed", "fp32", "fp32+ft", "PTQ", "QAT", "converted", "int8mm", "recovered",
                "linear weights fp32 -> packed");
    double sum[6] = {0, 0, 0, 0, 0, 0};
    bool all_exact = true;
    for (const Row& r : rows) {
      const double lost = r.fp32 - r.ptq;
      const double rec = lost > 0 ? (r.qat - r.ptq) / lost : NAN;
      std::printf("%-5d %7.2f%% %9.2f%% %7.2f%% %7.2f%% %9.2f%% %7.2f%% %10.2f %lld -> %lld bytes\n", r.seed, r.fp32, r.fp32_tuned,
                  r.ptq, r.qat, r.converted, r.int8mm, rec, (long long)r.fp32_bytes, (long long)r.packed_bytes);
      f << r.seed << "," << r.fp32 << "," << r.fp32_tuned << "," << r.ptq << "," << r.qat << "," << r.converted << ","
        << (r.exact ? 1 : 0) << "," << r.int8mm << "," << rec << "," << r.fp32_bytes << "," << r.packed_bytes << "\n";
      sum[0] += r.fp32, sum[1] += r.fp32_tuned, sum[2] += r.ptq, sum[3] += r.qat, sum[4] += r.converted, sum[5] += r.int8mm;
      all_exact = all_exact && r.exact;
    }
    const double k = rows.size();
    const double mean_lost = (sum[0] - sum[2]) / k;
    const double mean_rec = mean_lost > 0 ? ((sum[3] - sum[2]) / k) / mean_lost : NAN;
    std::printf("%-5s %7.2f%% %9.2f%% %7.2f%% %7.2f%% %9.2f%% %7.2f%% %10.2f\n", "mean", sum[0] / k, sum[1] / k, sum[2] / k,
                sum[3] / k, sum[4] / k, sum[5] / k, mean_rec);
    std::printf("\nPTQ lost %.2f points on average; QAT recovered %.0f%% of it (bar: >= 50%%). Converted == QAT: %s.\n"
                "Against the float32 model fine-tuned the same steps (the fair control), QAT is %.2f points behind.\n",
                mean_lost, 100 * mean_rec, all_exact ? "yes, logits bit for bit, every seed" : "NO", (sum[1] - sum[3]) / k);
    f.close();
    // Fine-tuning loss curves of seed 0: QAT vs the float32 control.
    const std::string curves = out + "_curves.csv", png = out + ".png";
    std::ofstream c(curves);
    c << "step,qat,fp32_finetune\n";
    for (size_t s = 0; s < curve_qat.size(); ++s) c << s + 1 << "," << curve_qat[s] << "," << curve_fp32[s] << "\n";
    c.close();
    std::printf("table: %s, curves: %s", csv.c_str(), curves.c_str());
    if (std::system("command -v gnuplot >/dev/null 2>&1") == 0 && !curve_qat.empty()) {
      std::ofstream gp(out + ".gp");
      gp << "set terminal pngcairo size 900,500\nset output '" << png << "'\nset datafile separator ','\n"
         << "set key top right\nset xlabel 'fine-tuning step'\nset ylabel 'training loss (smoothed)'\n"
         << "set title 'Fashion-MNIST: QAT (int8 act + int" << weight_bits << " weights) vs float32 fine-tuning, seed 0'\n"
         << "plot '" << curves << "' using 1:2 smooth bezier with lines title 'QAT', '" << curves
         << "' using 1:3 smooth bezier with lines title 'float32'\n";
      gp.close();
      if (std::system(("gnuplot " + out + ".gp").c_str()) == 0) std::printf(", plot: %s", png.c_str());
    }
    std::printf("\ntotal %.0f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
    return all_exact ? 0 : 1;
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "qat: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qat: %s\n", e.what());
    return 1;
  }
}
