// distributed_fashion_mnist: the Fashion-MNIST CNN trained data-parallel with ShardedOptimizer under
// mpirun (or srun): every rank draws the same global batch and takes its 1/N of it, the gradients are
// averaged over the ranks, and each rank keeps 1/N of the optimizer state. The loss curve is one
// process's at the same global batch, within float noise (the ranks' partial sums round differently):
// --compare takes another run's CSV and prints both curves and their largest difference.
//   mpirun -np 2 distributed_fashion_mnist [--steps N] [--batch GLOBAL] [--optimizer adamw|...]
//       [--format Q8] [--lr X] [--dir DIR] [--out CSV] [--compare CSV] [--tolerance X] [--no-eval]
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <lowbit/lowbit.h>

#include "../fashion_mnist/fashion_mnist.h"
#include <lowbit/tools/program_args.h>

namespace ld = lowbit::distributed;
namespace ex = lowbit_examples;

namespace {

struct Flags {
  std::string optimizer = "adamw", format = "Q8", dir = ex::kFashionMnistDir, out, compare;
  int64_t steps = -1, batch = 128;  // steps < 0: one epoch
  double lr = -1, tolerance = 5e-3;
  bool eval = true;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("missing value after " + a);
      return argv[++i];
    };
    if (a == "--steps") f.steps = std::stoll(next());
    else if (a == "--batch") f.batch = std::stoll(next());
    else if (a == "--optimizer") f.optimizer = next();
    else if (a == "--format") f.format = next();
    else if (a == "--lr") f.lr = std::stod(next());
    else if (a == "--dir") f.dir = next();
    else if (a == "--out") f.out = next();
    else if (a == "--compare") f.compare = next();
    else if (a == "--tolerance") f.tolerance = std::stod(next());
    else if (a == "--no-eval") f.eval = false;
    else throw std::runtime_error("unknown flag " + a + " (flags: --steps --batch --optimizer --format --lr --dir "
                                  "--out --compare --tolerance --no-eval)");
  }
  return f;
}

// The loss column of a CSV this program wrote (step,loss).
std::vector<double> read_losses(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<double> losses;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) losses.push_back(std::stod(line.substr(line.find(',') + 1)));
  return losses;
}

// Prints both curves (every step when few, else every tenth) and returns the largest |difference|.
double compare_curves(const std::vector<double>& mine, const std::vector<double>& theirs, int world,
                      const std::string& path) {
  if (mine.size() != theirs.size())
    throw std::runtime_error(path + " has " + std::to_string(theirs.size()) + " steps, this run " +
                             std::to_string(mine.size()));
  std::printf("\n%6s %14s %14s %12s\n", "step", path.c_str(), (std::to_string(world) + " rank(s)").c_str(), "|diff|");
  double worst = 0;
  const size_t every = mine.size() <= 40 ? 1 : 10;
  for (size_t s = 0; s < mine.size(); ++s) {
    const double d = std::abs(mine[s] - theirs[s]);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
    if ((s + 1) % every == 0 || s == 0 || s + 1 == mine.size())
      std::printf("%6zu %14.8f %14.8f %12.3e\n", s + 1, theirs[s], mine[s], d);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv,
                               "usage: mpirun -np N distributed_fashion_mnist [--steps N] [--batch N] [--optimizer NAME]\n"
                               "         [--format NAME] [--lr X] [--dir DIR] [--out CSV] [--compare CSV]\n"
                               "         [--tolerance X] [--no-eval]\n"
                               "Data-parallel Fashion-MNIST with ShardedOptimizer; --compare checks the loss curve\n"
                               "against another run's CSV.\n"))
    return 0;
  Flags f;
  try {
    f = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_fashion_mnist: %s\n", e.what());
    return 2;
  }
  try {
    std::shared_ptr<ld::Communicator> comm = ld::init_from_env();  // MPI, CPU tensors
    const int rank = comm->rank(), world = comm->size();
    const bool root = rank == 0;
    lowbit::StateFormat format;
    if (!lowbit::parse_state_format(f.format, &format)) throw std::runtime_error("unknown state format '" + f.format + "'");
    if (f.lr < 0) f.lr = ex::default_lr(f.optimizer);
    TORCH_CHECK(f.batch % world == 0, "the global batch (", f.batch, ") must be a multiple of the ranks (", world, ")");
    const int64_t local = f.batch / world;

    const ex::FashionMnist data = ex::load_fashion_mnist(f.dir);
    const int64_t n = data.train_x.size(0), per_epoch = n / f.batch;
    const int64_t steps = f.steps < 0 ? per_epoch : f.steps;

    // Every rank builds the same model (same seed); ShardedOptimizer also copies rank 0's parameters.
    torch::manual_seed(0);
    ex::Net net;
    ld::ShardedOptimizer opt(std::shared_ptr<lowbit::optim::LowbitOptimizer>(
                                 ex::make_optimizer(f.optimizer, net->parameters(), format, f.lr)),
                             comm);
    if (root)
      std::printf("Fashion-MNIST on %d rank(s): %s %s lr %g, %lld steps, global batch %lld (%lld per rank)\n", world,
                  f.optimizer.c_str(), f.format.c_str(), f.lr, (long long)steps, (long long)f.batch, (long long)local);

    std::vector<double> losses;
    at::Tensor perm;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t in_epoch = s % per_epoch;
      if (in_epoch == 0) {
        torch::manual_seed(1000 + s / per_epoch);  // the same data order on every rank and at any N
        perm = at::randperm(n);
      }
      // This rank's slice of the global batch.
      const at::Tensor idx = perm.narrow(0, in_epoch * f.batch + rank * local, local);
      opt.zero_grad();
      at::Tensor loss = torch::nn::functional::cross_entropy(net->forward(data.train_x.index({idx}).unsqueeze(1)),
                                                             data.train_y.index({idx}));
      loss.backward();
      opt.step();  // gradients averaged over the ranks = the gradient of the global batch's mean loss
      at::Tensor global = loss.detach().to(at::kDouble).reshape({1});
      comm->all_reduce(global, ld::ReduceOp::Avg);  // the global batch's mean loss
      losses.push_back(global.item<double>());
      if (root && ((s + 1) % 50 == 0 || s + 1 == steps)) {
        std::printf("  step %5lld/%lld  loss %.6f\n", (long long)(s + 1), (long long)steps, losses.back());
        std::fflush(stdout);
      }
    }

    at::Tensor bytes = at::full({1}, opt.state_bytes(), at::kLong);
    comm->all_reduce(bytes);
    std::printf("rank %d: optimizer state %lld bytes of %lld on all ranks\n", rank, (long long)opt.state_bytes(),
                (long long)bytes.item<int64_t>());
    std::fflush(stdout);
    comm->barrier();

    int status = 0;
    if (root) try {
      if (f.eval) std::printf("test accuracy %.2f%%\n", ex::test_accuracy(net, data, at::kCPU));
      if (!f.out.empty()) {
        std::ofstream csv(f.out);
        csv << "step,loss\n";
        csv.precision(17);
        for (size_t s = 0; s < losses.size(); ++s) csv << s + 1 << "," << losses[s] << "\n";
        std::printf("loss curve: %s\n", f.out.c_str());
      }
      if (!f.compare.empty()) {
        const double worst = compare_curves(losses, read_losses(f.compare), world, f.compare);
        const bool ok = worst <= f.tolerance;
        std::printf("max |loss difference| over %zu steps: %.3e (tolerance %.1e): %s\n", losses.size(), worst,
                    f.tolerance, ok ? "same curve within float noise" : "DIFFERENT");
        status = ok ? 0 : 1;
      }
    } catch (const std::exception& e) {  // rank 0's alone: the others still wait for its verdict
      std::fprintf(stderr, "distributed_fashion_mnist: %s\n", e.what());
      status = 1;
    }
    at::Tensor failed = at::full({1}, status, at::kInt);
    comm->broadcast(failed, 0);
    return failed.item<int>();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "distributed_fashion_mnist: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distributed_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
