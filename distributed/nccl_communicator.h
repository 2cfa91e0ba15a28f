// NcclCommunicator: the Communicator for CUDA tensors over NCCL (RCCL under ROCm), bootstrapped by
// MPI (ncclGetUniqueId on rank 0, MPI_Bcast to the others). Collectives run on the communicator's
// own stream, ordered after the caller's current stream by an event and before the caller's later
// work by another. Each call waits for its collective, polling NCCL's asynchronous error state
// against a timeout, so a dead or hung peer aborts the NCCL communicator (ncclCommAbort) and ends
// the job with an error naming the collective and the rank; never a hang.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "communicator.h"
#include "mpi_communicator.h"

namespace lowbit {
namespace distributed {

struct NcclOptions {
  double timeout_s = 300.0;      // per collective, and for the communicator's setup
  bool abort_on_failure = true;  // as MpiOptions: MPI_Abort the job after ncclCommAbort; false: throw
};

class NcclCommunicator : public Communicator {
 public:
  // device: this rank's CUDA device index. bootstrap: the MPI communicator of the same ranks.
  NcclCommunicator(std::shared_ptr<MpiCommunicator> bootstrap, int device, NcclOptions options = {});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const char* backend() const override { return "nccl"; }
  int device() const { return device_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root = 0) override;
  void barrier() override;

 private:
  struct Impl;  // NCCL and CUDA handles: no nccl.h in this header
  // Runs launch(stream) (returns an ncclResult_t) on the own stream after the caller's work, waits
  // for it against the timeout, and orders the caller's stream after it.
  void run(const char* collective, int64_t numel, const std::vector<at::Tensor>& tensors,
           const std::function<int(void* stream)>& launch);
  [[noreturn]] void fail(const std::string& message);
  void check_usable(const char* collective) const;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<MpiCommunicator> bootstrap_;
  int device_ = 0;
  NcclOptions options_;
};

}  // namespace distributed
}  // namespace lowbit
