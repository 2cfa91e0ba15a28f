// bench_sharded_step (under mpirun): one ShardedOptimizer step (AdamW, Q8 state) split into its
// parts, each timed alone over the same bytes: reduce-scatter of the gradients, the local update
// of 1/N of the elements (an unsharded optimizer on that many), the all-gather of the parameters;
// and the bus bandwidth of the communicator's all_reduce of the same bytes (nccl-tests' formula:
// algbw * 2(N-1)/N for all_reduce, algbw * (N-1)/N for reduce-scatter and all-gather). Reports the
// step against (reduce-scatter + all-gather at that bus bandwidth + the local update), and the
// per-rank optimizer state against the unsharded optimizer's. Then with the gradients coming from a
// backward() (of sum(p * g), its forward built before the timer starts): backward + step without buckets, and with ShardedOptions::overlap
// (buckets of bucket_mib MiB reduce-scattered from backward()'s hooks, then larger buckets), and its
// step() alone; over NCCL, a GPU timeline of one overlapped iteration (CUDA timing events). Last,
// the low-bit wire (ShardedOptions::gradient_wire / update_wire): the sharded step and the bytes
// each rank sends per parameter, against float32 and bfloat16 parameters on a full-precision wire
// (--wire: only that part). The copy engines (NcclOptions::copy_engine_gathers / _reductions) as
// the communicator decides where NCCL has them, unless forced: --copy-engine the parameters'
// all-gathers there, --copy-engine-rs the gradients' reduce-scatters too, --nccl-kernels neither
// (the first line says which ran). --matmul ROWS: the gradients come from a matmul backward instead
// (each parameter a square matrix W, loss sum((X @ W) * G) with X, G of ROWS rows, TF32 on), which
// leaves the memory bus to the collectives as a model's backward does; sum(p * g)'s backward is pure
// memory traffic, like the reduce-scatters beside it. The backward + step comparisons run in
// rounds, each configuration once per round, their ratios taken within a round (a transport whose
// pace drifts moves them alike). Over NCCL, probes of single iterations (host and GPU time), one of
// them backward beside a reduce-scatter it never waits for (what the GPU's sharing costs by itself).
// Medians over the repetitions (rounds).
//   mpirun -np 2 bench_sharded_step [--cuda] [--wire] [--copy-engine[-rs] | --nccl-kernels] [--matmul ROWS] [params=64] [numel=4194304] [reps=10] [bucket_mib=25]
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lowbit/build_config.h>
#include <lowbit/lowbit.h>
#if LOWBIT_WITH_NCCL
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <lowbit/distributed/nccl_communicator.h>
#endif

#include "timing.h"
#include <lowbit/tools/program_args.h>

namespace ld = lowbit::distributed;
using lowbit_bench::median;
using lowbit_bench::now_ms;

int main(int argc, char** argv) {
  if (lowbit_tools::wants_help(argc, argv,
                               "usage: mpirun -np N bench_sharded_step [--cuda] [--wire] [--copy-engine[-rs] | --nccl-kernels] [--matmul ROWS] [PARAMS [NUMEL [REPS [BUCKET_MIB]]]]\n"
                               "The sharded step's parts against NCCL's (or MPI's) bus bandwidth.\n"))
    return 0;
  bool cuda = false, wire_only = false, copy_engine = false, copy_engine_rs = false, nccl_kernels = false;
  int64_t matmul_rows = 0;
  std::vector<int64_t> nums;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cuda") == 0)
      cuda = true;
    else if (std::strcmp(argv[i], "--wire") == 0)
      wire_only = true;
    else if (std::strcmp(argv[i], "--copy-engine") == 0)
      copy_engine = true;
    else if (std::strcmp(argv[i], "--copy-engine-rs") == 0)
      copy_engine_rs = true;
    else if (std::strcmp(argv[i], "--nccl-kernels") == 0)
      nccl_kernels = true;
    else if (std::strcmp(argv[i], "--matmul") == 0 && i + 1 < argc)
      matmul_rows = std::atoll(argv[++i]);
    else
      nums.push_back(std::atoll(argv[i]));
  }
  const int64_t count = nums.size() > 0 ? nums[0] : 64, numel = nums.size() > 1 ? nums[1] : 4194304;
  const int reps = nums.size() > 2 ? static_cast<int>(nums[2]) : 10;
  const int64_t bucket_mib = nums.size() > 3 ? nums[3] : 25;
  ld::InitOptions io;
  io.device_type = cuda ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  if (copy_engine || copy_engine_rs || nccl_kernels) {
    io.copy_engine_gathers = !nccl_kernels;
    io.copy_engine_reductions = copy_engine_rs;
  }
  auto comm = ld::init_from_env(io);
  // Which collectives run on the copy engines, as the communicator decided.
  std::string collectives = comm->backend();
  bool reduces_on_copy_engines = false;
#if LOWBIT_WITH_NCCL
  if (const auto* c = dynamic_cast<const ld::NcclCommunicator*>(comm.get())) {
    const ld::CopyEngineUse& use = c->copy_engines();
    reduces_on_copy_engines = use.reductions;
    collectives += ", " + use.describe();
  }
#endif
  const int n = comm->size(), rank = comm->rank();
  const at::Device dev = cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(ld::launch_env().local_rank)) : at::Device(at::kCPU);
  const auto sync = [&] {
    if (cuda) torch::cuda::synchronize(dev.index());
  };
  // f() once after before() (untimed) and a barrier, until the device is done: milliseconds.
  const auto once = [&](const std::function<void()>& f, const std::function<void()>& before) {
    before();
    sync();
    comm->barrier();
    const double t0 = now_ms();
    f();
    sync();
    return now_ms() - t0;
  };
  const auto nothing = [] {};
  const auto time = [&](const std::function<void()>& f) {
    f();  // warm-up
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) ms.push_back(once(f, nothing));
    return median(ms);
  };

  // The low-bit wire: the sharded step (gradients in .grad, no overlap) of fresh parameters per
  // configuration, and the bytes each rank sends per parameter per step.
  const auto wire_section = [&] {
    struct Config {
      const char* name;
      at::ScalarType dtype;
      std::optional<ld::WireCompression> grads, updates;
    };
    const std::vector<Config> configs = {
        {"fp32 wire (fp32 parameters)", at::kFloat, std::nullopt, std::nullopt},
        {"bf16 wire (bf16 parameters)", at::kBFloat16, std::nullopt, std::nullopt},
        {"8-bit gradients, fp32 updates", at::kFloat, ld::WireCompression::gradients(), std::nullopt},
        {"8-bit gradients + 8-bit updates", at::kFloat, ld::WireCompression::gradients(), ld::WireCompression::updates()},
        {"4-bit gradients + 8-bit updates", at::kFloat, ld::WireCompression::gradients(lowbit::QuantFormat::DE4Signed),
         ld::WireCompression::updates()},
        {"4-bit gradients + 4-bit updates", at::kFloat, ld::WireCompression::gradients(lowbit::QuantFormat::DE4Signed),
         ld::WireCompression::updates(lowbit::QuantFormat::DE4Signed)},
    };
    std::vector<std::pair<double, double>> results;  // (ms, bytes per parameter)
    for (const Config& c : configs) {
      std::vector<at::Tensor> pw;
      for (int64_t k = 0; k < count; ++k)
        pw.push_back(at::randn({numel}, at::TensorOptions().device(dev).dtype(c.dtype)).set_requires_grad(true));
      ld::ShardedOptions so;
      so.gradient_wire = c.grads;
      so.update_wire = c.updates;
      ld::ShardedOptimizer sw(std::make_shared<lowbit::optim::AdamW>(pw, lowbit::optim::AdamWOptions(1e-4)), comm, so);
      for (auto& p : pw) p.mutable_grad() = at::randn_like(p) * 1e-3;
      results.push_back({time([&] { sw.step(); }), sw.wire_stats().bytes_per_parameter()});
    }
    if (rank != 0) return;
    std::printf("  low-bit wire: sharded step (AdamW Q8, no overlap), bytes each rank sends per parameter per step\n");
    for (size_t i = 0; i < configs.size(); ++i)
      std::printf("    %-34s %9.3f ms  %6.3f B/param   vs fp32 wire: %.2fx faster, %.2fx fewer bytes; vs bf16: %.2fx, %.2fx\n",
                  configs[i].name, results[i].first, results[i].second, results[0].first / results[i].first,
                  results[0].second / results[i].second, results[1].first / results[i].first,
                  results[1].second / results[i].second);
  };
  if (wire_only) {
    if (rank == 0)
      std::printf("bench_sharded_step --wire: %d rank(s) (%s), %lld params x %lld elements\n", comm->size(),
                  collectives.c_str(), static_cast<long long>(count), static_cast<long long>(numel));
    wire_section();
    return 0;
  }

  std::vector<at::Tensor> params;
  for (int64_t k = 0; k < count; ++k) params.push_back(at::randn({numel}, at::TensorOptions().device(dev)).set_requires_grad(true));
  auto opt = std::make_shared<lowbit::optim::AdamW>(params, lowbit::optim::AdamWOptions(1e-4));
  ld::ShardedOptimizer sharded(opt, comm);
  for (auto& p : params) p.mutable_grad() = at::randn_like(p) * 1e-3;
  const double step_ms = time([&] { sharded.step(); });
  // The same step in buckets (without overlap): each bucket's reduce-scatter beside the next one's
  // gradient copy, each all-gather beside the next bucket's update. Fresh parameters per size.
  std::vector<std::pair<int64_t, double>> bucketed_ms;
  // 2^20 MiB: one bucket per dtype, whatever the model.
  for (int64_t mib : {int64_t{1} << 20, int64_t{512}, int64_t{128}, int64_t{64}}) {
    std::vector<at::Tensor> pb;
    for (int64_t k = 0; k < count; ++k) pb.push_back(at::randn({numel}, at::TensorOptions().device(dev)).set_requires_grad(true));
    ld::ShardedOptions so;
    so.bucket_bytes = mib << 20;
    ld::ShardedOptimizer sb(std::make_shared<lowbit::optim::AdamW>(pb, lowbit::optim::AdamWOptions(1e-4)), comm, so);
    for (auto& p : pb) p.mutable_grad() = at::randn_like(p) * 1e-3;
    bucketed_ms.push_back({mib, time([&] { sb.step(); })});
  }

  // The parts alone, over the same bytes.
  const int64_t total = count * numel, chunk = (total + n - 1) / n;
  at::Tensor flat = at::randn({chunk * n}, at::TensorOptions().device(dev)), shard = at::empty({chunk}, flat.options());
  const double rs_ms = time([&] { comm->reduce_scatter(flat, shard, ld::ReduceOp::Avg); });
  const double ag_ms = time([&] { comm->all_gather(flat.narrow(0, rank * chunk, chunk), flat); });
  const double ar_ms = time([&] { comm->all_reduce(flat, ld::ReduceOp::Sum); });
  // The exchange a quantized reduce-scatter would make (issue 38's low-bit wire): the same
  // elements as float32 and as bytes (8-bit codes).
  at::Tensor exchanged = at::empty_like(flat);
  const double a2a_ms = time([&] { comm->all_to_all(flat, exchanged); });
  at::Tensor codes = at::zeros({chunk * n}, flat.options().dtype(at::kByte)), codes_in = at::empty_like(codes);
  const double a2a8_ms = time([&] { comm->all_to_all(codes, codes_in); });
  std::vector<at::Tensor> local;
  for (int64_t k = 0; k < count; ++k) local.push_back(at::randn({(numel + n - 1) / n}, at::TensorOptions().device(dev)).set_requires_grad(true));
  lowbit::optim::AdamW local_opt(local, lowbit::optim::AdamWOptions(1e-4));
  for (auto& p : local) p.mutable_grad() = at::randn_like(p) * 1e-3;
  const double update_ms = time([&] { local_opt.step(); });

  // Gradients from a backward(): d/dp sum(p * g) = g. Plain (step() reduces everything) against
  // overlap (the hooks reduce each bucket as backward() fills it; step() then updates and gathers).
  std::vector<at::Tensor> g;
  for (auto& p : params) g.push_back(at::randn_like(p) * 1e-3);
  const int64_t side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(numel))));
  if (matmul_rows > 0 && side * side != numel) {
    if (rank == 0) std::fprintf(stderr, "bench_sharded_step: --matmul needs NUMEL a square (%lld)\n", static_cast<long long>(numel));
    return 2;
  }
  at::Tensor mx, mg;  // --matmul: X and G, [rows, side]
  if (matmul_rows > 0) {
    at::globalContext().setAllowTF32CuBLAS(true);
    mx = at::randn({matmul_rows, side}, at::TensorOptions().device(dev));
    mg = at::randn({matmul_rows, side}, at::TensorOptions().device(dev)) * 1e-3;
  }
  // The forward is built before each timed part (untimed): what is timed is backward() (and the
  // step), the part whose gradients the overlap can reduce while it runs.
  at::Tensor loss;
  const auto forward = [&](const std::vector<at::Tensor>& ps) {
    loss = at::zeros({}, at::TensorOptions().device(dev));
    for (size_t k = 0; k < ps.size(); ++k)
      loss = loss + (matmul_rows > 0 ? (mx.mm(ps[k].view({side, side})) * mg).sum() : (ps[k] * g[k]).sum());
  };
  const auto backward = [&] {
    loss.backward();
    loss = at::Tensor();
  };
  const auto plain_forward = [&] {
    sharded.zero_grad();
    forward(params);
  };
  const int64_t plain_state = sharded.state_bytes();
  // Overlap at each bucket size, with the hooks' work on the optimizer's thread
  // (ShardedOptions::overlap_thread, the default on a GPU) and on backward()'s. Each configuration
  // steps parameters of its own (they become views of its buckets), all alive at once.
  struct Overlapped {
    int64_t mib;
    bool thread;
    std::vector<at::Tensor> params;
    std::unique_ptr<ld::ShardedOptimizer> opt;
    std::vector<double> ms, per_model, per_plain;  // per round
    double step_ms = 0;
  };
  std::vector<Overlapped> overlapped;
  for (int64_t mib : {bucket_mib, int64_t{64}, int64_t{128}, int64_t{256}}) {
    if (mib != bucket_mib && mib <= bucket_mib) continue;
    for (const bool thread : {false, true}) {
      Overlapped o{mib, thread, {}, nullptr, {}, {}, {}, 0};
      for (int64_t k = 0; k < count; ++k) o.params.push_back(at::randn({numel}, at::TensorOptions().device(dev)).set_requires_grad(true));
      ld::ShardedOptions ov;
      ov.overlap = true;
      ov.overlap_thread = thread;
      ov.bucket_bytes = mib << 20;
      o.opt = std::make_unique<ld::ShardedOptimizer>(
          std::make_shared<lowbit::optim::AdamW>(o.params, lowbit::optim::AdamWOptions(1e-4)), comm, ov);
      overlapped.push_back(std::move(o));
    }
  }
  // Rounds: each part and configuration once per round, in the same order, after a warm-up round.
  // A transport whose pace drifts during a job (NCCL's network transport does, by a third between
  // jobs) then moves them alike: the ratios are taken within each round (the model from that
  // round's parts), and their medians reported.
  std::vector<double> backward_r, plain_r, rs_r, ag_r, update_r;
  for (int r = -1; r < reps; ++r) {
    const double b = once(backward, plain_forward);
    const double p = once([&] {
      backward();
      sharded.step();
    }, plain_forward);
    const double rs = once([&] { comm->reduce_scatter(flat, shard, ld::ReduceOp::Avg); }, nothing);
    const double ag = once([&] { comm->all_gather(flat.narrow(0, rank * chunk, chunk), flat); }, nothing);
    const double up = once([&] { local_opt.step(); }, nothing);
    // The overlap's target (issue 38): backward + step <= 1.1 x (max(backward, reduce-scatter) +
    // update + all-gather), and never slower than without overlap.
    const double model = std::max(b, rs) + up + ag;
    for (Overlapped& o : overlapped) {
      const double t = once([&] {
        backward();
        o.opt->step();
      }, [&] {
        o.opt->zero_grad();
        forward(o.params);
      });
      if (r < 0) continue;
      o.ms.push_back(t);
      o.per_model.push_back(t / model);
      o.per_plain.push_back(t / p);
    }
    if (r < 0) continue;
    backward_r.push_back(b);
    plain_r.push_back(p);
    rs_r.push_back(rs);
    ag_r.push_back(ag);
    update_r.push_back(up);
  }
  for (Overlapped& o : overlapped) {
    std::vector<double> step_only;
    for (int r = 0; r < reps; ++r)
      step_only.push_back(once([&] { o.opt->step(); }, [&] {
        o.opt->zero_grad();
        forward(o.params);
        backward();
      }));
    o.step_ms = median(step_only);
  }
  struct Span {
    std::string what;
    int64_t numel;  // 0: a mark
    double start_ms, end_ms, host_start_ms, host_end_ms;
  };
  std::vector<Span> timeline;
  int64_t timeline_mib = 0;
#if LOWBIT_WITH_NCCL
  auto* nccl = dynamic_cast<ld::NcclCommunicator*>(comm.get());
  // Host-bound or GPU-bound: f() once as it runs (when it returns on the host, when the GPU reaches
  // its end) and once queued behind a 50 ms sleep kernel, so that the host has issued all of it
  // before the GPU starts: then its GPU time alone. Marks' GPU times, ms from the start.
  struct Probe {
    double host_ms, gpu_ms, gpu_only_ms;
  };
  const auto probe = [&](const std::function<void()>& before, const std::function<void()>& f,
                         const std::function<void()>& after) {
    Probe out{};
    for (int queued = 0; queued < 2; ++queued) {
      before();
      sync();
      comm->barrier();
      nccl->start_timeline();
      if (queued) at::cuda::sleep(100'000'000);  // ~50 ms at the H200's ~2 GHz
      nccl->mark("f");
      f();
      nccl->mark("f returned");
      after();
      double start = 0, end = 0, host = 0;
      for (const auto& e : nccl->timeline()) {
        if (e.numel != 0) continue;
        if (e.what == "f") start = e.start_ms;
        else if (e.what == "f returned") end = e.start_ms, host = e.host_start_ms;
      }
      if (queued) out.gpu_only_ms = end - start;
      else out.host_ms = host, out.gpu_ms = end - start;
    }
    return out;
  };
  std::vector<std::pair<std::string, Probe>> probes;
  if (nccl) {
    probes.push_back({"backward alone", probe(plain_forward, backward, [] {})});
    // Backward beside a reduce-scatter of all its gradients' bytes that it never waits for: no
    // hooks, no copies, no events between them: what sharing the GPU with the collective costs
    // backward's kernels by themselves (SMs, memory, power), against "backward alone".
    const at::Tensor rs_input = reduces_on_copy_engines ? comm->gather_buffer(chunk * n, flat.options()).copy_(flat) : flat;
    probes.push_back({"backward beside a reduce-scatter", probe(plain_forward, [&] {
                        const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(dev.index());
                        const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, dev.index());
                        at::cuda::CUDAEvent go;
                        go.record(main);
                        go.block(side);
                        {
                          c10::cuda::CUDAStreamGuard on_side(side);
                          comm->reduce_scatter(rs_input, shard, ld::ReduceOp::Avg);
                        }
                        backward();
                      }, [&] { sync(); })});
    probes.push_back({"no overlap: backward + step", probe(plain_forward, [&] {
                        backward();
                        sharded.step();
                      }, [] {})});
    for (Overlapped& o : overlapped) {
      const std::string which = c10::str("overlap ", o.mib, " MiB", o.thread ? ", thread" : "");
      const auto own_forward = [&] {
        o.opt->zero_grad();
        forward(o.params);
      };
      probes.push_back({which + ": backward", probe(own_forward, backward, [&] { o.opt->step(); })});
      probes.push_back({which + ": backward + step", probe(own_forward, [&] {
                          backward();
                          o.opt->step();
                        }, [] {})});
      if (o.mib != bucket_mib || !o.thread) continue;
      own_forward();  // one more iteration, on the GPU's clock
      sync();
      comm->barrier();
      nccl->start_timeline();
      backward();
      nccl->mark("backward() returned");
      o.opt->step();
      nccl->mark("step() returned");
      for (const auto& e : nccl->timeline()) timeline.push_back({e.what, e.numel, e.start_ms, e.end_ms, e.host_start_ms, e.host_end_ms});
      timeline_mib = o.mib;
    }
  }
#endif

  const double bytes = 4.0 * chunk * n;
  const double ar_busbw = bytes / (ar_ms * 1e-3) * 2.0 * (n - 1) / n / 1e9;  // GB/s
  // reduce-scatter and all-gather each move (N-1)/N of the bytes per rank: at the all_reduce's bus
  // bandwidth each takes half of its time.
  const double rs_at_bw = n > 1 ? bytes * (n - 1) / n / (ar_busbw * 1e9) * 1e3 : 0.0;
  const double model_ms = 2 * rs_at_bw + update_ms;
  at::Tensor bytes_t = at::full({1}, static_cast<double>(plain_state), at::TensorOptions().dtype(at::kDouble).device(dev));
  comm->all_reduce(bytes_t);
  const double all_state = bytes_t.cpu()[0].item<double>();
  const auto print_probes = [&] {
#if LOWBIT_WITH_NCCL
    for (const auto& pr : probes)
      std::printf("    %-36s host %8.3f  gpu %8.3f  gpu only %8.3f ms\n", pr.first.c_str(), pr.second.host_ms,
                  pr.second.gpu_ms, pr.second.gpu_only_ms);
#endif
  };
  const auto print_timeline = [&] {
    if (!timeline.empty()) {
      // The GPU's view of one overlapped iteration: where the collectives ran against the marks.
      std::printf("  timeline (buckets of %lld MiB; ms from backward()'s call, on the GPU and on the host "
                  "(the call); rank %d):\n", static_cast<long long>(timeline_mib), rank);
      double busy[2] = {0, 0}, host[2] = {0, 0};
      for (const auto& e : timeline) {
        if (e.numel == 0) {
          std::printf("    gpu %8.3f             host %8.3f  %s\n", e.start_ms, e.host_start_ms, e.what.c_str());
          continue;
        }
        const bool gather = e.what.rfind("all_gather", 0) == 0;
        busy[gather] += e.end_ms - e.start_ms;
        host[gather] += e.host_end_ms - e.host_start_ms;
        std::printf("    gpu %8.3f .. %8.3f  host %8.3f .. %8.3f  %s of %lld\n", e.start_ms, e.end_ms, e.host_start_ms,
                    e.host_end_ms, e.what.c_str(), static_cast<long long>(e.numel));
      }
      std::printf("    collectives' GPU time: %.3f ms reduce-scatter / all-reduce, %.3f ms all-gather; their calls' "
                  "host time: %.3f / %.3f ms\n", busy[0], busy[1], host[0], host[1]);
    }
  };
  if (rank == 0) {
    std::printf("bench_sharded_step: %d rank(s) (%s), %lld params x %lld elements (fp32), AdamW Q8; backward of %s\n", n,
                collectives.c_str(), static_cast<long long>(count), static_cast<long long>(numel),
                matmul_rows > 0 ? c10::str("sum((X @ W) * G), X and G of ", matmul_rows, " rows (TF32)").c_str()
                                : "sum(p * g)");
    std::printf("  sharded step          %9.3f ms   (the default: buckets of %lld MiB)\n", step_ms,
                static_cast<long long>(ld::kDefaultStepBucketBytes >> 20));
    for (const auto& b : bucketed_ms)
      std::printf("  sharded step          %9.3f ms   (%s; step / model = %.2f)\n", b.second,
                  b.first >= (int64_t{1} << 20) ? "one bucket"
                                                : c10::str("buckets of ", b.first, " MiB").c_str(),
                  b.second / model_ms);
    std::printf("  reduce_scatter alone  %9.3f ms   busbw %7.2f GB/s\n", rs_ms,
                n > 1 ? bytes * (n - 1) / n / (rs_ms * 1e-3) / 1e9 : 0.0);
    std::printf("  local update (1/N)    %9.3f ms\n", update_ms);
    std::printf("  all_gather alone      %9.3f ms   busbw %7.2f GB/s\n", ag_ms,
                n > 1 ? bytes * (n - 1) / n / (ag_ms * 1e-3) / 1e9 : 0.0);
    std::printf("  all_reduce same bytes %9.3f ms   busbw %7.2f GB/s\n", ar_ms, ar_busbw);
    std::printf("  all_to_all same bytes %9.3f ms   busbw %7.2f GB/s\n", a2a_ms,
                n > 1 ? bytes * (n - 1) / n / (a2a_ms * 1e-3) / 1e9 : 0.0);
    std::printf("  all_to_all as bytes   %9.3f ms   busbw %7.2f GB/s   (the same elements as 8-bit codes: %.2fx faster)\n",
                a2a8_ms, n > 1 ? bytes / 4 * (n - 1) / n / (a2a8_ms * 1e-3) / 1e9 : 0.0, a2a_ms / a2a8_ms);
    std::printf("  model: rs + ag at that busbw + update = %.3f ms; step / model = %.2f (target <= 1.2)\n", model_ms,
                step_ms / model_ms);
    std::printf("  state bytes: rank 0 %.1f MB, all ranks %.1f MB (= unsharded), ratio %.3f (1/N = %.3f)\n",
                plain_state / 1e6, all_state / 1e6, plain_state / all_state, 1.0 / n);
    // The rounds' medians; each ratio the median of the rounds' own ratios, with their range.
    const auto spread = [](const std::vector<double>& v) {
      char text[64];
      std::snprintf(text, sizeof text, "%.2f [%.2f-%.2f]", median(v), *std::min_element(v.begin(), v.end()),
                    *std::max_element(v.begin(), v.end()));
      return std::string(text);
    };
    std::printf("  in %d rounds of every part and configuration below, medians:\n", reps);
    std::printf("  backward alone        %9.3f ms\n", median(backward_r));
    std::printf("  backward + step       %9.3f ms   (no overlap: step() reduces everything)\n", median(plain_r));
    for (const Overlapped& o : overlapped) {
      std::printf("  backward + step       %9.3f ms   (overlap: %d bucket(s) of %lld MiB reduced from the hooks%s; "
                  "/ model %s, target <= 1.1; / no overlap %s)\n",
                  median(o.ms), o.opt->buckets(), static_cast<long long>(o.mib), o.thread ? " on their thread" : "",
                  spread(o.per_model).c_str(), spread(o.per_plain).c_str());
      std::printf("    of which step()     %9.3f ms   (update + all-gather, bucket by bucket)\n", o.step_ms);
    }
    std::printf("  overlap model: max(backward %.3f, reduce_scatter %.3f) + update %.3f + all_gather %.3f ms (medians)\n",
                median(backward_r), median(rs_r), median(update_r), median(ag_r));
#if LOWBIT_WITH_NCCL
    if (!probes.empty())
      std::printf("  one iteration each (rank 0): host = when it returned, gpu = when the GPU got there, gpu only = "
                  "its GPU time queued behind a sleep\n");
    print_probes();
#endif
    print_timeline();
  }
  // LOWBIT_BENCH_EVERY_RANK=1: the other ranks' probes and timelines too, one rank after another (a
  // collective's wait for a late peer shows on the rank that waited).
  const char* every = std::getenv("LOWBIT_BENCH_EVERY_RANK");
  if (every && std::string(every) == "1")
    for (int r = 1; r < n; ++r) {
      comm->barrier();
      if (rank != r) continue;
      std::printf("  rank %d:\n", r);
      print_probes();
      print_timeline();
      std::fflush(stdout);
    }
  wire_section();
  return 0;
}
