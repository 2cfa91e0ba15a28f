// fashion_mnist: trains a small CNN on Fashion-MNIST with one optimizer in several state formats
// (same seed, same data order) and compares test accuracy, optimizer-state bytes and step time.
// Writes a CSV of the loss curves and, when gnuplot is installed, a PNG of them.
//   fashion_mnist [--optimizer adamw|adam|sgd|lion|rmsprop|adagrad|ademamix|lamb] [--formats FP32,BF16,Q8,Q4,FP8,C8]
//                 [--epochs N] [--batch N] [--lr X] [--device cpu|cuda] [--dir DIR] [--out PREFIX]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <lowbit/lowbit.h>

#include "fashion_mnist.h"
#include <lowbit/tools/program_args.h>

namespace lo = lowbit::optim;
using lowbit::StateFormat;
using lowbit_examples::default_lr;
using lowbit_examples::make_optimizer;
using lowbit_examples::Net;

namespace {

struct Result {
  StateFormat format;
  double accuracy, ms_per_step;
  int64_t state_bytes;
  std::vector<double> losses;
};

}  // namespace

constexpr const char* kUsage =
    "usage: fashion_mnist [--optimizer adamw|adam|sgd|...] [--formats FP32,BF16,Q8,Q4,FP8,C8] [--epochs N]\n"
    "                     [--batch N] [--lr X] [--device cpu|cuda] [--dir DIR] [--out PREFIX]\n"
    "Trains an MLP on Fashion-MNIST once per state format and writes PREFIX.csv / PREFIX.png.\n";

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv, kUsage)) return 0;
  std::string optimizer = "adamw", formats = "FP32,BF16,Q8,Q4,FP8,C8", device = "cpu", out = "fashion_mnist";
  std::string dir = lowbit_examples::kFashionMnistDir;
  int epochs = 1;
  int64_t batch = 128;
  double lr = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    try {
      if (a == "--optimizer") optimizer = next();
      else if (a == "--formats") formats = next();
      else if (a == "--epochs") epochs = std::stoi(next());
      else if (a == "--batch") batch = std::stoll(next());
      else if (a == "--lr") lr = std::stod(next());
      else if (a == "--device") device = next();
      else if (a == "--dir") dir = next();
      else if (a == "--out") out = next();
      else throw std::runtime_error("unknown flag " + a);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fashion_mnist: %s\nflags: --optimizer --formats --epochs --batch --lr --device --dir --out\n", e.what());
      return 2;
    }
  }
  if (lr < 0) lr = default_lr(optimizer);
  try {
    const at::Device dev(device);
    const lowbit_examples::FashionMnist data = lowbit_examples::load_fashion_mnist(dir);
    const at::Tensor &train_x = data.train_x, &train_y = data.train_y, &test_x = data.test_x;
    const int64_t n = train_x.size(0), steps_per_epoch = n / batch;
    std::printf("Fashion-MNIST: %lld train / %lld test images; optimizer %s lr %g, %d epoch(s) of %lld steps, batch %lld, %s\n",
                (long long)n, (long long)test_x.size(0), optimizer.c_str(), lr, epochs, (long long)steps_per_epoch,
                (long long)batch, device.c_str());
    std::vector<Result> results;
    std::stringstream fl(formats);
    std::string fname;
    while (std::getline(fl, fname, ',')) {
      StateFormat f;
      if (!lowbit::parse_state_format(fname, &f)) throw std::runtime_error("unknown state format '" + fname + "'");
      torch::manual_seed(0);
      Net net;
      net->to(dev);
      auto opt = make_optimizer(optimizer, net->parameters(), f, lr);
      Result r{f, 0, 0, 0, {}};
      std::vector<double> step_ms;  // each iteration's wall time
      for (int e = 0; e < epochs; ++e) {
        torch::manual_seed(1000 + e);  // same data order for every format
        const at::Tensor perm = at::randperm(n);
        double running = 0;
        for (int64_t s = 0; s < steps_per_epoch; ++s) {
          const at::Tensor idx = perm.narrow(0, s * batch, batch);
          const at::Tensor x = train_x.index({idx}).unsqueeze(1).to(dev), y = train_y.index({idx}).to(dev);
          const auto t0 = std::chrono::steady_clock::now();
          opt->zero_grad();
          at::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x), y);
          loss.backward();
          opt->step();
          step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          const double l = loss.item<double>();
          r.losses.push_back(l);
          running = s == 0 ? l : 0.98 * running + 0.02 * l;
          if ((s + 1) % 100 == 0 || s + 1 == steps_per_epoch) {
            std::printf("\r  %-5s epoch %d step %4lld/%lld  loss %.4f", lowbit::state_format_name(f), e + 1, (long long)(s + 1),
                        (long long)steps_per_epoch, running);
            std::fflush(stdout);
          }
        }
      }
      r.accuracy = lowbit_examples::test_accuracy(net, data, dev);
      std::nth_element(step_ms.begin(), step_ms.begin() + step_ms.size() / 2, step_ms.end());
      r.ms_per_step = step_ms.empty() ? 0.0 : step_ms[step_ms.size() / 2];
      r.state_bytes = opt->state_bytes();
      std::printf("\r  %-5s test accuracy %.2f%%, state %lld bytes, median %.2f ms/it                 \n",
                  lowbit::state_format_name(f), r.accuracy, (long long)r.state_bytes, r.ms_per_step);
      results.push_back(r);
    }
    std::printf("\n%-6s %10s %14s %12s %14s\n", "state", "test acc", "state bytes", "vs FP32", "median ms/it");
    const double base_bytes = results.empty() ? 1 : double(results[0].state_bytes);
    for (const auto& r : results)
      std::printf("%-6s %9.2f%% %14lld %11.2fx %14.2f\n", lowbit::state_format_name(r.format), r.accuracy,
                  (long long)r.state_bytes, r.state_bytes / base_bytes, r.ms_per_step);
    std::printf("(ms/it: the median wall time of one training iteration, forward + backward + step, on this\n"
                " machine in this run: a sanity check, not a benchmark; bench/RESULTS.md measures the step.)\n");
    // Loss curves: CSV, then a PNG through gnuplot when it is installed.
    const std::string csv = out + ".csv", png = out + ".png";
    std::ofstream f(csv);
    f << "step";
    for (const auto& r : results) f << "," << lowbit::state_format_name(r.format);
    f << "\n";
    for (size_t s = 0; !results.empty() && s < results[0].losses.size(); ++s) {
      f << s + 1;
      for (const auto& r : results) f << "," << r.losses[s];
      f << "\n";
    }
    f.close();
    std::printf("\nloss curves: %s", csv.c_str());
    if (std::system("command -v gnuplot >/dev/null 2>&1") == 0 && !results.empty()) {
      std::ofstream gp(out + ".gp");
      gp << "set terminal pngcairo size 900,500\nset output '" << png << "'\nset datafile separator ','\n"
         << "set key top right\nset xlabel 'step'\nset ylabel 'training loss (smoothed)'\nset yrange [0:1.2]\n"
         << "set title 'Fashion-MNIST, " << optimizer << ": loss by optimizer-state format'\nplot ";
      for (size_t k = 0; k < results.size(); ++k)
        // A dash pattern and a marker of its own for each curve, not only a colour: six formats
        // whose curves lie close together stay apart in print and for colour-blind readers.
        gp << (k ? ", " : "") << "'" << csv << "' using 1:" << k + 2
           << " smooth bezier with linespoints lw 2 dt " << k % 5 + 1 << " pt " << k + 4 << " pi 12 ps 1.2 title '"
           << lowbit::state_format_name(results[k].format) << "'";
      gp << "\n";
      gp.close();
      if (std::system(("gnuplot " + out + ".gp").c_str()) == 0) std::printf(", plot: %s", png.c_str());
    }
    std::printf("\n");
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
  return 0;
}
