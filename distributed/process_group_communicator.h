// ProcessGroupCommunicator: the Communicator over a libtorch c10d backend that the caller already has
// (ProcessGroupNCCL, ProcessGroupGloo, ... from torch.distributed or built in C++), so a job that set up
// torch.distributed hands its group to the ShardedOptimizer instead of starting MPI. Collectives have
// the semantics of the other communicators (Avg = one division after the sum, bfloat16 / float16
// summed in float32): on the same inputs they give MpiCommunicator's bits wherever the sum is
// order-independent. Each call waits for its c10d Work against a timeout, so a dead or hung peer is an
// error naming the collective and the rank, never a hang. A peer that leaves is an error too, never a
// SIGPIPE death: constructing one sets SIGPIPE to ignored where the program left it at its default.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <functional>
#include <string>

#include "communicator.h"

namespace lowbit {
namespace distributed {

struct ProcessGroupOptions {
  // Seconds a collective may take before it is declared failed (the wait for its Work). The backend's
  // own timeout (set when the group was made) still applies to the collective itself.
  double timeout_s = 300.0;
  // On a failure: false (default, torch.distributed's convention): throw c10::Error on this rank and
  // mark the communicator unusable; the peers' next collectives then fail or time out too. true: print
  // the error, abort the backend (Backend::abort) and std::abort() this process, which ends the job
  // under mpirun / torchrun.
  bool abort_on_failure = false;
};

class ProcessGroupCommunicator : public Communicator {
 public:
  // backend: e.g. pg->getBackend(c10::DeviceType::CUDA) of torch.distributed's group. It must carry
  // the device of the tensors passed in (Gloo: CPU; NCCL: CUDA).
  explicit ProcessGroupCommunicator(c10::intrusive_ptr<c10d::Backend> backend, ProcessGroupOptions options = {});
  // The process group's backend for `device_type`.
  ProcessGroupCommunicator(const c10::intrusive_ptr<c10d::ProcessGroup>& group, c10::DeviceType device_type,
                           ProcessGroupOptions options = {});

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return name_.c_str(); }  // "gloo", "nccl", ... as c10d names it
  const c10::intrusive_ptr<c10d::Backend>& c10d_backend() const { return backend_; }
  const ProcessGroupOptions& options() const { return options_; }
  void set_timeout(double seconds);

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void all_to_all(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root = 0) override;
  void barrier() override;

 private:
  // Starts the collective (start() returns its Work) and waits for it against the timeout; a thrown
  // start, a failed Work or a timeout becomes fail() naming the collective and the rank.
  void run(const char* collective, int64_t numel, const std::function<c10::intrusive_ptr<c10d::Work>()>& start);
  [[noreturn]] void fail(const std::string& message);
  void check_usable(const char* collective) const;
  std::chrono::milliseconds timeout_ms() const;

  c10::intrusive_ptr<c10d::Backend> backend_;
  ProcessGroupOptions options_;
  int rank_ = 0, size_ = 1;
  std::string name_;     // the backend's name, for backend()
  std::string who_;      // "ProcessGroupCommunicator(gloo)", for errors
  std::string broken_;   // why this communicator can no longer be used (after a failure)
};

}  // namespace distributed
}  // namespace lowbit
