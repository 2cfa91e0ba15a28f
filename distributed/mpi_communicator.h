// MpiCommunicator: the Communicator for CPU tensors over MPI (Debian's Open MPI in CI). Every
// collective is non-blocking and polled against a timeout, and MPI errors are returned to us
// (MPI_ERRORS_RETURN), so a dead or hung peer becomes an error naming the collective and the rank.
#pragma once

#include <mpi.h>

#include "communicator.h"

namespace lowbit {
namespace distributed {

struct MpiOptions {
  // Seconds a collective may take before it is declared failed (a peer died or hangs).
  double timeout_s = 300.0;
  // On a failure: print the error and MPI_Abort the job, which ends every rank, the hung one too
  // (default); false: throw c10::Error on this rank only and mark the communicator unusable.
  bool abort_on_failure = true;
};

class MpiCommunicator : public Communicator {
 public:
  // comm is duplicated (the caller's communicator keeps its error handler); MPI must be initialized
  // (init_mpi() or the caller's MPI_Init).
  explicit MpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD, MpiOptions options = {});
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }
  MPI_Comm comm() const { return comm_; }
  const MpiOptions& options() const { return options_; }
  void set_timeout(double seconds);

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op = ReduceOp::Sum) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void all_to_all(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root = 0) override;
  void barrier() override;

  // Waits for `request` as every collective here does (polling against the timeout); public so that
  // other MPI users in lowbit (NCCL's bootstrap) fail the same way.
  void wait(MPI_Request& request, const char* collective, int64_t numel);

 private:
  void check_rc(int rc, const char* collective);
  [[noreturn]] void fail(const std::string& message);
  void check_usable(const char* collective) const;

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MpiOptions options_;
  std::string broken_;  // why this communicator can no longer be used (after a thrown failure)
};

// Initializes MPI unless the program already did; lowbit then finalizes it at exit. It asks for
// MPI_THREAD_MULTIPLE, so that NcclCommunicator's watchdog thread may MPI_Abort a failed job, and
// goes on with whatever level MPI provides (the watchdog then ends its own process instead).
void init_mpi();

}  // namespace distributed
}  // namespace lowbit
