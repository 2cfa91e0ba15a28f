// ProcessGroupCommunicator: the collectives through a c10d Backend, each Work waited for against a
// timeout. Reductions follow MpiCommunicator exactly (which dtypes are summed natively, the float32
// detour for the others, Avg as one div_ after the sum), so both give the same bits where the sum's
// order does not matter.
#include "process_group_communicator.h"

#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

namespace lowbit {
namespace distributed {

namespace {

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& err) {
    return err.what_without_backtrace();
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// A peer that leaves mid-collective closes its sockets; Gloo's next write to one raises SIGPIPE, whose
// default action ends this process before the failed Work can be reported (seen under load in the
// peers_gone test: rank 0 "exited on signal 13"). Ignored, the write fails with EPIPE and the Work with
// it, which run() turns into an error naming the collective and the rank. A handler the program
// installed itself is left alone (Python ignores SIGPIPE at startup, so torch.distributed behaves so).
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, nullptr);
}

}  // namespace

ProcessGroupCommunicator::ProcessGroupCommunicator(c10::intrusive_ptr<c10d::Backend> backend,
                                                   ProcessGroupOptions options)
    : backend_(std::move(backend)), options_(options) {
  TORCH_CHECK(backend_, "ProcessGroupCommunicator: the c10d backend is null");
  set_timeout(options.timeout_s);
  rank_ = backend_->getRank();
  size_ = backend_->getSize();
  name_ = backend_->getBackendName();
  who_ = "ProcessGroupCommunicator(" + name_ + ")";
  TORCH_CHECK(size_ >= 1 && rank_ >= 0 && rank_ < size_, who_, ": the backend reports rank ", rank_, " of size ",
              size_);
  ignore_sigpipe_unless_handled();
}

ProcessGroupCommunicator::ProcessGroupCommunicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                                   c10::DeviceType device_type, ProcessGroupOptions options)
    : ProcessGroupCommunicator(
          [&] {
            TORCH_CHECK(group, "ProcessGroupCommunicator: the process group is null");
            TORCH_CHECK(group->hasBackends(), "ProcessGroupCommunicator: the process group has no backend");
            return group->getBackend(device_type);
          }(),
          options) {}

void ProcessGroupCommunicator::set_timeout(double seconds) {
  TORCH_CHECK(std::isfinite(seconds) && seconds > 0, who_.empty() ? "ProcessGroupCommunicator" : who_.c_str(),
              ": the timeout must be > 0 seconds, got ", seconds);
  options_.timeout_s = seconds;
}

std::chrono::milliseconds ProcessGroupCommunicator::timeout_ms() const {
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(options_.timeout_s * 1000)));
}

void ProcessGroupCommunicator::fail(const std::string& message) {
  broken_ = message;
  if (options_.abort_on_failure) {
    std::fprintf(stderr, "lowbit: %s; aborting this process\n", message.c_str());
    std::fflush(stderr);
    try {
      backend_->abort();
    } catch (...) {
    }
    std::abort();
  }
  TORCH_CHECK(false, message);
}

void ProcessGroupCommunicator::check_usable(const char* collective) const {
  TORCH_CHECK(broken_.empty(), who_, ": ", collective, " on a communicator that failed before: ", broken_);
}

void ProcessGroupCommunicator::run(const char* collective, int64_t numel,
                                   const std::function<c10::intrusive_ptr<c10d::Work>()>& start) {
  c10::intrusive_ptr<c10d::Work> work;
  std::exception_ptr error;
  bool finished = false;
  try {
    work = start();
    TORCH_CHECK(work, "the backend returned no Work");
    // Work::wait(timeout) throws when the collective failed (the backend's own error, a peer gone)
    // or when it has not finished within the timeout. The backend keeps its own per-collective
    // timeout (the caller configured the group; NCCL's watchdog, Gloo's transport): ours bounds the
    // wait whatever it is, and a collective still in flight after ours is the backend's to end.
    finished = work->wait(timeout_ms());
  } catch (...) {
    error = std::current_exception();
  }
  if (error) {
    const bool done = work && work->isCompleted();
    if (work && !done) {
      fail(c10::str(who_, ": ", collective, " of ", numel, " elements did not finish within ", options_.timeout_s,
                    " s on rank ", rank_, " of ", size_, " (a peer rank died, hangs, or skipped the collective): ",
                    what_of(error)));
    }
    fail(c10::str(who_, ": ", collective, " of ", numel, " elements failed on rank ", rank_, " of ", size_, ": ",
                  what_of(error)));
  }
  if (!finished)
    fail(c10::str(who_, ": ", collective, " of ", numel, " elements was aborted on rank ", rank_, " of ", size_));
}

void ProcessGroupCommunicator::all_reduce(at::Tensor& tensor, ReduceOp op) {
  const char* name = "all_reduce";
  check_usable(name);
  check_collective_tensor(who_.c_str(), name, "tensor", tensor);
  TORCH_CHECK(op == ReduceOp::Sum || at::isFloatingType(tensor.scalar_type()), who_, ": ", name,
              ": Avg needs a floating-point tensor, got dtype ", tensor.scalar_type());
  at::Tensor buf = host_sums_natively(tensor.scalar_type()) ? tensor : tensor.to(at::kFloat);
  std::vector<at::Tensor> tensors{buf};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  run(name, buf.numel(), [&] { return backend_->allreduce(tensors, o); });
  if (op == ReduceOp::Avg) buf.div_(size_);
  if (!buf.is_same(tensor)) tensor.copy_(buf);
}

void ProcessGroupCommunicator::reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) {
  const char* name = "reduce_scatter";
  check_usable(name);
  check_chunked_collective(who_.c_str(), name, input, output, size_, /*input_is_whole=*/true);
  TORCH_CHECK(op == ReduceOp::Sum || at::isFloatingType(input.scalar_type()), who_, ": ", name,
              ": Avg needs a floating-point tensor, got dtype ", input.scalar_type());
  const bool native = host_sums_natively(input.scalar_type());
  at::Tensor in = native ? input.view({-1}) : input.reshape({-1}).to(at::kFloat);
  at::Tensor out = native ? output.view({-1}) : at::empty({output.numel()}, input.options().dtype(at::kFloat));
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  run(name, in.numel(), [&] { return backend_->_reduce_scatter_base(out, in, o); });
  if (op == ReduceOp::Avg) out.div_(size_);
  if (!native) output.copy_(out.view(output.sizes()));
}

void ProcessGroupCommunicator::all_gather(const at::Tensor& input, at::Tensor& output) {
  const char* name = "all_gather";
  check_usable(name);
  check_chunked_collective(who_.c_str(), name, input, output, size_, /*input_is_whole=*/false);
  // In place (input is output's chunk rank()): c10d backends accept the aliasing input as is.
  at::Tensor in = input.view({-1}), out = output.view({-1});
  c10d::AllgatherOptions o;
  run(name, out.numel(), [&] { return backend_->_allgather_base(out, in, o); });
}

void ProcessGroupCommunicator::all_to_all(const at::Tensor& input, at::Tensor& output) {
  const char* name = "all_to_all";
  check_usable(name);
  check_all_to_all(who_.c_str(), input, output, size_);
  at::Tensor in = input.view({-1}), out = output.view({-1});
  std::vector<int64_t> equal_splits;  // empty: size() equal chunks
  c10d::AllToAllOptions o;
  run(name, in.numel(), [&] { return backend_->alltoall_base(out, in, equal_splits, equal_splits, o); });
}

void ProcessGroupCommunicator::broadcast(at::Tensor& tensor, int root) {
  const char* name = "broadcast";
  check_usable(name);
  check_collective_tensor(who_.c_str(), name, "tensor", tensor);
  TORCH_CHECK(root >= 0 && root < size_, who_, ": ", name, ": root must be in [0, ", size_, "), got ", root);
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.rootTensor = 0;
  run(name, tensor.numel(), [&] { return backend_->broadcast(tensors, o); });
}

void ProcessGroupCommunicator::barrier() {
  const char* name = "barrier";
  check_usable(name);
  c10d::BarrierOptions o;
  run(name, 0, [&] { return backend_->barrier(o); });
}

}  // namespace distributed
}  // namespace lowbit
