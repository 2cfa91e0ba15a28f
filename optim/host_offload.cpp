// HostOffload (host_offload.h): the hooks copy gradients to the host, one host thread steps them and
// copies the weights back. Streams and events are c10's device-generic ones (CUDA or HIP alike).
#include "host_offload.h"

#include <ATen/Parallel.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/llvmMathExtras.h>
#include <omp.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "../tensors/optim_ops.h"
#include "grad_hooks.h"

namespace lowbit {
namespace optim {

namespace {

struct OffloadedParam {
  at::Tensor device;  // the model's parameter
  at::Tensor host;    // its copy, a parameter of the optimizer
  int64_t version = 0;  // the device parameter's version when host and device last agreed
  bool released = false;  // its gradient went to the host since the last step()
  std::string name;
};

// The two copy streams of one accelerator: gradients (and pulled weights) to the host, weights back.
struct CopyStreams {
  at::Device device;
  c10::Stream to_host, to_device;
};

struct Task {
  size_t param = 0;
  size_t staging = 0;
  at::Tensor device_grad;           // kept alive until its copy is done
  at::Tensor device_found;          // its non-finite flag (grad_check's), likewise
  std::optional<c10::Event> copied;  // on the to-host stream; none for parameters on the CPU
};

int64_t version_of(const at::Tensor& t) { return static_cast<int64_t>(t._version()); }

// Host memory for the weights' copies and the staging buffers, carved out of large slabs: the pinned
// allocator rounds every allocation up to a power of two, which for tensors one by one would cost up
// to half the host memory again (a 96 MiB tensor takes 128).
class HostArena {
 public:
  // `total`: the bytes it will be asked for; a small total gets one slab of its own size.
  HostArena(bool pinned, int64_t total)
      : slab_(std::min<int64_t>(int64_t(1) << 30, static_cast<int64_t>(c10::llvm::PowerOf2Ceil(
                                                     static_cast<uint64_t>(std::max<int64_t>(total, kAlign)))))),
        pinned_(pinned) {}
  at::Tensor take(at::IntArrayRef sizes, at::ScalarType dtype) {
    const int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(c10::elementSize(dtype));
    const int64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    if (slabs_.empty() || used_ + need > slabs_.back().numel()) {
      slabs_.push_back(at::empty({std::max(slab_, need)}, at::TensorOptions().dtype(at::kByte).pinned_memory(pinned_)));
      used_ = 0;
    }
    at::Tensor t = slabs_.back().narrow(0, used_, bytes).view(dtype).view(sizes);
    used_ += need;
    return t;
  }
  int64_t bytes() const {
    int64_t n = 0;
    for (const at::Tensor& s : slabs_) n += s.numel();
    return n;
  }

 private:
  static constexpr int64_t kAlign = 64;
  int64_t slab_;
  bool pinned_;
  std::vector<at::Tensor> slabs_;
  int64_t used_ = 0;
};

// More CPU-step threads than any host has cores (the count goes to OpenMP as an int).
constexpr int64_t kMaxHostThreads = 1 << 16;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

struct HostOffload::Shared {
  LowbitOptimizer* opt = nullptr;
  std::vector<OffloadedParam> params;
  std::unordered_map<c10::TensorImpl*, size_t> index;  // device parameter -> params[]
  std::vector<CopyStreams> streams;
  std::unique_ptr<HostArena> arena;  // holds the host copies and the staging buffers
  std::vector<at::Tensor> staging;  // bytes, each as large as the largest gradient
  std::vector<at::Tensor> found;    // float [1] each: the non-finite flag of the gradient in staging[s]
  std::vector<size_t> free_staging;
  // stage_weights: staging_weights[s] (bytes, as large as the largest parameter) takes the weights
  // with the gradient in staging[s]; returned[s] marks their copy back to the device, which the
  // next copy into that buffer waits for.
  bool stage_weights = false;
  std::vector<at::Tensor> staging_weights;
  std::vector<std::optional<c10::Event>> returned;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Task> queue;
  int64_t pending = 0;  // tasks queued or being run
  int64_t in_flight = 0, peak_in_flight = 0;
  int64_t released = 0;
  bool accumulating = false;
  bool stop = false;
  std::exception_ptr error;
  HostOffloadStats stats;  // under mu
  std::thread worker;

  const CopyStreams& streams_of(const at::Device& d) const {
    for (const auto& s : streams)
      if (s.device == d) return s;
    TORCH_INTERNAL_ASSERT(false, "HostOffload: no copy streams for ", d);
  }

  at::Tensor staging_view(size_t s, const at::Tensor& like) const { return view_as(staging[s], like); }
  static at::Tensor view_as(const at::Tensor& bytes, const at::Tensor& like) {
    const int64_t n = like.numel() * static_cast<int64_t>(like.element_size());
    return bytes.narrow(0, 0, n).view(like.scalar_type()).view(like.sizes());
  }
  // stage_weights: the host parameter of params[k] now lies in staging_weights[s] (the same tensor,
  // so the optimizer's state stays its own).
  void point_host_at(OffloadedParam& p, size_t s) {
    const at::Tensor& w = staging_weights[s];
    const int64_t elem = static_cast<int64_t>(p.host.element_size());
    TORCH_INTERNAL_ASSERT(w.storage_offset() % elem == 0);
    p.host.set_(w.storage(), w.storage_offset() / elem, p.device.sizes());
  }

  // The hook: the gradient of params[k] is final.
  void release(size_t k, const at::Tensor& param);
  void run();  // the host thread
  void wait_idle(std::unique_lock<std::mutex>& lock) { cv.wait(lock, [&] { return pending == 0; }); }
};

void HostOffload::Shared::release(size_t k, const at::Tensor& param) {
  if (accumulating || !param.grad().defined()) return;
  OffloadedParam& p = params[k];
  TORCH_CHECK(!opt->clips_gradients(), "HostOffload: a param group has max_grad_norm > 0 (set after the offload "
              "was made); global-norm clipping needs every gradient at once. Set max_grad_norm to 0");
  TORCH_CHECK(!p.released, "HostOffload: ", p.name, " got a second gradient before step(); call step() after "
              "each backward() (or set_accumulating(true) for the micro-batches before the last)");
  const at::Tensor grad = param.grad();
  TORCH_CHECK(grad.scalar_type() == p.host.scalar_type() && grad.sizes() == p.host.sizes(), "HostOffload: the gradient "
              "of ", p.name, " has dtype ", grad.scalar_type(), " and shape ", grad.sizes(), "; its parameter has ",
              p.host.scalar_type(), " and ", p.host.sizes());
  // With stage_weights the weights go with every gradient; else only when changed on the device.
  const bool weights_changed = !stage_weights && version_of(p.device) != p.version;
  size_t s;
  {
    const Clock::time_point t0 = Clock::now();
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !free_staging.empty(); });
    s = free_staging.back();
    free_staging.pop_back();
    stats.stall_s += seconds_since(t0);
    stats.bytes_to_host += bytes_of(grad) + (weights_changed || stage_weights ? bytes_of(p.host) : 0);
  }
  const at::Tensor to = staging_view(s, grad);
  const at::Tensor weights_to = stage_weights ? view_as(staging_weights[s], p.host) : at::Tensor();
  Task task;
  task.param = k;
  task.staging = s;
  torch::NoGradGuard no_grad;
  // The non-finite check, here on the gradient's device (at its bandwidth, on the stream that computed
  // it) rather than as one more read of the staged gradient by the host's step, its bottleneck.
  const at::Tensor found_inf = std::get<0>(ops::grad_check({grad}, {0}, 1, false));
  if (p.device.is_cpu()) {
    if (weights_changed) p.host.copy_(p.device.detach());
    if (stage_weights) weights_to.copy_(p.device.detach());
    to.copy_(grad);
    found[s].copy_(found_inf);
  } else {
    const CopyStreams& cs = streams_of(p.device.device());
    c10::impl::VirtualGuardImpl impl(p.device.device().type());
    c10::Event ready(p.device.device().type());
    ready.record(impl.getStream(p.device.device()));  // the gradient is computed on the current stream
    ready.block(cs.to_host);
    if (returned[s]) returned[s]->block(cs.to_host);  // the buffer's last weights are back on their device
    {
      c10::StreamGuard on_copy_stream(cs.to_host);
      if (weights_changed) p.host.copy_(p.device.detach(), /*non_blocking=*/true);
      if (stage_weights) weights_to.copy_(p.device.detach(), /*non_blocking=*/true);
      to.copy_(grad, /*non_blocking=*/true);
      found[s].copy_(found_inf, /*non_blocking=*/true);
    }
    task.copied.emplace(p.device.device().type());
    task.copied->record(cs.to_host);
    task.device_grad = grad;
    task.device_found = found_inf;
  }
  if (weights_changed) p.version = version_of(p.device);
  p.released = true;
  param.mutable_grad().reset();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (task.device_grad.defined()) peak_in_flight = std::max(peak_in_flight, ++in_flight);
    queue.push_back(std::move(task));
    ++pending;
  }
  cv.notify_all();
}

void HostOffload::Shared::run() {
  torch::NoGradGuard no_grad;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;
      task = std::move(queue.front());
      queue.pop_front();
    }
    OffloadedParam& p = params[task.param];
    const bool on_device = task.device_grad.defined();
    bool counted = false;
    // Whether the host parameter holds this step's weights (with stage_weights, once it points at
    // the staging buffer they were copied to): only then do they go back.
    bool weights_here = !stage_weights;
    try {
      const Clock::time_point t0 = Clock::now();
      if (task.copied) task.copied->synchronize();
      bool step;
      {
        std::lock_guard<std::mutex> lock(mu);
        stats.copy_wait_s += seconds_since(t0);
        if (on_device) --in_flight;
        counted = true;
        step = !error;
      }
      task.device_grad.reset();
      task.device_found.reset();
      if (stage_weights) {
        point_host_at(p, task.staging);
        weights_here = true;
      }
      if (step) {
        const Clock::time_point t1 = Clock::now();
        p.host.mutable_grad() = staging_view(task.staging, p.host);
        opt->step_parameters({p.host}, found[task.staging]);
        std::lock_guard<std::mutex> lock(mu);
        stats.host_step_s += seconds_since(t1);
        ++stats.host_steps;
        stats.host_threads = omp_get_max_threads();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      if (on_device && !counted) --in_flight;
    }
    task.device_grad.reset();
    task.device_found.reset();
    p.host.mutable_grad().reset();
    const auto free_buffer = [&] {
      {
        std::lock_guard<std::mutex> lock(mu);
        free_staging.push_back(task.staging);
      }
      cv.notify_all();
    };
    // A host copy of the weights of their own: the buffer is free as soon as the step has read it.
    if (!stage_weights) free_buffer();
    try {
      // The weights back (unchanged ones too: a skipped or refused step leaves them as they were).
      if (weights_here) {
        if (p.device.is_cpu()) {
          p.device.detach().copy_(p.host);
        } else {
          const CopyStreams& cs = streams_of(p.device.device());
          c10::StreamGuard on_copy_stream(cs.to_device);
          p.device.detach().copy_(p.host, /*non_blocking=*/true);
          if (stage_weights) {
            returned[task.staging].emplace(p.device.device().type());
            returned[task.staging]->record(cs.to_device);
          }
        }
        std::lock_guard<std::mutex> lock(mu);
        stats.bytes_to_device += bytes_of(p.host);
      }
      p.version = version_of(p.device);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
    // Staged weights: free once their copy back is enqueued (the next copy into it waits for it).
    if (stage_weights) free_buffer();
    {
      std::lock_guard<std::mutex> lock(mu);
      ++released;
      --pending;
    }
    cv.notify_all();
  }
}

HostOffload::HostOffload(LowbitOptimizer& opt, HostOffloadOptions options) : shared_(std::make_shared<Shared>()) {
  Shared& sh = *shared_;
  sh.opt = &opt;
  TORCH_CHECK(options.staging_buffers() >= 1, "HostOffload: staging_buffers must be at least 1, got ",
              options.staging_buffers());
  TORCH_CHECK(options.host_threads() >= 0 && options.host_threads() <= kMaxHostThreads,
              "HostOffload: host_threads must be in [0, ", kMaxHostThreads, "] (0: the default count), got ",
              options.host_threads());
  TORCH_CHECK(!opt.clips_gradients(), "HostOffload: a param group has max_grad_norm > 0; global-norm clipping needs "
              "every gradient at once, which the offload copies to the host as it goes. Set max_grad_norm to 0");
  int64_t largest = 0, total = 0;
  bool pinned = false;
  for (size_t gi = 0; gi < opt.param_groups().size(); ++gi) {
    const auto& ps = opt.param_groups()[gi].params();
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string name = c10::str("parameter ", i, " of group ", gi, " (shape ", ps[i].sizes(), ")");
      TORCH_CHECK(opt.state_of(ps[i]) == nullptr, "HostOffload: ", name, " holds optimizer state already; make the "
                  "offload before the first step or load");
      TORCH_CHECK(ps[i].layout() == at::kStrided, "HostOffload: ", name, " is not a dense tensor");
      OffloadedParam p;
      p.device = ps[i];
      p.name = name;
      sh.params.push_back(std::move(p));
      pinned |= !ps[i].is_cpu();
      largest = std::max(largest, bytes_of(ps[i]));
      total += bytes_of(ps[i]) + 64;
    }
  }
  sh.stage_weights = options.stage_weights();
  const int64_t per_buffer = (sh.stage_weights ? 2 : 1) * (largest + 128);
  sh.arena = std::make_unique<HostArena>(pinned, (sh.stage_weights ? 0 : total) + options.staging_buffers() * per_buffer);
  for (int64_t s = 0; s < options.staging_buffers(); ++s) {
    sh.staging.push_back(sh.arena->take({largest}, at::kByte));
    sh.found.push_back(sh.arena->take({1}, at::kFloat));
    if (sh.stage_weights) sh.staging_weights.push_back(sh.arena->take({largest}, at::kByte));
    sh.returned.emplace_back();
    sh.free_staging.push_back(static_cast<size_t>(s));
  }
  for (OffloadedParam& p : sh.params) {
    const at::Device d = p.device.device();
    if (sh.stage_weights) {
      // A tensor of its own (the optimizer keys its state by it), pointed at a staging buffer for
      // each step; its elements are never read before the weights are copied there.
      p.host = at::empty({0}, at::TensorOptions().dtype(p.device.scalar_type()));
      sh.point_host_at(p, 0);
    } else {
      p.host = sh.arena->take(p.device.sizes(), p.device.scalar_type());
      p.host.copy_(p.device.detach());
    }
    p.host.set_requires_grad(true);
    p.version = version_of(p.device);
    if (!d.is_cpu() && std::none_of(sh.streams.begin(), sh.streams.end(), [&](const CopyStreams& s) { return s.device == d; })) {
      c10::impl::VirtualGuardImpl impl(d.type());
      sh.streams.push_back({d, impl.getStreamFromGlobalPool(d), impl.getStreamFromGlobalPool(d)});
    }
  }
  std::vector<at::Tensor> devices;
  for (size_t k = 0; k < sh.params.size(); ++k) {
    sh.index[sh.params[k].device.unsafeGetTensorImpl()] = k;
    devices.push_back(sh.params[k].device);
  }
  hooks_ = std::make_unique<GradHooks>("HostOffload", std::move(devices),
                                       [&sh](size_t k) { return sh.params[k].name; },
                                       [shared = shared_](size_t k, const at::Tensor& param) { shared->release(k, param); });
  // Only once every check passed: the optimizer's groups now hold the host copies.
  for (const OffloadedParam& p : sh.params) opt.replace_parameter(p.device, p.host);
  // OpenMP's thread count is per thread: the host thread sets its own (a new one would start from the
  // process default), and only its own. at::set_num_threads would also set what the whole process
  // sees: ATen's count, which threads started later take, and MKL's dynamic choice of threads, which
  // decides how the model's matrix products split their work (and so their rounding on Intel). Set
  // from this thread whenever it comes to run, it would change the bits of products that the
  // caller's thread computes meanwhile.
  const int threads = options.host_threads() > 0 ? static_cast<int>(options.host_threads()) : at::get_num_threads();
  sh.worker = std::thread([shared = shared_, threads] {
    // ATen's start-up of a thread's OpenMP count first (once per thread, at its first parallel op:
    // it applies ATen's process-wide count where one was set), so that it cannot undo ours later.
    at::get_num_threads();
    omp_set_num_threads(threads);
    shared->run();
  });
}

HostOffload::~HostOffload() {
  hooks_.reset();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stop = true;
  }
  shared_->cv.notify_all();
  if (shared_->worker.joinable()) shared_->worker.join();
}

void HostOffload::step() {
  Shared& sh = *shared_;
  std::exception_ptr error;
  {
    const Clock::time_point t0 = Clock::now();
    std::unique_lock<std::mutex> lock(sh.mu);
    sh.wait_idle(lock);
    std::swap(error, sh.error);
    sh.stats.step_wait_s += seconds_since(t0);
    ++sh.stats.steps;
  }
  for (const CopyStreams& cs : sh.streams) {
    c10::impl::VirtualGuardImpl impl(cs.device.type());
    c10::Event back(cs.device.type());
    back.record(cs.to_device);
    back.block(impl.getStream(cs.device));
  }
  for (OffloadedParam& p : sh.params) p.released = false;
  if (error) std::rethrow_exception(error);
}

void HostOffload::set_accumulating(bool on) { shared_->accumulating = on; }
bool HostOffload::accumulating() const { return shared_->accumulating; }

int64_t HostOffload::released() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->released;
}

const at::Tensor& HostOffload::host_param(const at::Tensor& device_param) const {
  auto it = shared_->index.find(device_param.unsafeGetTensorImpl());
  TORCH_CHECK(it != shared_->index.end(), "HostOffload: host_param: the tensor is not a parameter of the offload");
  return shared_->params[it->second].host;
}

void HostOffload::pull_weights() {
  Shared& sh = *shared_;
  {
    std::unique_lock<std::mutex> lock(sh.mu);
    sh.wait_idle(lock);
  }
  if (sh.stage_weights) return;  // every step takes the device's weights
  torch::NoGradGuard no_grad;
  for (OffloadedParam& p : sh.params) {
    p.host.copy_(p.device.detach());  // blocking: the device's current stream has written them
    p.version = version_of(p.device);
  }
}

int64_t HostOffload::host_bytes() const { return shared_->arena->bytes(); }

int64_t HostOffload::peak_gradients_in_flight() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->peak_in_flight;
}

HostOffloadStats HostOffload::stats() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->stats;
}

void HostOffload::reset_stats() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->stats = HostOffloadStats();
}

}  // namespace optim
}  // namespace lowbit
